"""The predictions file: member logits per split, written by ensdiag or any other framework.

A predictions file is a `.safetensors` file any framework can write:
    "<split>/logits"  float32 [k, N, C]   member logits (members first)
    "<split>/labels"  int64   [N]         where the split has labels (never for ood)
with split names `id`, `ood`, `shift` and `shift/<corruption>`, and metadata
`ensdiag.format = "ensdiag.predictions/1"` (optional for files made elsewhere). When only
`shift/<corruption>` splits are present, `load_predictions` adds the pooled `shift` split.
OOD splits are unlabelled: ensdiag writes no OOD labels and drops any a foreign file carries.
"""

import json

import torch

from .checks import check_predictions
from .errors import EnsdiagError
from .io import atomic_write_bytes, read_safetensors, safetensors_bytes_deterministic
from .layout import is_ood_split

PREDICTIONS_FORMAT = "ensdiag.predictions/1"


def save_predictions(predictions: dict[str, dict], path, metadata: dict | None = None):
    tensors, storages = {}, set()

    def own(tensor):  # safetensors refuses tensors that share memory (e.g. splits sliced from one tensor)
        tensor = tensor.contiguous()
        if tensor.untyped_storage().data_ptr() in storages:
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        return tensor

    for name, split in predictions.items():
        tensors[f"{name}/logits"] = own(split["logits"].float())
        if split.get("labels") is not None and not is_ood_split(name):
            tensors[f"{name}/labels"] = own(split["labels"].long())
    meta = {"ensdiag.format": PREDICTIONS_FORMAT, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}}
    return atomic_write_bytes(path, safetensors_bytes_deterministic(tensors, meta))


def load_predictions(path) -> tuple[dict[str, dict], dict]:
    """Validated predictions {split: {"logits", "labels"}} and the file's metadata."""
    tensors, metadata = read_safetensors(path, "predictions file")
    fmt = metadata.get("ensdiag.format", PREDICTIONS_FORMAT)
    if fmt != PREDICTIONS_FORMAT:
        raise EnsdiagError(f"{path} is a {fmt!r} file, not predictions ({PREDICTIONS_FORMAT})")
    splits: dict[str, dict] = {}
    for key, tensor in tensors.items():
        name, _, kind = key.rpartition("/")
        if kind not in ("logits", "labels") or not name:
            raise EnsdiagError(f"{path}: unexpected tensor {key!r}; expected '<split>/logits' and '<split>/labels'")
        splits.setdefault(name, {"logits": None, "labels": None})[kind] = tensor
    if not splits:
        raise EnsdiagError(f"{path} holds no '<split>/logits' tensors")
    for name, split in splits.items():
        if split["logits"] is None:
            raise EnsdiagError(f"{path}: split {name!r} has labels but no logits")
    # shapes, dtypes, finiteness, labels, k and C: the one place
    return with_pooled_shift(check_predictions(splits, str(path))), metadata


def with_pooled_shift(splits: dict[str, dict]) -> dict[str, dict]:
    """Add the pooled `shift` split (all `shift/<corruption>` concatenated) if it is absent;
    order the splits id, shift, ood, then the per-corruption ones. Where every corruption holds the
    same labelled images (one test set, corrupted each way), the pooled split says so (`clusters`:
    the number of images), and its interval resamples images, each with all its corruptions."""
    parts = [name for name in splits if name.startswith("shift/")]
    splits = dict(splits)
    if "shift" not in splits and parts and all(splits[p]["labels"] is not None for p in parts):
        labels = [splits[p]["labels"] for p in parts]
        same = all(len(part) == len(labels[0]) and torch.equal(part, labels[0]) for part in labels)
        splits["shift"] = {"logits": torch.cat([splits[p]["logits"] for p in parts], dim=1), "labels": torch.cat(labels),
                           **({"clusters": len(labels[0])} if same and len(parts) > 1 and len(labels[0]) else {})}
    rank = {"id": 0, "shift": 1, "ood": 2}
    return dict(sorted(splits.items(), key=lambda item: rank.get(item[0], 3)))
