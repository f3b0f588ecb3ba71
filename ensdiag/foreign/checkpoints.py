"""Ensembles trained elsewhere: torch-uncertainty checkpoints and plain PyTorch state_dicts.

    model = import_ensemble(["be_mlp.ckpt"])                  # torch-uncertainty BatchEnsemble (Lightning)
    model = import_ensemble(["m0.pt", "m1.pt", "m2.pt"])       # k state_dicts: a Deep Ensemble
    ensdiag import SRC... --out model.safetensors [--from torch-uncertainty|state-dicts]

What is read (the format is detected from the keys; `--from` forces the family):
- torch-uncertainty BatchEnsemble (`batched_mlp`, the CIFAR-style batched ResNet-18): a layer
  stores W as `<layer>.linear.weight` / `<layer>.conv.weight`, `r_group` [k, in] scaling the
  inputs, `s_group` [k, out] scaling the outputs and a per-member bias [k, out]. ensdiag's
  `r` scales outputs and `s` inputs, so r ← s_group and s ← r_group. The ResNet maps onto the
  paper layout (plain shortcuts; their shared bias when the file has one; missing block biases
  are zeros, which computes the same).
- torch-uncertainty Deep Ensembles: one plain `mlp` / ResNet-18 state_dict per member, or one
  `deep_ensembles` checkpoint (`core_models.<i>.` prefixes).
- Plain PyTorch members of ensdiag's own `mlp` / `resnet18` (ensdiag's key names).
Files: `.pt`/`.pth`/`.ckpt`/`.bin` through `torch.load(weights_only=True)` (Lightning checkpoints:
their `state_dict`, without the `model.` prefix) and plain `.safetensors`. Nothing needing more
than tensors is loaded: such a file is refused with the reason. When no ensdiag architecture
matches, `import_ensemble` returns `RawEnsemble`: weight similarity still runs on the tensors.
"""

import re
from dataclasses import dataclass, replace

import torch
from safetensors import safe_open

from ..errors import EnsdiagError, InputTypeError
from ..nn import ARCHITECTURES
from ..nn.architectures import check_torchvision_name
from ..nn.members import stacked_state
from ..nn.methods import resolve_options
from ..nn.model import MemberWeights, ModelSpec, build_from_spec
from . import torch_uncertainty
from .state_dicts import member_files, path_list, read_state_dict

FAMILIES = ("auto", "torch-uncertainty", "state-dicts")
STATS = ("running_mean", "running_var", "num_batches_tracked")


@dataclass
class RawEnsemble:
    """Members without a runnable architecture: their weights only (weight similarity runs on them)."""

    member_tensors: list[dict[str, torch.Tensor]]
    source: str
    reason: str = "no ensdiag architecture matches these weights"

    def member_weights(self):
        return MemberWeights(self.member_tensors)


def _deep_ensemble(states):
    """(the spec of a Deep Ensemble, its members' states renamed) for plain members of mlp or resnet18, or None."""
    renamed = []
    for state in states:
        state = {key.removeprefix("body."): value for key, value in state.items()}
        if "layers.0.weight" in state or "final_layer.weight" in state:
            state = torch_uncertainty.renamed(state, torch_uncertainty.TU_MLP_RULES)
        elif "linear.weight" in state and "fc.weight" not in state:
            state = torch_uncertainty.renamed(state, torch_uncertainty.TU_RESNET_RULES)
        renamed.append(state)
    first, k = renamed[0], len(renamed)
    if "head.weight" in first and (shape := torch_uncertainty.mlp_shape(first)) is not None:
        return ModelSpec("mlp", "deep-ensemble", k, first["head.weight"].shape[0], shape), renamed
    layout = torch_uncertainty.resnet18_layout(first)
    if layout is not None and "fc.weight" in first:
        channels, width = layout
        return ModelSpec("resnet18", "deep-ensemble", k, first["fc.weight"].shape[0], (channels, 32, 32), {},
                         {"width": width} if width != 64 else {}), renamed
    return None


