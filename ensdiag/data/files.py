"""Your own data for `evaluate`, `diversity` (`--data`) and any preset's `--ood` / `--shift`.

Three forms, told apart by the path:
- a folder of class folders (torchvision's `ImageFolder`: `root/<class>/<image>`, classes in
  sorted order are labels 0, 1, …), decoded by Pillow, resized to the model's input size;
- an `.npz` with `images` (or `x`) and optionally `labels` (or `y`);
- an `.npy` of images (unlabelled: an OOD or shift set).

Images are [N, C, H, W] or [N, H, W] (one channel), uint8 0..255 or float in [0, 1]; an array
[N, H, W, C] with C in (1, 3) and H, W not is read channels-last and says so. Normalisation is
the caller's (`--normalize`, or the preset's): the preprocessing is stated in the split's title
and recorded with the results. Arrays are read without pickles, their headers checked against
the file sizes before anything is allocated; an image folder is walked as untrusted
(image_folder.py).
"""

from pathlib import Path

import numpy as np
import torch

from ..errors import EnsdiagError
from .arrays import read_array, read_npz
from .image_folder import read_image_folder
from .registry import Split


def load_files(path, input_shape, what: str = "--data", exact: bool = True) -> Split:
    """The images (and labels) at `path` as a `Split`, checked against the model's input shape
    (`exact=False`: arrays of another size are the caller's to check; image folders are resized)."""
    path = Path(path)
    if not path.exists():
        raise EnsdiagError(f"{what} {path} does not exist")
    if path.is_dir():
        split, how = Split(*read_image_folder(path, input_shape, what)), f"image folder, resized to {input_shape[1]}×{input_shape[2]}"
    elif path.suffix == ".npz":
        arrays, how = read_npz(path), ".npz"
        image_key = next((key for key in ("images", "x") if key in arrays), None)
        if image_key is None:
            raise EnsdiagError(f"{what} {path}: no 'images' (or 'x') array; it holds "
                               f"{', '.join(sorted(arrays)) or 'nothing'}")
        images = _images(arrays[image_key], f"{what} {path}")
        label_key = next((key for key in ("labels", "y") if key in arrays), None)
        split = Split(images, None if label_key is None else _labels(arrays[label_key], len(images), f"{what} {path}"))
    elif path.suffix == ".npy":
        split, how = Split(_images(read_array(path), f"{what} {path}"), None), ".npy"
    else:
        raise EnsdiagError(f"{what} {path}: give an image folder (one folder per class), an .npz or an .npy")
    images = split.images
    if images.shape[-3] != input_shape[0] and images.dim() == 4 and images.shape[-1] == input_shape[0] \
            and images.shape[1] not in (1, 3):
        images, how = images.permute(0, 3, 1, 2).contiguous(), how + ", read channels-last"
    if tuple(images.shape[1:]) != tuple(input_shape) and (exact or images.shape[1] != input_shape[0]):
        raise EnsdiagError(f"{what} {path}: images of shape {tuple(images.shape[1:])}, the model takes {tuple(input_shape)}")
    labelled = "" if split.labels is None else f", {int(split.labels.max()) + 1 if len(split.labels) else 0} classes"
    return Split(images, split.labels, f"{path} ({len(images)} images, {how}{labelled})")


def _images(array: np.ndarray, where: str) -> torch.Tensor:
    if array.dtype.kind not in "fu" or (array.dtype.kind == "u" and array.dtype.itemsize != 1):
        raise EnsdiagError(f"{where}: images must be uint8 (0..255) or float (0..1), got {array.dtype}")
    if array.ndim == 3:
        array = array[:, None]
    if array.ndim != 4 or 0 in array.shape[1:]:
        raise EnsdiagError(f"{where}: images must be [N, C, H, W] or [N, H, W], got shape {list(array.shape)}")
    if len(array) == 0:
        raise EnsdiagError(f"{where} holds no images (N = 0): there is nothing to measure")
    tensor = torch.from_numpy(np.ascontiguousarray(array if array.dtype.kind == "u" else array.astype(np.float32)))
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        raise EnsdiagError(f"{where}: images hold NaN or infinite values")
    return tensor


def _labels(array: np.ndarray, n: int, where: str) -> torch.Tensor:
    if array.dtype.kind not in "iu" or array.ndim != 1 or len(array) != n:
        raise EnsdiagError(f"{where}: labels must be {n} integers [N], got {array.dtype} of shape {list(array.shape)}")
    if len(array) and (array.min() < 0 or array.max() >= 2**31):
        raise EnsdiagError(f"{where}: labels must be class indices 0..C−1")
    return torch.from_numpy(array.astype(np.int64))
