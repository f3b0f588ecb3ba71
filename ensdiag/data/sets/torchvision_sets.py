"""MNIST, FashionMNIST, CIFAR-10 and SVHN in torchvision's layouts.

Layouts (torchvision's): `ROOT/MNIST/raw/`, `ROOT/FashionMNIST/raw/` (IDX files, plain or
.gz), `ROOT/cifar-10-batches-py/`, `ROOT/test_32x32.mat`. FashionMNIST is also found in
Debian's `/usr/share/datasets/fashion-mnist/` (package dataset-fashion-mnist).

IDX files (MNIST, FashionMNIST) are read by ensdiag after their structure (magic numbers and
sizes) is checked; SVHN is parsed by torchvision's class after ensdiag has checked its arrays; a
bad file gives one clear error naming it. CIFAR-10's pickles are read by ensdiag itself through a
restricted unpickler (`safe_pickle`): torchvision's class uses the standard one, which runs
whatever code a crafted `data_batch_*` or `batches.meta` names. torchvision checks MD5 sums
of the official files; ensdiag reads existing files by structure instead (so subsets and
test fixtures work) and leaves MD5 checks to `--download`, which uses torchvision's own
verified download.
"""

import gzip
import struct
from pathlib import Path

import numpy as np

from ...errors import DataNotFound, EnsdiagError
from .. import safe_pickle
from ..registry import Dataset, Split, register_dataset

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 2051, 2049


def _torchvision(what, folder, call, download=False):
    """`call()`, torchvision's reading or its verified download, failing in one line; a failed download (no
    network, a mirror down) is missing data, so an optional shift or OOD set is skipped with the reason
    instead of stopping a run."""
    try:
        return call()
    except Exception as error:  # torchvision reports bad files with asserts and RuntimeErrors
        if download:
            raise DataNotFound(f"{what}: --download failed into {folder} ({type(error).__name__}: {error})") from None
        raise EnsdiagError(f"{what}: torchvision could not read {folder} ({type(error).__name__}: {error})") from None


# ---------------------------------------------------------------------------- IDX (MNIST family)

