"""Ensemble layers, the paper's architectures, and the `EnsembleModel` builders."""

from ..registry import import_all
from .architectures import ARCHITECTURES, register_arch
from .kit import METHODS, register_method
from .model import EnsembleModel, ModelSpec, build_from_spec, build_model, flush_denormals

import_all(f"{__name__}.kits")  # every method with a module of its own registers itself

__all__ = ["ARCHITECTURES", "METHODS", "EnsembleModel", "ModelSpec", "build_from_spec", "build_model", "flush_denormals",
           "register_arch", "register_method"]
