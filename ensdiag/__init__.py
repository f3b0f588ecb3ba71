"""ensdiag: is your ensemble really an ensemble? Diagnostics for trained ensembles.

    import ensdiag
    model = ensdiag.build_model("mlp", "batch-ensemble", num_members=4, num_classes=10,
                                input_shape=(1, 28, 28))
    ensdiag.save_model(model, "model.safetensors")
    model = ensdiag.load_model("model.safetensors")
    model = ensdiag.import_ensemble(["be_mlp.ckpt"])      # trained elsewhere (torch-uncertainty, PyTorch)
    diagnosis = ensdiag.diagnose([net_a, net_b], test=(x, y))  # any ensemble, any data
    diagnosis = ensdiag.diagnose(members, test=(x, y), measure=ensdiag.Measure(geometry=False, budget="5m"))
    diagnosis.save("runs/mine", method="deep-ensemble")     # then: ensdiag report runs/mine
"""

__version__ = "0.7.0"

from importlib import import_module
from typing import TYPE_CHECKING

from .errors import EnsdiagError, InputTypeError, public

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and editors (py.typed ships)
    from .checkpoint import load_model, save_model
    from .core import Context, Measure
    from .ensembles import as_ensemble
    from .results import Diagnosis, diagnose
    from .foreign.checkpoints import import_ensemble, open_ensemble
    from .nn import EnsembleModel, ModelSpec, build_model
    from .registries import list_analyzers, list_datasets, list_methods
    from .tracker import Tracker

# The public names below import torch; they are resolved on first use so that `ensdiag --help`
# and `ensdiag --version` start without it.
_LAZY = {"load_model": "checkpoint", "save_model": "checkpoint", "import_ensemble": "foreign.checkpoints",
         "open_ensemble": "foreign.checkpoints", "EnsembleModel": "nn", "ModelSpec": "nn",
         "build_model": "nn", "diagnose": "results", "Diagnosis": "results", "Tracker": "tracker",
         "Measure": "core", "Context": "core", "as_ensemble": "ensembles",
         "list_methods": "registries", "list_analyzers": "registries", "list_datasets": "registries"}


_SUBMODULES = {"analysis", "bench", "checkpoint", "checks", "config", "core", "data", "ensembles", "experiment", "export",
               "foreign", "io", "nn", "predictions", "report", "train"}


_CLASSES = {"EnsembleModel", "ModelSpec", "Diagnosis", "Tracker", "Measure", "Context"}


def __getattr__(name):
    if name in _LAZY:
        found = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        if name not in _CLASSES:  # the public functions: every failure on bad input an EnsdiagError (errors.public)
            found = public(found)
        globals()[name] = found  # resolved once
        return found
    if name in _SUBMODULES:  # `import ensdiag; ensdiag.nn` works as it did with eager imports
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ensdiag' has no attribute {name!r}")


__all__ = ["Context", "Diagnosis", "EnsdiagError", "InputTypeError", "Measure", "Tracker", "EnsembleModel", "ModelSpec",
           "as_ensemble", "build_model", "diagnose", "import_ensemble",
           "list_analyzers", "list_datasets", "list_methods", "load_model", "open_ensemble", "save_model"]
