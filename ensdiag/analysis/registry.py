"""The analyzer registry: built-ins by decorator, plug-ins through the entry-point group.

An analyzer is a function `(predictions, weights) -> result dict`, registered with
`@register_analyzer("name", description=...)`. `predictions` maps split names to
{"logits": float [k, N, C], "labels": int64 [N] | None}; `weights` is a model's
`member_weights()` or None. It raises `Skip("reason")` when its inputs are missing.
Analyzers never print and never read files.

Third-party analyzers: in your package's pyproject.toml
    [project.entry-points."ensdiag.analyzers"]
    my-analyzer = "my_package.module:my_function"
where `my_function` is decorated with `@ensdiag.analysis.register_analyzer("my-analyzer")`
(or is a plain function of the same signature, registered under the entry point's name).
"""

from dataclasses import dataclass
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "ensdiag.analyzers"
ANALYZERS: dict[str, "Analyzer"] = {}


def is_ood_split(name: str) -> bool:
    """OOD splits (`ood`, `ood/<part>`) are unlabelled by definition: whatever labels the
    dataset carries on disk (FashionMNIST's, SVHN's) name classes the model never learned."""
    return name == "ood" or name.startswith("ood/")


def without_ood_labels(predictions: dict) -> dict:
    """The predictions with the labels of every OOD split dropped (a shallow copy)."""
    return {name: {**split, "labels": None} if is_ood_split(name) else split for name, split in predictions.items()}


class Skip(Exception):
    """Raised by an analyzer whose inputs are missing; the message says why."""


@dataclass(frozen=True)
class Analyzer:
    name: str
    function: callable
    description: str
    version: int = 1
    source: str = "built-in"

    def __call__(self, predictions, weights=None):
        return self.function(predictions, weights)


def register_analyzer(name: str, description: str = "", version: int = 1, source: str = "built-in"):
    def register(function):
        ANALYZERS[name] = Analyzer(name, function, description or (function.__doc__ or "").strip().split("\n")[0],
                                   version, source)
        return function
    return register


_plugins_loaded = False


def load_plugins(force: bool = False) -> dict[str, str]:
    """Import every `ensdiag.analyzers` entry point; returns {name: error} for those that failed."""
    global _plugins_loaded
    errors = {}
    if _plugins_loaded and not force:
        return errors
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            function = point.load()
        except Exception as error:  # a broken plug-in must not break ensdiag
            errors[point.name] = f"{type(error).__name__}: {error}"
            continue
        if point.name not in ANALYZERS:
            register_analyzer(point.name, source=f"plug-in {point.value}")(function)
    _plugins_loaded = True
    return errors


def all_analyzers() -> dict[str, Analyzer]:
    load_plugins()
    return dict(ANALYZERS)


def metric(value, definition: str, **extra) -> dict:
    """One reported number (or matrix) with its definition; NaN becomes None (JSON null)."""
    if isinstance(value, float) and value != value:
        value = None
    return {"value": value, "definition": definition, **extra}
