"""The one registry every kind of component uses: methods, architectures, datasets, analyzers and
their resamplers, ensemble adapters, foreign readers, report and table formats, loggers.

    READERS = Registry("predictions reader")
    @READERS.register("NumPy arrays", recognises=lambda paths: True)
    def read(request): ...
    READERS.recognise(paths)      # the first entry, in order, whose test accepts the object

A `Registry` is a dict (name -> entry) that refuses a second entry under a name, keeps its entries in
the order registered, or by an `order` given with each, and, where a registry picks its entry by
looking at an object, tries their `recognises` tests in that order. `import_all` imports every module
of a package, so that a component is added by adding a module and nothing keeps a list.
"""

import importlib
import pkgutil
from functools import cache

from .errors import EnsdiagError, unknown


class Registry(dict):
    """name -> entry, in order (a dict: `REGISTRY[name]`, `list(REGISTRY)`, `REGISTRY.items()`)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind  # what an entry is, in errors: "method", "dataset", …
        self.orders: dict = {}
        self.recognisers: dict = {}

    def add(self, name: str, entry, order=None, recognises=None):
        """Register `entry` as `name` (refused if the name is taken); `order`: its place among the
        others (smallest first; without one, after those registered before it); `recognises(thing)`:
        whether the entry is the one for `thing` (`recognise`)."""
        if name in self:
            raise EnsdiagError(f"{self.kind} {name!r} is registered twice")
        self[name] = entry
        self.recognisers.pop(name, None)
        if recognises is not None:
            self.recognisers[name] = recognises
        if order is not None:
            self.orders[name] = order
        if self.orders:  # stable: equal orders keep the order they were registered in
            ranked = sorted(self.items(), key=lambda item: self.orders.get(item[0], float("inf")))
            self.clear()
            self.update(ranked)
        return entry

    def register(self, name: str, order=None, recognises=None):
        """`add` as a decorator: the entry is returned unchanged."""
        return lambda entry: self.add(name, entry, order, recognises)

    def named(self, name: str):
        """The entry registered as `name`, or the one-line error that names the nearest ones."""
        if name not in self:
            raise unknown(self.kind, name, self)
        return self[name]

    def recognise(self, thing):
        """The name of the first entry, in order, whose `recognises` test accepts `thing`, or None."""
        return next((name for name in self if name in self.recognisers and self.recognisers[name](thing)), None)


@cache
def import_all(package: str) -> None:
    """Import every module of the package named `package`, each registering its own components (once)."""
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{module.name}")
