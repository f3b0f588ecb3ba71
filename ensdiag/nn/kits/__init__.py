"""Methods in modules of their own: each module here registers one method's kit on import.

Add a method by adding a module (see docs/architecture.md, "Adding a method"); nothing else
imports it by name: `ensdiag.nn` imports every module in this package.
"""

import importlib
import pkgutil


def load_all() -> None:
    """Import every module here, then list the methods in their kits' `order` (the paper's four
    first), not in file-name order."""
    from ..kit import METHODS
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    ordered = sorted(METHODS.items(), key=lambda item: item[1].order)
    METHODS.clear()
    METHODS.update(ordered)