def read_idx(path: Path, magic: int) -> np.ndarray:
    """An IDX file's uint8 array (torchvision's MNIST reader reads the same), its header and length checked."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise EnsdiagError(f"{path}: cannot read ({error})") from None
    kind = "images" if magic == IDX_IMAGES_MAGIC else "labels"
    if len(data) < 8 or struct.unpack(">i", data[:4])[0] != magic:
        found = struct.unpack(">i", data[:4])[0] if len(data) >= 4 else "nothing"
        raise EnsdiagError(f"{path}: not an IDX {kind} file (magic number {found}, expected {magic})")
    dims = 3 if magic == IDX_IMAGES_MAGIC else 1
    header = 4 + 4 * dims
    shape = struct.unpack(f">{dims}i", data[4:header])
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise EnsdiagError(f"{path}: IDX {kind} header says shape {shape} ({expected} bytes) but the file has {len(data)}")
    return np.frombuffer(bytearray(data), np.uint8, offset=header).reshape(shape)


class _IdxDataset(Dataset):
    folder = "MNIST"  # torchvision's class name and folder
    torchvision_class = "MNIST"  # torchvision.datasets' class, imported to download (not to list it)
    extra_locations: tuple[Path, ...] = ()

    @staticmethod
    def _stems(split):
        prefix = "train" if split == "train" else "t10k"
        return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"

    def _find(self, data_dir, split):
        """(folder, [image file, label file]) where both exist, plain or .gz."""
        for folder in [Path(data_dir) / self.folder / "raw", *self.extra_locations]:
            for suffix in ("", ".gz"):
                files = [folder / (stem + suffix) for stem in self._stems(split)]
                if all(f.is_file() for f in files):
                    return folder, files
        return None, None

    def expected_files(self, data_dir):
        return [Path(data_dir) / self.folder / "raw" / stem for split in ("train", "test") for stem in self._stems(split)]

    def locate(self, data_dir):
        found = [self._find(data_dir, split)[0] for split in ("train", "test")]
        return found[0] if all(found) else None

    def load(self, data_dir, split="test", download=False):
        import torch
        data_dir = Path(data_dir)
        if download:
            _torchvision(self.title, data_dir, lambda: _reader(self.torchvision_class)(
                str(data_dir), train=split == "train", download=True), True)
        found = {part: self._find(data_dir, part) for part in ("train", "test")}
        folder, files = found[split]
        if folder is None or found["train" if split == "test" else "test"][0] is None:
            raise self.missing(data_dir)  # a set is its four files, as torchvision's class takes it
        images, labels = read_idx(files[0], IDX_IMAGES_MAGIC), read_idx(files[1], IDX_LABELS_MAGIC)
        if len(images) != len(labels):
            raise EnsdiagError(f"{folder}: {len(images)} images in {files[0].name} but {len(labels)} labels in {files[1].name}")
        return Split(torch.from_numpy(images).unsqueeze(1).contiguous(), torch.from_numpy(labels).long(),
                     f"{self.title} {split} ({folder})")


@register_dataset
class MNIST(_IdxDataset):
    order = 10  # where `ensdiag datasets` lists it
    name, role, title = "mnist", "ID", "MNIST"
    how_to_get = "Put the four IDX files (plain or .gz) in DATA_DIR/MNIST/raw/, or pass --download where a network exists."


@register_dataset
class FashionMNIST(_IdxDataset):
    order = 11  # where `ensdiag datasets` lists it
    name, role, title = "fashion-mnist", "OOD for MNIST", "FashionMNIST"
    folder, torchvision_class = "FashionMNIST", "FashionMNIST"
    how_to_get = ("Put the four IDX files in DATA_DIR/FashionMNIST/raw/, install Debian's package "
                  "dataset-fashion-mnist, or pass --download where a network exists.")

    @property
    def extra_locations(self):
        return (DEBIAN_FASHION_MNIST,)


# ---------------------------------------------------------------------------- CIFAR-10

CIFAR10_REFUSED = "CIFAR-10 batches hold only arrays, lists and strings"


@register_dataset
class CIFAR10(Dataset):
    """Read by ensdiag itself through a restricted unpickler, never torchvision's class:
    that one unpickles the folder's files with the standard unpickler (code execution)."""
    order = 12  # where `ensdiag datasets` lists it

    name, role, title = "cifar10", "ID", "CIFAR-10"
    how_to_get = "Unpack cifar-10-python.tar.gz into DATA_DIR (giving DATA_DIR/cifar-10-batches-py/), or pass --download."

    def expected_files(self, data_dir):
        folder = Path(data_dir) / "cifar-10-batches-py"
        return [folder / name for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]]

    @staticmethod
    def _read_batch(path):
        """(images uint8 [N, 3, 32, 32], labels int64 [N]) of one batch, checked."""
        import torch
        entry = safe_pickle.load(path, CIFAR10_REFUSED)
        if not isinstance(entry, dict) or "data" not in entry or "labels" not in entry:
            keys = ", ".join(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
            raise EnsdiagError(f"{path}: not a CIFAR-10 batch (expected a dict with 'data' and 'labels', got {keys or 'an empty dict'})")
        data, labels = entry["data"], entry["labels"]
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
            raise EnsdiagError(f"{path}: 'data' must be uint8 of shape (N, 3072), got {got}")
        if isinstance(labels, np.ndarray) and labels.ndim != 1:
            raise EnsdiagError(f"{path}: 'labels' must be a list of integers, got an array of shape {labels.shape}")
        if not isinstance(labels, (list, tuple, np.ndarray)) or not all(
                isinstance(label, (int, np.integer)) and not isinstance(label, bool) for label in labels):
            raise EnsdiagError(f"{path}: 'labels' must be a list of integers")
        if len(labels) != len(data):
            raise EnsdiagError(f"{path}: {len(data)} images but {len(labels)} labels")
        labels = torch.tensor([int(label) for label in labels], dtype=torch.int64)
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) <= 9:
            raise EnsdiagError(f"{path}: labels must lie in 0..9, found {int(labels.min())}..{int(labels.max())}")
        images = torch.from_numpy(np.array(data, order="C").reshape(-1, 3, 32, 32))  # a writable copy; R, G, B planes -> channels
        return images, labels

    @staticmethod
    def _check_meta(path):
        meta = safe_pickle.load(path, CIFAR10_REFUSED)
        names = meta.get("label_names") if isinstance(meta, dict) else None
        if not isinstance(names, (list, tuple)) or len(names) != 10 or not all(isinstance(n, str) for n in names):
            raise EnsdiagError(f"{path}: not CIFAR-10's batches.meta (expected 'label_names', a list of 10 strings)")

    def load(self, data_dir, split="test", download=False):
        import torch
        data_dir = Path(data_dir)
        if download:  # torchvision downloads, checks MD5s, and unpickles only files that passed them
            _torchvision(self.title, data_dir, lambda: _reader("CIFAR10")(
                str(data_dir), train=split == "train", download=True), True)
        if self.locate(data_dir) is None:
            raise self.missing(data_dir)
        folder = data_dir / "cifar-10-batches-py"
        self._check_meta(folder / "batches.meta")
        names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        batches = [self._read_batch(folder / name) for name in names]
        images = torch.cat([images for images, _ in batches]) if len(batches) > 1 else batches[0][0]
        labels = torch.cat([labels for _, labels in batches])
        return Split(images, labels, f"CIFAR-10 {split} ({folder})")


