"""The one place predictions are checked before any analyzer reads them, whatever made them
(ensdiag's prediction loop, a predictions file, NumPy arrays, JSON lines, lm-eval logs) — as
scikit-learn's `check_array` is for arrays.

    predictions = check_predictions({"id": {"logits": logits, "labels": labels}}, where="model.npz")

Predictions map split names to {"logits": float [k, N, C], "labels": int [N] | None}. Checked:
shapes and dtypes, finite logits, integer labels in 0..C−1, the same k and C in every split,
at least one example in the in-distribution split, and what the analysis will hold in memory
against the budget (budget.py). OOD splits lose their labels (they name classes the model never
learned). Returns the predictions as the analyzers read them: float32 logits, int64 labels.
"""

import torch

from .layout import is_ood_split
from .budget import require
from .errors import EnsdiagError, InputTypeError

MAX_MEMBERS = 4096  # every pair is compared: k×k matrices per split stay small
# What the predictions analyzers hold at once, in bytes per logit of a [k, N, C] split: the
# float32 logits, float64 probabilities and log-probabilities, and a float64 working copy.
ANALYSIS_BYTES_PER_LOGIT = 4 + 3 * 8


def check_analysis_size(k: int, n: int, c: int, where: str):
    """Refuse, before anything is allocated, predictions whose analysis would not fit: more
    members than ensdiag compares, or more memory than the budget."""
    if k > MAX_MEMBERS:
        raise EnsdiagError(f"{where}: {k:,} members; ensdiag compares every pair and takes at most {MAX_MEMBERS:,}")
    require(k * n * c * ANALYSIS_BYTES_PER_LOGIT, f"{where}: analysing [k={k:,}, N={n:,}, C={c:,}] predictions")


def check_labels(labels, n: int, num_classes: int, where: str) -> torch.Tensor:
    """Integer labels [n] in 0..num_classes−1 as int64 (whole-number floats are refused too: a
    float label is usually a mix-up with scores, and truncating it would hide that)."""
    if not isinstance(labels, torch.Tensor):
        raise InputTypeError(f"{where}: labels must be a tensor, got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise InputTypeError(f"{where}: labels must be integers (class indices), got {labels.dtype}; "
                             "pass y.long() if they are whole numbers")
    if labels.dim() != 1 or labels.shape[0] != n:
        raise EnsdiagError(f"{where}: labels must be [N={n}], got {tuple(labels.shape)}")
    if n and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise EnsdiagError(f"{where}: labels out of range 0..{num_classes - 1} for {num_classes} classes "
                           f"(found {int(labels.min())}..{int(labels.max())})")
    return labels.long()


def check_predictions(predictions: dict, where: str = "predictions", need_id: bool = False) -> dict:
    """The predictions, checked (module docstring), with float32 logits and int64 labels."""
    if not isinstance(predictions, dict) or not predictions:
        raise EnsdiagError(f"{where}: no splits")
    checked, members, classes = {}, None, None
    for name, split in predictions.items():
        at = f"{where}: split {name!r}"
        logits = split.get("logits") if isinstance(split, dict) else None
        if not isinstance(logits, torch.Tensor):
            raise InputTypeError(f"{at} has no logits tensor")
        if logits.dim() != 3 or not logits.is_floating_point():
            raise EnsdiagError(f"{at}: logits must be float [k, N, C], got {logits.dtype} {tuple(logits.shape)}")
        k, n, c = logits.shape
        if k < 1 or c < 1:
            raise EnsdiagError(f"{at}: logits of shape {tuple(logits.shape)} have no members or no classes")
        check_analysis_size(k, n, c, at)
        if members is not None and (k, c) != (members, classes):
            raise EnsdiagError(f"{where}: splits disagree on members [{members}, {k}] or classes [{classes}, {c}] "
                               f"(split {name!r})")
        members, classes = k, c
        if not torch.isfinite(logits).all():
            raise EnsdiagError(f"{at}: logits contains NaN or infinite values")
        labels = split.get("labels")
        labelled = labels is not None and not is_ood_split(name)
        checked[name] = {"logits": logits.float(), "labels": check_labels(labels, n, c, at) if labelled else None}
    if need_id and (checked.get("id") is None or checked["id"]["logits"].shape[1] == 0):
        raise EnsdiagError(f"{where}: no in-distribution examples to measure on (empty data)")
    return checked


def test_set_difference(test_sets) -> str | None:
    """What differs between the first of some runs' test sets ((labels [N], number of classes) each) and
    another: their classes, sizes or labels (the first example labelled otherwise); None where they are one
    test set. Runs on different test sets are never compared: `analyze --method` refuses to save one beside
    another (runs.save_result), and a report leaves out every number that pairs them (effective size,
    verdict, BVD) and says why."""
    (labels, classes), *others = test_sets
    for other, other_classes in others:
        if classes != other_classes:
            return f"{classes} classes against {other_classes}"
        if labels.shape != other.shape:
            return f"{labels.numel():,} examples against {other.numel():,}"
        if not torch.equal(labels.long(), other.long()):
            index = int((labels.long() != other.long()).nonzero()[0])
            return f"other labels: example {index} is class {int(labels[index])} against {int(other[index])}"
    return None