def _check_fits(state, expected, network: str, where: str, optional=()) -> None:
    """`state` holds every tensor `network` expects (but those ending in `optional`), each of its shape,
    and no other: the first that does not, named in one line (`where`: the file and the member)."""
    missing = [key for key in expected if key not in state and not key.endswith(optional)]
    extra = [key for key in state if key not in expected]
    wrong = [key for key in expected if key in state and tuple(state[key].shape) != tuple(expected[key].shape)]
    if missing:
        raise EnsdiagError(f"{where} lacks {missing[0]!r} (shape {list(expected[missing[0]].shape)}) that {network} "
                           f"needs ({len(missing)} missing, {len(extra)} unexpected)")
    if extra:
        raise EnsdiagError(f"{where} has {extra[0]!r}, which {network} lacks ({len(extra)} unexpected): is it another "
                           "architecture?")
    if wrong:
        raise EnsdiagError(f"{where} {wrong[0]!r} has shape {list(state[wrong[0]].shape)}, {network} expects "
                           f"{list(expected[wrong[0]].shape)}")


def _load_into(spec, state, source):
    model = build_from_spec(_resolved(spec))
    _check_fits(state, model.body.state_dict(), f"the {spec.method} {spec.arch} it looks like", source)
    model.body.load_state_dict(state)
    return model.eval()


def _resolved(spec):
    """The spec with every method option written out, as a model built by ensdiag records it."""
    builder = ARCHITECTURES[spec.arch]
    return replace(spec, options=resolve_options(spec.method, spec.options, builder.default_options,
                                                 builder.convolutional, spec.arch))


def _raw(states, source, reason):
    """Matching float tensors of every member (BatchNorm statistics aside); BatchEnsemble layers as
    their effective member weights W ∘ s_group r_groupᵀ."""
    if len(states) == 1 and any(key.endswith(".r_group") for key in states[0]):
        state, layers = states[0], [key[: -len(".r_group")] for key in states[0] if key.endswith(".r_group")]
        k = state[f"{layers[0]}.r_group"].shape[0]
        members = [{} for _ in range(k)]
        for layer in layers:
            weight = state.get(f"{layer}.linear.weight", state.get(f"{layer}.conv.weight"))
            r, s = state[f"{layer}.r_group"], state[f"{layer}.s_group"]
            if weight is None or r.dim() != 2:
                continue
            for i in range(k):
                scale = s[i].reshape(-1, *[1] * (weight.dim() - 1)) * r[i].reshape(1, -1, *[1] * (weight.dim() - 2))
                members[i][f"{layer}.weight"] = weight * scale
        return RawEnsemble(members, source, reason)
    shared = set.intersection(*(set(state) for state in states))
    keys = [key for key in states[0] if key in shared and states[0][key].is_floating_point()
            and not key.endswith(STATS) and all(state[key].shape == states[0][key].shape for state in states)]
    if not keys:
        raise EnsdiagError(f"{source}: the members share no tensor of one shape; nothing to compare")
    return RawEnsemble([{key: state[key].float() for key in keys} for state in states], source, reason)


def open_ensemble(paths, family="auto", raw_ok=True, arch="auto", num_classes=None):
    """An ensdiag model file as saved, or foreign checkpoints through `import_ensemble`."""
    paths = path_list(paths)
    if family == "auto" and arch == "auto" and len(paths) == 1 and paths[0].suffix == ".safetensors" \
            and _has_ensdiag_metadata(paths[0]):
        from ..checkpoint import load_model
        return load_model(paths[0])
    return import_ensemble(paths, family, raw_ok, arch, num_classes)


def _has_ensdiag_metadata(path) -> bool:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return "ensdiag.format" in (handle.metadata() or {})
    except Exception:  # unreadable: load_model says why
        return True