# ---------------------------------------------------------------------------- SVHN

def _reader(name: str):
    """A torchvision.datasets class, imported only when data is read."""
    import torchvision.datasets as tvd
    return getattr(tvd, name)


def _svhn_by_structure(root, split):
    """torchvision's SVHN reader with the MD5 check left out (structure is checked instead)."""
    import torchvision.datasets as tvd

    class SVHNByStructure(tvd.SVHN):
        split_list = {name: [url, filename, None] for name, (url, filename, _) in tvd.SVHN.split_list.items()}
    return SVHNByStructure(root, split=split)


@register_dataset
class SVHN(Dataset):
    order = 13  # where `ensdiag datasets` lists it
    name, role, title = "svhn", "OOD for CIFAR-10", "SVHN"
    how_to_get = "Put test_32x32.mat (SVHN format 2) in DATA_DIR, or pass --download."

    def expected_files(self, data_dir):
        return [Path(data_dir) / "test_32x32.mat"]

    def load(self, data_dir, split="test", download=False):
        import torch
        data_dir = Path(data_dir)
        if download:
            _torchvision(self.title, data_dir, lambda: _reader("SVHN")(str(data_dir), split=split, download=True), True)
        path = data_dir / f"{split}_32x32.mat"
        if not path.is_file():
            raise self.missing(data_dir)
        self._check(path)
        dataset = _torchvision(self.title, path, lambda: _svhn_by_structure(str(data_dir), split))
        if len(dataset.labels) and not 0 <= dataset.labels.min() <= dataset.labels.max() <= 9:
            raise EnsdiagError(f"{path}: labels must lie in 1..10 (10 means digit 0)")
        return Split(torch.from_numpy(np.ascontiguousarray(dataset.data)), torch.from_numpy(dataset.labels).long(), f"SVHN {split} ({path})")

    @staticmethod
    def _check(path):
        import scipy.io as sio
        try:
            variables = {name: (shape, kind) for name, shape, kind in sio.whosmat(str(path))}
        except Exception as error:
            raise EnsdiagError(f"{path}: not a MATLAB .mat file ({type(error).__name__}: {error})") from None
        if "X" not in variables or "y" not in variables:
            raise EnsdiagError(f"{path}: expected variables X and y, found {', '.join(variables) or 'none'}")
        (x_shape, x_kind), (y_shape, _) = variables["X"], variables["y"]
        if x_kind != "uint8" or len(x_shape) != 4 or tuple(x_shape[:3]) != (32, 32, 3):
            raise EnsdiagError(f"{path}: X must be uint8 of shape (32, 32, 3, N), got {x_kind} {x_shape}")
        if int(np.prod(y_shape)) != x_shape[3]:
            raise EnsdiagError(f"{path}: {x_shape[3]} images but {int(np.prod(y_shape))} labels")
