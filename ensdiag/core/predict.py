"""An ensemble × data -> member logits per split: the one prediction loop every path runs
(`core.inspect`, hence training's evaluation, `evaluate`, `diversity` and `diagnose()`; the
Tracker; the bench). The file that carries the logits: predictions.py.

    found, kept = predict_splits(ensemble, {"id": test, "ood": ood}, preprocess, device, seed=0)

Batches go to the device the members are on (the members are never moved), are copied there
when that would alias the caller's tensor (a preprocessing step or member that works in place
cannot change the user's data), and run in exact fp32 (precision.py) with the ensemble in eval
mode and the random state forked and seeded (`ensembles.measuring`).
"""

import torch

from .. import distributed
from ..data.given import batches, image_batches
from ..data.registry import Split
from ..ensembles import as_ensemble, measuring
from ..errors import EnsdiagError, InputTypeError
from ..nn.model import flush_denormals
from ..precision import exact_math

SPLIT_ORDER = ("id", "shift", "ood", "val")  # MC Dropout draws its masks split after split, in this order
GEOMETRY_SPLITS = ("id", "ood")  # what member geometry reads (CKA on both, paths on id)


@torch.no_grad()
def predict_batches(ensemble, batches, preprocess, device, keep: int = 0, name: str = "data", progress=None):
    """(logits float32 [k, N, C] on the CPU, labels int [N] | None, (kept inputs, kept labels) | None).

    The first `keep` inputs are kept (copied, on the CPU) for member geometry. `progress`: a
    function wrapping the batch iterator (a bar)."""
    chunks, labels, kept_x, kept_y, labelled, classes = [], [], [], [], set(), None
    batches = progress(batches) if progress is not None else batches
    with exact_math():
        for x, y in batches:
            if not isinstance(x, torch.Tensor) or x.dim() == 0:
                raise InputTypeError(f"{name}: inputs must be tensors [B, …], got {type(x).__name__} "
                                     f"{tuple(getattr(x, 'shape', ()))}")
            labelled.add(y is not None)
            if len(labelled) > 1:
                raise EnsdiagError(f"{name}: some batches have labels and some do not; give labels for all or none")
            inputs = x.to(device)
            if inputs.data_ptr() == x.data_ptr():  # the caller's own tensor: never handed on to be changed
                inputs = inputs.clone()
            logits = _forward(ensemble, preprocess(inputs), x, name)
            if logits.dim() != 3 or logits.shape[1] != len(x) or (classes is not None and logits.shape[2] != classes):
                raise EnsdiagError(f"{name}: the members must return logits [k, B, C] for a batch of {len(x)}, got "
                                   f"{tuple(logits.shape)}" + (f" after batches of C = {classes}" if classes else ""))
            classes = logits.shape[2]
            chunks.append(logits.float().cpu())
            labels.append(y)
            room = keep - sum(len(k) for k in kept_x)
            if room > 0:
                kept_x.append(x[:room].detach().cpu().clone())
                kept_y.append(None if y is None else y[:room].cpu())
    if not chunks:
        raise EnsdiagError(f"{name}: no data (an empty split)")
    unlabelled = labelled == {False}
    labels = None if unlabelled else torch.cat([y.cpu() for y in labels])
    kept = (torch.cat(kept_x), None if unlabelled else torch.cat(kept_y)) if kept_x else None
    return torch.cat(chunks, dim=1), labels, kept


def _forward(ensemble, inputs, given, name):
    """The ensemble's logits for one batch; a failure of the members on the user's inputs is one line."""
    try:
        logits = ensemble(inputs)
    except RuntimeError as error:  # shapes, dtypes, devices: what the user's data and members disagree on
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise EnsdiagError(f"{name}: the members could not run on inputs of shape {tuple(given.shape)} "
                           f"({given.dtype}): {first}") from None
    if not isinstance(logits, torch.Tensor):
        raise InputTypeError(f"{name}: the ensemble returned a {type(logits).__name__}, not logits [k, B, C]")
    return logits


class Interrupted(Exception):
    """Ctrl-C while predicting: the splits finished so far (`found`, `kept`), the one being read and
    those left (it among them), so that an inspection keeps what it finished (inspection.py)."""

    def __init__(self, found: dict, kept: dict, split: str, left: list):
        super().__init__(f"interrupted while predicting {split}")
        self.found, self.kept, self.split, self.left = found, kept, split, left


def predict_splits(ensemble, splits: dict, preprocess, device, seed: int = 0, spread: bool = False, progress=None,
                   keep: int = 0) -> tuple[dict, dict]:
    """({split: {"logits", "labels"}}, {split: kept Split}) for splits of data in any form
    `data.given` reads, in `SPLIT_ORDER`, under one seed (MC Dropout's masks repeat).

    With `spread` (under torchrun) every rank predicts its contiguous share of each split of
    images and every rank gets all the logits back, in order: large shift sets (CIFAR-10-C's
    950,000 images) take 1/world of the time. MC Dropout's masks then differ from one process's
    (each rank draws its own from the seed and its rank), the other methods' logits do not."""
    ensemble = as_ensemble(ensemble)
    preprocess = preprocess or (lambda x: x)
    found, kept = {}, {}
    rank = distributed.ranks().rank if spread else 0
    order = sorted(splits, key=lambda s: SPLIT_ORDER.index(s.split("/")[0]) if s.split("/")[0] in SPLIT_ORDER else 9)
    with measuring(ensemble, seed + 1_000_003 * rank):
        for position, name in enumerate(order):
            data = splits[name]
            if data is None:
                continue
            if spread and isinstance(data, Split):  # every rank takes part in the gather: no one stops alone
                images = data.images[distributed.shard(len(data))]  # (none: one empty batch gives [k, 0, C])
                local = predict_batches(ensemble, image_batches(images) if len(images) else [(images, None)],
                                        preprocess, device)[0]
                found[name] = {"logits": distributed.gather_rows(local.to(device), dim=1).cpu(), "labels": data.labels}
                continue
            bar = progress(name) if progress is not None else None
            sample = keep if name in GEOMETRY_SPLITS and not isinstance(data, Split) else 0
            try:
                logits, labels, first = predict_batches(ensemble, batches(data, name), preprocess, device, sample, name,
                                                        bar)
            except KeyboardInterrupt:
                if spread:
                    raise
                raise Interrupted(found, kept, name, [n for n in order[position:] if splits[n] is not None]) from None
            found[name] = {"logits": logits, "labels": labels}
            if first is not None:
                kept[name] = Split(*first, f"the first {len(first[0])} of {name}")
    return found, kept


def predict(model, splits, normalize, device, seed=0, spread=False) -> dict[str, dict]:
    """{split: {"logits": [k,N,C], "labels": [N] | None}} of an ensdiag model on `Split`s of
    images (the bench's and tests' entry; the core checks and pools what it predicts)."""
    flush_denormals()
    return predict_splits(model, splits, normalize, device, seed, spread)[0]
