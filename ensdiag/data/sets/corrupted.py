"""CIFAR-10-C and MNIST-C: the corrupted test sets, read from their distributed `.npy` files.

CIFAR-10-C: `ROOT/CIFAR-10-C/<corruption>.npy`, uint8 (50000, 32, 32, 3): five blocks of
10,000 images for severities 1..5, each block in test-set order; `labels.npy` (50000,).
MNIST-C: `ROOT/mnist_c/<corruption>/test_{images,labels}.npy`, uint8 (N, 28, 28, 1); no
severities. Both load as {corruption: Split}; the caller pools them if it wants.
"""

from pathlib import Path

import numpy as np

from ...errors import EnsdiagError
from ..registry import Dataset, Split, register_dataset

CIFAR10_C_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
    "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
    "jpeg_compression",
    # the four extra corruptions distributed alongside the 15 standard ones
    "speckle_noise", "gaussian_blur", "spatter", "saturate",
)
MNIST_C_CORRUPTIONS = (
    "shot_noise", "impulse_noise", "glass_blur", "motion_blur", "shear", "scale", "rotate",
    "brightness", "translate", "stripe", "fog", "spatter", "dotted_line", "zigzag", "canny_edges",
)


def load_npy(path: Path, dtype=None, shape_tail=None, what="array") -> np.ndarray:
    """np.load, memory-mapped, with one clear error for anything unexpected."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise EnsdiagError(f"{path} does not exist") from None
    except (OSError, ValueError) as error:
        raise EnsdiagError(f"{path}: not a readable .npy file ({error})") from None
    if dtype == "integer":
        if not np.issubdtype(array.dtype, np.integer) or array.ndim != 1:
            raise EnsdiagError(f"{path}: {what} must be a 1-D integer array, got {array.dtype} {array.shape}")
    elif dtype is not None and (array.dtype != dtype or array.shape[1:] != shape_tail):
        expected = f"{np.dtype(dtype)} (N, {', '.join(map(str, shape_tail))})"
        raise EnsdiagError(f"{path}: {what} must be {expected}, got {array.dtype} {array.shape}")
    return array


def _images_to_split(images: np.ndarray, labels: np.ndarray, source: str, num_classes=10) -> Split:
    import torch
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise EnsdiagError(f"{source}: labels must lie in 0..{num_classes - 1}, got {labels.min()}..{labels.max()}")
    chw = torch.from_numpy(np.array(images)).permute(0, 3, 1, 2).contiguous()  # copy out of the memory map
    return Split(chw, torch.from_numpy(np.array(labels, dtype=np.int64)), source)


def _choose(corruptions, known, title):
    chosen = list(known) if corruptions is None else list(corruptions)
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise EnsdiagError(f"unknown {title} corruption(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return chosen


@register_dataset
class CIFAR10C(Dataset):
    order = 20  # where `ensdiag datasets` lists it
    name, role, title = "cifar10-c", "shift for CIFAR-10", "CIFAR-10-C"
    how_to_get = "Unpack CIFAR-10-C.tar into DATA_DIR (giving DATA_DIR/CIFAR-10-C/*.npy); it has no torchvision class and no --download."
    parts = CIFAR10_C_CORRUPTIONS

    def present_parts(self, data_dir):
        return [c for c in self.parts if (Path(data_dir) / "CIFAR-10-C" / f"{c}.npy").is_file()]

    def expected_files(self, data_dir):
        folder = Path(data_dir) / "CIFAR-10-C"
        return [folder / "labels.npy", *(folder / f"{c}.npy" for c in CIFAR10_C_CORRUPTIONS)]

    def locate(self, data_dir):
        """Found when labels.npy and at least one corruption file exist."""
        files = self.expected_files(data_dir)
        return files[0].parent if files[0].is_file() and any(f.is_file() for f in files[1:]) else None

    def load(self, data_dir, split="test", download=False, corruptions=None, severity=5):
        """{corruption: Split} for every chosen corruption whose file exists (missing ones skipped)."""
        if severity not in range(1, 6):
            raise EnsdiagError(f"CIFAR-10-C severity must be 1..5, got {severity}")
        folder = Path(data_dir) / "CIFAR-10-C"
        chosen = _choose(corruptions, CIFAR10_C_CORRUPTIONS, self.title)
        present = [c for c in chosen if (folder / f"{c}.npy").is_file()]
        if not (folder / "labels.npy").is_file() or not present:
            raise self.missing(data_dir)
        labels = load_npy(folder / "labels.npy", "integer", what="labels")
        if len(labels) == 0 or len(labels) % 5:
            raise EnsdiagError(f"{folder / 'labels.npy'}: expected 5 equal severity blocks (50000 rows), got {len(labels)}")
        block = len(labels) // 5  # 10,000 in the distributed files
        rows = slice((severity - 1) * block, severity * block)
        splits = {}
        for corruption in present:
            path = folder / f"{corruption}.npy"
            images = load_npy(path, np.uint8, (32, 32, 3), "images")
            if len(images) != len(labels):
                raise EnsdiagError(f"{path}: expected {len(labels)} images (5 severities x {block}, "
                                   f"as labels.npy), got {len(images)}")
            splits[corruption] = _images_to_split(images[rows], labels[rows], f"CIFAR-10-C {corruption} severity {severity}")
        return splits


@register_dataset
class MNISTC(Dataset):
    order = 21  # where `ensdiag datasets` lists it
    name, role, title = "mnist-c", "shift for MNIST", "MNIST-C"
    how_to_get = "Unzip mnist_c.zip into DATA_DIR (giving DATA_DIR/mnist_c/<corruption>/test_images.npy); no --download."
    parts = MNIST_C_CORRUPTIONS

    def present_parts(self, data_dir):
        return [c for c in self.parts if (Path(data_dir) / "mnist_c" / c / "test_images.npy").is_file()]

    def expected_files(self, data_dir):
        folder = Path(data_dir) / "mnist_c"
        return [folder / c / f"test_{part}.npy" for c in MNIST_C_CORRUPTIONS for part in ("images", "labels")]

    def locate(self, data_dir):
        files = self.expected_files(data_dir)
        return files[0].parent.parent if any(f.is_file() for f in files) else None

    def load(self, data_dir, split="test", download=False, corruptions=None):
        folder = Path(data_dir) / "mnist_c"
        chosen = _choose(corruptions, MNIST_C_CORRUPTIONS, self.title)
        present = [c for c in chosen if (folder / c / f"{split}_images.npy").is_file()]
        if not present:
            raise self.missing(data_dir)
        splits = {}
        for corruption in present:
            images = load_npy(folder / corruption / f"{split}_images.npy", np.uint8, (28, 28, 1), "images")
            labels = load_npy(folder / corruption / f"{split}_labels.npy", "integer", what="labels")
            splits[corruption] = _images_to_split(images, labels, f"MNIST-C {corruption} ({folder / corruption})")
        return splits
