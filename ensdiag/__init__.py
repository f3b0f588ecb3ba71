"""ensdiag: is your ensemble really an ensemble? Diagnostics for trained ensembles.

    import ensdiag
    model = ensdiag.build_model("mlp", "batch-ensemble", num_members=4, num_classes=10,
                                input_shape=(1, 28, 28))
    ensdiag.save_model(model, "model.safetensors")
    model = ensdiag.load_model("model.safetensors")
"""

__version__ = "0.1.0"

from .checkpoint import load_model, save_model  # noqa: E402
from .errors import EnsdiagError  # noqa: E402
from .nn import EnsembleModel, ModelSpec, build_model  # noqa: E402

__all__ = ["EnsdiagError", "EnsembleModel", "ModelSpec", "build_model", "load_model", "save_model"]
