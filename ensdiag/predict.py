"""An ensemble × data -> member logits per split: the one prediction loop every path runs
(`inspect`, training's evaluation, `evaluate`, `diversity`, `diagnose()`, the Tracker, the bench).
The file that carries the logits: predictions.py."""

import torch

from . import distributed
from .errors import EnsdiagError, InputTypeError
from .nn.model import flush_denormals
from .precision import exact_math
from .predictions import PREDICTIONS_FORMAT, load_predictions, save_predictions, with_pooled_shift  # noqa: F401

BATCH = 1000  # images per forward when the data is a tensor of images


def image_batches(images: torch.Tensor, labels=None, batch_size: int = BATCH):
    """(images, labels) batches of a split held in memory (labels None: unlabelled)."""
    for start in range(0, len(images), batch_size):
        yield images[start:start + batch_size], None if labels is None else labels[start:start + batch_size]


@torch.no_grad()
def predict_batches(ensemble, batches, preprocess, device, keep: int = 0, name: str = "data", progress=None):
    """(logits float32 [k, N, C] on the CPU, labels int [N] | None, (kept inputs, kept labels) | None).

    Each batch goes to `device` (where the members are: they are never moved), through
    `preprocess`, then the ensemble, in exact fp32 (precision.py). The first `keep` inputs are kept
    on the CPU for member geometry. `progress`: a function wrapping the batch iterator (a bar)."""
    chunks, labels, kept_x, kept_y, unlabelled, classes = [], [], [], [], False, None
    batches = progress(batches) if progress is not None else batches
    with exact_math():
        for x, y in batches:
            if not isinstance(x, torch.Tensor):
                raise InputTypeError(f"{name}: inputs must be tensors, got {type(x).__name__}")
            logits = ensemble(preprocess(x.to(device)))
            if not isinstance(logits, torch.Tensor):
                raise InputTypeError(f"{name}: the ensemble returned a {type(logits).__name__}, not logits [k, B, C]")
            if logits.dim() != 3 or logits.shape[1] != len(x) or (classes is not None and logits.shape[2] != classes):
                raise EnsdiagError(f"{name}: the members must return logits [k, B, C] for a batch of {len(x)}, got "
                                   f"{tuple(logits.shape)}" + (f" after batches of C = {classes}" if classes else ""))
            classes = logits.shape[2]
            chunks.append(logits.float().cpu())
            unlabelled |= y is None
            labels.append(y)
            room = keep - sum(len(k) for k in kept_x)
            if room > 0:
                kept_x.append(x[:room].cpu())
                kept_y.append(None if y is None else y[:room].cpu())
    if not chunks:
        raise EnsdiagError(f"{name}: no data (an empty split)")
    labels = None if unlabelled else torch.cat([y.cpu() for y in labels])
    kept = (torch.cat(kept_x), None if unlabelled else torch.cat(kept_y)) if kept_x else None
    return torch.cat(chunks, dim=1), labels, kept


def predict_split(model, images, normalize, device, batch_size=BATCH) -> torch.Tensor:
    """Member logits float32 [k, N, C] for images [N, ...] (uint8 or float in [0, 1])."""
    if len(images) == 0:  # no images: one empty batch gives [k, 0, C]
        return predict_batches(model, [(images, None)], normalize, device)[0]
    return predict_batches(model, image_batches(images, None, batch_size), normalize, device)[0]


def predict(model, splits, normalize, device, seed=0, spread=False) -> dict[str, dict]:
    """{split: {"logits": [k,N,C], "labels": [N] | None}} for `Split`s of images; seeded, so MC
    Dropout repeats.

    With `spread` (under torchrun) every rank predicts its contiguous share of each split and
    every rank gets all the logits back, in order: large shift sets (CIFAR-10-C's 950,000
    images) take 1/world of the time. MC Dropout's masks then differ from one process's
    (each rank draws its own from the seed and its rank), the other methods' logits do not."""
    from .ensembles import as_ensemble, measuring
    flush_denormals()
    ensemble = as_ensemble(model)
    result = {}
    # spread over ranks, each draws its own MC Dropout masks (the same seed would repeat rows' masks)
    with measuring(ensemble, seed + 1_000_003 * distributed.ranks().rank if spread else seed):
        for name, split in splits.items():
            if spread:
                local = predict_split(ensemble, split.images[distributed.shard(len(split.images))], normalize, device)
                logits = distributed.gather_rows(local.to(device), dim=1).cpu()
            else:
                logits = predict_split(ensemble, split.images, normalize, device)
            result[name] = {"logits": logits, "labels": split.labels}
    return result
