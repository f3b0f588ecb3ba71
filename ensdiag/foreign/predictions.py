"""Member predictions as NumPy arrays, from any framework: `.npy` and `.npz` files.

    ensdiag analyze logits.npy --labels labels.npy --ood ood_logits.npy
    ensdiag analyze member0.npy member1.npy member2.npy --labels labels.npy --inputs probs
    ensdiag analyze predictions.npz          # keys as in the safetensors layout, or logits/probs + labels

Shapes: one array `[k, N, C]` (members first) per split, or one `[N, C]` file per member.
`--inputs logits` (default) takes unnormalised scores (log-probabilities are fine too);
`--inputs probs` takes probabilities, checked to be non-negative rows summing to 1 and turned
into log-probabilities. The mix-up is the most common mistake with calibration tools, so
logits that look like probabilities are reported (a warning, kept with the metrics), and
"probabilities" that are not are refused with a hint. Arrays are read with
`allow_pickle=False`: object arrays, which would run pickled code, are refused.
"""

from pathlib import Path

import numpy as np
import torch

from ..data.arrays import read_array, read_npz
from ..checks import check_analysis_size, check_labels, check_predictions
from ..errors import EnsdiagError
from ..io import distinct_members
from ..predictions import with_pooled_shift

ROW_SUM_TOLERANCE = 1e-3  # |Σ_c p_c − 1| allowed per row (float32 softmax outputs, rounding in files)
INPUTS = ("logits", "probs")


# A choice a question does not have (questions with fewer choices than the most any has): a finite
# logit so far below any score that its probability is exactly 0 in float32 and float64, and
# stays so after temperature scaling (T ≥ 0.02); finite, so that predictions files (which refuse
# non-finite logits) keep it and 0·(log 0 − log 0) in KL terms is 0, not NaN (docs/conventions.md).
PAD_LOGIT = -1e30

def _native(array: np.ndarray) -> np.ndarray:
    """Native byte order, and float64 for the floats torch has no type for (long double)."""
    if array.dtype.kind == "f" and array.dtype.itemsize > 8:
        return array.astype(np.float64)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _scores(array: np.ndarray, where: str) -> torch.Tensor:
    if array.dtype.kind not in "fiu" or array.dtype.kind == "b":
        raise EnsdiagError(f"{where} must hold numbers, got dtype {array.dtype}")
    if array.ndim != 3:
        hint = " (one [N, C] file per member: pass them all)" if array.ndim == 2 else ""
        raise EnsdiagError(f"{where} must be [k, N, C] (members first), got shape {list(array.shape)}{hint}")
    if array.shape[0] < 1 or array.shape[2] < 2:
        raise EnsdiagError(f"{where} needs at least one member and two classes, got shape {list(array.shape)}")
    if array.shape[1] == 0:
        raise EnsdiagError(f"{where} holds no examples (shape {list(array.shape)})")
    check_analysis_size(*array.shape, where)  # before the float copy is allocated
    return torch.from_numpy(np.ascontiguousarray(_native(array))).float()  # the rest: check_predictions


