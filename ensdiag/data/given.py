"""Data handed over from Python, in any of the forms `ensdiag.diagnose` takes, as (inputs,
labels | None) batches: `(x, y)` tensors, an unlabelled tensor `x`, a `Split`, a torch Dataset of
`(x, y)` items, or any iterable of batches (a DataLoader)."""

import torch

from ..errors import EnsdiagError, InputTypeError
from .registry import Split

DATASET_BATCH = 256


BATCH = 1000  # inputs per forward when the data is held in memory (tensors, a Split)


def image_batches(images, labels=None, batch_size: int = BATCH):
    """(inputs, labels) batches of data held in memory (labels None: unlabelled)."""
    for start in range(0, len(images), batch_size):
        yield images[start:start + batch_size], None if labels is None else labels[start:start + batch_size]


def batches(data, name: str):
    """An iterator of (x, y | None) batches from any of the accepted forms; tensors in memory are
    cut into batches of `BATCH`, as ensdiag's own splits are (so MC Dropout's masks, drawn batch
    after batch, are the same whichever way the same images come in)."""
    if isinstance(data, Split):
        return image_batches(data.images, data.labels)
    if isinstance(data, torch.Tensor):
        return image_batches(_inputs(data, name))
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(d, torch.Tensor) for d in data):
        x, y = _inputs(data[0], name), data[1]
        if y.dim() != 1:
            raise EnsdiagError(f"{name}: labels must be one class index per input [N], got shape {tuple(y.shape)}")
        if len(x) != len(y):
            raise EnsdiagError(f"{name}: {len(x)} inputs but {len(y)} labels")
        return image_batches(x, y)
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        data = torch.utils.data.DataLoader(data, batch_size=DATASET_BATCH)
    if not hasattr(data, "__iter__") or isinstance(data, (str, bytes, dict)):
        raise InputTypeError(f"{name}: give (x, y) tensors, a tensor x, a Dataset or an iterable of batches, "
                             f"not {type(data).__name__}")
    return (_batch(item, name) for item in data)


def _inputs(x, name):
    if x.dim() == 0:
        raise InputTypeError(f"{name}: inputs must be a tensor [N, …] of examples, got a single number")
    return x


def _batch(item, name):
    if isinstance(item, torch.Tensor):
        return item, None
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor):
        labels = item[1] if len(item) > 1 and isinstance(item[1], torch.Tensor) else None
        return item[0], labels
    raise InputTypeError(f"{name}: a batch must be a tensor or an (inputs, labels) pair, not {type(item).__name__}")


def first(data, limit: int, name: str):
    """(inputs, labels | None) of at most `limit` examples of the data, or None."""
    xs, ys = [], []
    count = 0
    for x, y in batches(data, name):
        xs.append(x[:limit - count])
        ys.append(None if y is None else y[:limit - count])
        count += len(xs[-1])
        if count >= limit:
            break
    if not xs:
        return None
    return torch.cat(xs), None if any(y is None for y in ys) else torch.cat(ys)
