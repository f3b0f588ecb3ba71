"""Save and load any `EnsembleModel` as one `.safetensors` file.

The file's metadata (strings only) makes it self-describing:
    ensdiag.format  "ensdiag.model/1"
    ensdiag.spec    the model's `ModelSpec` as a JSON string
    ensdiag.initial_cosine  (optional) {"mean", "seed"}: the members' weight cosine at initialisation
    ensdiag.preprocess      (optional) {"mean", "std"}: the per-channel normalisation of images in [0, 1]
                            the model was trained with (every path applies it by default)
    ensdiag.holdout         (optional) {"seed", "fraction", "train_size"}: the validation examples held out of
                            the training split (data/preset.py `holdout`), so geometry's training loss reads
                            training examples only
so `load_model(path)` rebuilds the architecture and loads the weights with no other input.
Files are written byte-for-byte reproducibly (`safetensors_bytes_deterministic`): the same
tensors and metadata give the same sha256 in any process.
"""

import json
import math

import torch

from . import __version__
from .config import PRESETS, preset_for
from .errors import EnsdiagError, InputTypeError, path_argument
from .io import atomic_write_bytes, parse_json, read_safetensors, safetensors_bytes_deterministic
from .nn.model import EnsembleModel, ModelSpec, build_from_spec

MODEL_FORMAT = "ensdiag.model/1"


def save_model(model: EnsembleModel, path, extra_metadata: dict[str, str] | None = None):
    if not isinstance(model, EnsembleModel):
        raise InputTypeError(f"save_model saves an ensdiag EnsembleModel, not a {type(model).__name__}")
    path = path_argument(path, "model file")
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
    metadata = {"ensdiag.format": MODEL_FORMAT, "ensdiag.spec": model.spec.to_json(),
                "ensdiag.version": __version__, **(extra_metadata or {})}
    if model.initial_cosine is not None:
        metadata["ensdiag.initial_cosine"] = json.dumps(model.initial_cosine)
    if getattr(model, "holdout", None) is not None:
        metadata["ensdiag.holdout"] = json.dumps(model.holdout, sort_keys=True)
    if getattr(model, "preprocess", None) is not None:
        mean, std = model.preprocess
        metadata["ensdiag.preprocess"] = json.dumps({"mean": list(mean), "std": list(std)})
    return atomic_write_bytes(path, safetensors_bytes_deterministic(tensors, metadata))


def _spec_from_metadata(path, metadata) -> ModelSpec:
    fmt = metadata.get("ensdiag.format")
    if fmt is None:
        raise EnsdiagError(f"{path} has no ensdiag metadata: it was not written by ensdiag.save_model "
                           "(for logits from another framework use `ensdiag analyze`)")
    if fmt != MODEL_FORMAT:
        raise EnsdiagError(f"{path} is a {fmt!r} file, not a model ({MODEL_FORMAT})")
    if "ensdiag.spec" not in metadata:
        raise EnsdiagError(f"{path} lacks the ensdiag.spec metadata needed to rebuild the model")
    return ModelSpec.from_json(metadata["ensdiag.spec"])


def load_model(path, device="cpu") -> EnsembleModel:
    """The model a file describes, checked against the tensors actually in it before anything
    is allocated: the architecture is first built on the `meta` device (no memory), so a spec
    asking for terabytes fails as a mismatch instead of an allocation."""
    path = path_argument(path, "model file")
    tensors, metadata = read_safetensors(path, "model file")
    spec = _spec_from_metadata(path, metadata)
    with torch.device("meta"):
        skeleton = build_from_spec(spec)
    _check_tensors(path, spec, skeleton.state_dict(), tensors)
    model = build_from_spec(spec)
    model.load_state_dict(tensors)
    # the cosine at initialisation, else rebuilt from the spec (and said so)
    model.initial_cosine = _recorded(metadata, "ensdiag.initial_cosine", ("mean", "seed"), lambda mean, seed: (
        isinstance(mean, float) and -1.000001 <= mean <= 1.000001 and _whole(seed) and abs(seed) < 2**63))
    # the normalisation; a file without it (written before 0.7): ensdiag trained it on the preset whose
    # architecture, inputs and classes it has, normalised as that preset is
    recorded = _recorded(metadata, "ensdiag.preprocess", ("mean", "std"), lambda mean, std: (
        isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == spec.input_shape[0]
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in [*mean, *std])
        and all(v > 0 for v in std)))
    preset = preset_for(spec)
    model.preprocess = (tuple(map(float, recorded["mean"])), tuple(map(float, recorded["std"]))) if recorded else (
        None if preset is None else (tuple(PRESETS[preset].mean), tuple(PRESETS[preset].std)))
    # the validation examples held out, else geometry reads the whole training split (and says so)
    model.holdout = _recorded(metadata, "ensdiag.holdout", ("seed", "fraction", "train_size"),
                              lambda seed, fraction, size: _whole(seed) and abs(seed) < 2**63 and _whole(size)
                              and 0 < size < 2**40 and isinstance(fraction, float) and 0 < fraction < 1)
    return model.to(device).eval()


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _recorded(metadata: dict, key: str, names: tuple, valid) -> dict | None:
    """{name: value} of the JSON object a model file records under `key`, checked like user input
    (`valid(*values)`); anything else counts as not recorded."""
    try:
        found = parse_json(metadata[key], key)  # an EnsdiagError is a ValueError
        values = [found[name] for name in names]
    except (TypeError, ValueError, KeyError):
        return None
    return dict(zip(names, values)) if valid(*values) else None


def _check_tensors(path, spec, expected: dict, tensors: dict):
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [name for name in expected if name in tensors and tensors[name].shape != expected[name].shape]
    if missing or unexpected or wrong:
        problems = [f"{len(missing)} missing (e.g. {missing[0]})" if missing else "",
                    f"{len(unexpected)} unexpected (e.g. {unexpected[0]})" if unexpected else "",
                    f"{len(wrong)} of the wrong shape (e.g. {wrong[0]}: {tuple(tensors[wrong[0]].shape)} "
                    f"vs {tuple(expected[wrong[0]].shape)})" if wrong else ""]
        raise EnsdiagError(f"{path}: tensors do not fit its spec ({spec.arch}/{spec.method}, "
                           f"k={spec.num_members}): {'; '.join(p for p in problems if p)}")
    for name, tensor in tensors.items():
        if tensor.is_floating_point() != expected[name].is_floating_point():
            raise EnsdiagError(f"{path}: tensor {name} is {tensor.dtype}, expected {expected[name].dtype}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise EnsdiagError(f"{path}: tensor {name} holds NaN or infinite values (did its training diverge?); "
                               "there is no model to diagnose")