def _torchvision(states, name, num_classes, source):
    """A Deep Ensemble of torchvision `name` networks holding the members' state_dicts."""
    if num_classes is None:  # the rows of the tensors whose shape follows num_classes (found by building the
        from torchvision.models import get_model  # model for 2 and 3 classes on the meta device)
        check_torchvision_name(name)
        with torch.device("meta"):
            two, three = (get_model(name, weights=None, num_classes=n).state_dict() for n in (2, 3))
        heads = [key for key in two if two[key].shape != three[key].shape and two[key].shape[:1] == (2,)]
        if not heads or heads[0] not in states[0] or states[0][heads[0]].dim() < 1:
            raise EnsdiagError(f"{source}: no classifier of torchvision's {name} found "
                               f"({heads[0] if heads else 'none'}); pass --num-classes")
        num_classes = int(states[0][heads[0]].shape[0])
    spec = ModelSpec("torchvision", "deep-ensemble", len(states), num_classes, (3, 224, 224), {}, {"name": name})
    with torch.device("meta"):  # every key and shape checked before anything real is allocated
        skeleton = build_from_spec(spec)
    for i, state in enumerate(states):
        _check_fits(state, skeleton.body.member_module(i).state_dict(), f"torchvision's {name}", f"{source}: member {i}")
    model = build_from_spec(spec)
    for i, state in enumerate(states):
        model.body.member_module(i).load_state_dict(state)
    return model.eval()


