"""Writers for tiny files in the datasets' real distributed formats (test fixtures)."""

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray, magic: int | None = None, gz: bool = False) -> Path:
    array = np.asarray(array, dtype=np.uint8)
    magic = magic if magic is not None else 0x0800 + array.ndim  # 2051 images, 2049 labels
    data = struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape) + array.tobytes()
    path = Path(str(path) + ".gz") if gz else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def write_mnist_layout(root: Path, folder="MNIST", n_train=6, n_test=4, gz=False, seed=0):
    """ROOT/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; returns the arrays."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        write_idx(root / folder / "raw" / f"{prefix}-images-idx3-ubyte", images, gz=gz)
        write_idx(root / folder / "raw" / f"{prefix}-labels-idx1-ubyte", labels, gz=gz)
        arrays[prefix] = (images, labels)
    return arrays


def write_cifar10_layout(root: Path, per_batch=3, seed=0):
    """ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}; returns HWC arrays."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)  # R, G, B planes of 32x32
        labels = rng.integers(0, 10, per_batch).tolist()
        with open(folder / name, "wb") as handle:
            pickle.dump({"batch_label": name, "data": data, "labels": labels, "filenames": []}, handle)
        arrays[name] = (data.reshape(-1, 3, 32, 32), np.array(labels))
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)], "num_vis": 3072}, handle)
    return arrays



class CreatesFile:
    """Unpickling this with the standard unpickler runs `touch MARKER` (a stand-in for any code)."""

    def __init__(self, marker: Path):
        self.marker = Path(marker)

    def __reduce__(self):
        import os
        import shlex
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def repickle_cifar10_layout(root: Path, protocol: int, numpy_core_names: bool = False):
    """Rewrite ROOT/cifar-10-batches-py/* with pickle PROTOCOL (our own fixtures: standard pickle is fine).

    numpy_core_names: spell NumPy's globals `numpy.core.*` as NumPy 1 and Python 2 era files do
    (protocols 0-3 name globals as text, so the bytes can be edited)."""
    for path in sorted((root / "cifar-10-batches-py").iterdir()):
        with open(path, "rb") as handle:
            content = pickle.load(handle)
        data = pickle.dumps(content, protocol=protocol)
        if numpy_core_names:
            assert protocol <= 3
            data = data.replace(b"numpy._core.", b"numpy.core.")
        path.write_bytes(data)

def write_svhn(root: Path, n=5, seed=0, labels=None):
    from scipy.io import savemat
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = np.asarray(labels if labels is not None else rng.integers(1, 11, n), dtype=np.uint8).reshape(n, 1)
    root.mkdir(parents=True, exist_ok=True)
    savemat(str(root / "test_32x32.mat"), {"X": x, "y": y})
    return x, y


def write_cifar10_c(root: Path, corruptions, block=2, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True, exist_ok=True)
    labels = rng.integers(0, 10, 5 * block).astype(np.uint8)
    np.save(folder / "labels.npy", labels)
    arrays = {}
    for name in corruptions:
        arrays[name] = rng.integers(0, 256, (5 * block, 32, 32, 3), dtype=np.uint8)
        np.save(folder / f"{name}.npy", arrays[name])
    return arrays, labels


def write_mnist_c(root: Path, corruptions, n=3, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {}
    for name in corruptions:
        folder = root / "mnist_c" / name
        folder.mkdir(parents=True, exist_ok=True)
        images = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.int64)
        np.save(folder / "test_images.npy", images)
        np.save(folder / "test_labels.npy", labels)
        arrays[name] = (images, labels)
    return arrays