def _labels(array: np.ndarray, n: int, num_classes: int, where: str) -> torch.Tensor:
    if array.dtype.kind not in "iu":
        raise EnsdiagError(f"{where} must be integer class indices, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and array.size and int(array.max()) >= 2**63:
        raise EnsdiagError(f"{where} out of range 0..{num_classes - 1} (found {int(array.max())})")
    return check_labels(torch.from_numpy(np.ascontiguousarray(_native(array).astype(np.int64))), n, num_classes, where)


def as_logits(scores: torch.Tensor, inputs: str, where: str, warnings: list[str]) -> torch.Tensor:
    """Scores as logits: probabilities are checked and turned into log-probabilities; logits that
    look like probabilities add a warning."""
    if inputs not in INPUTS:
        raise EnsdiagError(f"--inputs must be logits or probs, got {inputs!r}")
    looks_like_probs = bool((scores >= 0).all()) and bool(((scores.double().sum(-1) - 1).abs() <= ROW_SUM_TOLERANCE).all())
    if inputs == "logits":
        if looks_like_probs:
            warnings.append(f"{where}: every row is non-negative and sums to 1, so these look like probabilities; "
                            "read as logits they are squashed towards uniform (pass --inputs probs if they are)")
        return scores
    if not looks_like_probs:
        hint = " (they have negative values: they look like logits; pass --inputs logits)" if bool((scores < 0).any()) else ""
        raise EnsdiagError(f"{where} are not probabilities: rows must be non-negative and sum to 1 "
                           f"(±{ROW_SUM_TOLERANCE:g}){hint}")
    return scores.clamp_min(torch.finfo(torch.float32).tiny).log()


def load_array_predictions(sources, labels=None, ood=(), inputs="logits") -> tuple[dict[str, dict], list[str]]:
    """({split: {"logits", "labels"}}, warnings) from .npy / .npz files.

    `sources`: one .npz (splits by key), one .npy [k, N, C], or several .npy [N, C] (one per
    member) for the `id` split; `labels`: a .npy of N integers; `ood`: .npy file(s) like
    `sources`, unlabelled."""
    sources, warnings = [Path(s) for s in sources], []
    if len(sources) == 1 and sources[0].suffix == ".npz":
        if labels is not None or ood:
            raise EnsdiagError("an .npz file carries its own labels and splits; drop --labels and --ood")
        return _from_npz(sources[0], inputs, warnings), warnings
    splits = {"id": {"logits": _members(sources, inputs, warnings), "labels": None}}
    if labels is not None:
        logits = splits["id"]["logits"]
        splits["id"]["labels"] = _labels(read_array(labels), logits.shape[1], logits.shape[2], f"labels {labels}")
    if ood:
        splits["ood"] = {"logits": _members([Path(p) for p in ood], inputs, warnings), "labels": None}
    return check_predictions(splits, "these files"), warnings


def _members(paths, inputs, warnings) -> torch.Tensor:
    distinct_members(paths, "member's predictions file")
    for path in paths:
        if path.suffix != ".npy":
            raise EnsdiagError(f"{path}: expected .npy arrays here (or a single .npz, or a .safetensors file)")
    arrays = [read_array(path) for path in paths]
    if len(arrays) > 1:  # one [N, C] file per member
        shapes = {array.shape for array in arrays}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise EnsdiagError(f"one file per member needs [N, C] arrays of one shape, got "
                               f"{', '.join(f'{p.name} {list(a.shape)}' for p, a in zip(paths, arrays))}"[:300])
        array, where = np.stack(arrays), f"{paths[0]} … ({len(paths)} members)"
    else:
        array, where = arrays[0], str(paths[0])
    return as_logits(_scores(array, where), inputs, where, warnings)


def _from_npz(path, inputs, warnings) -> dict[str, dict]:
    arrays = read_npz(path)
    flat = {"logits", "probs", "labels"}
    if set(arrays) <= flat:  # the simplest layout: one labelled split
        arrays = {f"id/{key}": value for key, value in arrays.items()}
    splits: dict[str, dict] = {}
    for key, array in arrays.items():
        name, _, kind = key.rpartition("/")
        if kind not in flat or not name:
            raise EnsdiagError(f"{path}: unexpected array {key!r}; expected '<split>/logits' (or probs) and "
                               "'<split>/labels', or just 'logits' and 'labels'")
        splits.setdefault(name, {})[kind] = array
    result = {}
    for name, arrays_of_split in splits.items():
        if "logits" in arrays_of_split and "probs" in arrays_of_split:
            raise EnsdiagError(f"{path}: split {name!r} has both logits and probs; keep one")
        kind = "probs" if "probs" in arrays_of_split else "logits"
        if kind not in arrays_of_split:
            raise EnsdiagError(f"{path}: split {name!r} has labels but no logits")
        where = f"{path}: {name}/{kind}"  # an array named probs says what it holds, whatever --inputs says
        logits = as_logits(_scores(arrays_of_split[kind], where), "probs" if kind == "probs" else inputs, where, warnings)
        labels = None
        if "labels" in arrays_of_split:
            labels = _labels(arrays_of_split["labels"], logits.shape[1], logits.shape[2], f"{path}: {name}/labels")
        result[name] = {"logits": logits, "labels": labels}
    return with_pooled_shift(check_predictions(result, str(path)))  # OOD labels dropped there