def _imported(model, source):
    """The model imported from `source`, its weights checked finite, saying where it came from."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise EnsdiagError(f"{source}: {name} holds NaN or infinite values (did its training diverge?); "
                               "there is no model to diagnose")
    model.imported_from = source
    return model


FLOAT_KEYS = (".weight", ".bias", "r_group", "s_group", "running_mean", "running_var")


def _check_tensors(states, source):
    """Member weights that no architecture could hold are refused by name before any shape is
    divided or any layer built: an empty dimension, or integer weights (quantised or damaged
    checkpoints are not silently read as floats)."""
    for i, state in enumerate(states):
        for key, value in state.items():
            where = f"{source}: {'member ' + str(i) + ' ' if len(states) > 1 else ''}{key[:80]!r}"
            if value.dim() and 0 in value.shape:
                raise EnsdiagError(f"{where} has an empty dimension {list(value.shape)}: no network has such a layer")
            if key.endswith(FLOAT_KEYS) and not value.is_floating_point():
                raise EnsdiagError(f"{where} is {str(value.dtype).removeprefix('torch.')}, not floating point: ensdiag "
                                   "reads trained float weights only (convert them yourself if they really are weights)")


def _build(states, family, num_classes, source):
    """The EnsembleModel the states describe, or None when no ensdiag architecture matches their keys."""
    _check_tensors(states, source)
    batch_ensemble = len(states) == 1 and any(key.endswith(".r_group") for key in states[0])
    if batch_ensemble:
        found = torch_uncertainty.batch_ensemble(states[0], source) if family != "state-dicts" else None
        return None if found is None else _load_into(*found, source)
    if len(states) > 1:
        found = _deep_ensemble(states)
        if found is None:
            return None
        spec, members = found
        model = build_from_spec(_resolved(spec))
        stacked = stacked_state(model)  # every tensor of a Deep Ensemble's layers, member-first
        with torch.no_grad():  # each member's plain state into the stacked tensors; the first misfit named
            for i, state in enumerate(members):
                _check_fits(state, model.member_state_dict(i), model.spec.arch, f"{source}: member {i}",
                            "num_batches_tracked")
                for key, view in stacked.items():
                    if not key.endswith("num_batches_tracked"):
                        view[i].copy_(state[key])
        return model.eval()
    if family != "state-dicts":
        found = (torch_uncertainty.grouped(states[0], source, num_classes)
                 or torch_uncertainty.multi_input(states[0], source, num_classes))
        if found is not None:
            return _load_into(*found, source)
    raise EnsdiagError(f"{source} is no ensdiag model file and holds one network, not an ensemble: pass one "
                       "file per member (or, for one network with k input and output heads, --num-classes C)")


def ensemble_from_states(states: list[dict], source: str, num_classes=None):
    """The `EnsembleModel` of in-memory state dicts (one per member, or one of a whole
    torch-uncertainty ensemble), as `import_ensemble` reads them from files; an error when no
    ensdiag architecture holds them."""
    try:
        model = _build([{key: value.detach().cpu() for key, value in state.items()} for state in states],
                       "auto", num_classes, source)
    except EnsdiagError:
        raise  # already one line for the user
    except (KeyError, IndexError, ValueError, RuntimeError, TypeError) as error:
        raise EnsdiagError(f"{source}: the keys look like a known layout but do not fit it ({type(error).__name__})") from None
    if model is None:
        raise EnsdiagError(f"{source}: no ensdiag architecture matches these weights")
    return model


def import_ensemble(paths, family="auto", raw_ok=True, arch="auto", num_classes=None):
    """An `EnsembleModel` from foreign checkpoint files, or, where no ensdiag architecture holds
    them, a `RawEnsemble` saying why (`raw_ok`; else that reason as an error). `arch`: auto (from
    the keys) or `torchvision:NAME` (k state_dicts of a torchvision classification model)."""
    if not isinstance(family, str) or family not in FAMILIES:
        raise EnsdiagError(f"--from must be one of {', '.join(FAMILIES)}, got {family!r}")
    if not isinstance(arch, str):
        raise InputTypeError(f"arch must be 'auto' or 'torchvision:NAME', got {type(arch).__name__}")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)):
        raise InputTypeError(f"num_classes must be a whole number, got {type(num_classes).__name__}")
    if arch != "auto" and not arch.startswith("torchvision:"):
        raise EnsdiagError(f"--arch must be auto or torchvision:NAME (e.g. torchvision:resnet18), got {arch!r}")
    if num_classes is not None and not 2 <= num_classes <= 1_000_000:
        raise EnsdiagError(f"--num-classes must lie in 2..1000000, got {num_classes}")
    paths = member_files(path_list(paths))
    source = ", ".join(str(p) for p in paths[:3]) + (f" … ({len(paths)} files)" if len(paths) > 3 else "")
    states = [read_state_dict(p) for p in paths]
    _check_tensors(states, source)
    if arch.startswith("torchvision:"):
        return _imported(_torchvision(states, arch.partition(":")[2], num_classes, source), source)
    if len(states) == 1 and any(key.startswith("core_models.") for key in states[0]):  # one deep_ensembles file
        members = {}
        for key, value in states[0].items():
            index, _, rest = key.removeprefix("core_models.").partition(".")
            if not key.startswith("core_models.") or not re.fullmatch(r"[0-9]+", index) or not rest:
                raise EnsdiagError(f"{source}: {key[:80]!r} is not a core_models.<i>.<name> key of a deep_ensembles "
                                   "file")
            members.setdefault(index, {})[rest] = value
        if len({int(index) for index in members}) != len(members) \
                or sorted(map(int, members)) != list(range(len(members))):
            raise EnsdiagError(f"{source}: core_models indices {sorted(members)[:8]} are not 0..k-1 once each")
        states = [members[index] for index in sorted(members, key=int)]
    try:
        model = _build(states, family, num_classes, source)
        reason = "no ensdiag architecture (mlp 64-32-16, CIFAR-style resnet18) matches these weights"
    except EnsdiagError as error:
        if not raw_ok or len(states) == 1 and "holds one network" in str(error):
            raise
        model, reason = None, f"the weights do not fit ensdiag's architectures ({error})"
    except (KeyError, IndexError, ValueError, RuntimeError, TypeError) as error:  # keys that half-match a layout
        model, reason = None, f"the keys look like a known layout but do not fit it ({type(error).__name__}: {error})"
        if not raw_ok:
            raise EnsdiagError(f"{source}: {reason}"[:400]) from None
    if model is not None:
        return _imported(model, source)
    if not raw_ok:
        raise EnsdiagError(f"{source}: {reason}; weight similarity can still compare them (ensdiag diversity)")
    try:
        return _raw(states, source, reason)
    except EnsdiagError:
        raise  # already one line for the user
    except (KeyError, IndexError, ValueError, RuntimeError, TypeError) as error:
        raise EnsdiagError(f"{source}: the tensors cannot be compared ({type(error).__name__}: {error})"[:400]) from None
