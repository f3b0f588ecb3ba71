"""Loaders read tiny files written in each dataset's real distributed format, exactly."""

import pickle
import re

import numpy as np
import pytest
import torch

from ensdiag.data import all_datasets, get_dataset
from ensdiag.data.sets import torchvision_sets
from ensdiag.errors import EnsdiagError

from .cli import assert_one_line_error
from .formats import (CreatesFile, repickle_cifar10_layout, write_cifar10_c, write_cifar10_layout, write_idx,
                      write_mnist_c, write_mnist_layout, write_svhn)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_idx_files_read_back_exactly(tmp_path, name, folder, gz, monkeypatch):
    monkeypatch.setattr(torchvision_sets, "DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    arrays = write_mnist_layout(tmp_path, folder, gz=gz)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        loaded = get_dataset(name).load(tmp_path, split)
        images, labels = arrays[prefix]
        assert loaded.images.dtype == torch.uint8 and loaded.images.shape == (len(images), 1, 28, 28)
        assert np.array_equal(loaded.images[:, 0].numpy(), images)
        assert loaded.labels.dtype == torch.int64 and np.array_equal(loaded.labels.numpy(), labels)
    assert get_dataset(name).locate(tmp_path) is not None


def test_fashion_mnist_found_in_debian_folder(tmp_path, monkeypatch):
    debian = tmp_path / "usr-share"
    arrays = {}
    for prefix, n in (("train", 3), ("t10k", 2)):
        images = np.full((n, 28, 28), 7, np.uint8)
        labels = np.arange(n, dtype=np.uint8)
        write_idx(debian / f"{prefix}-images-idx3-ubyte", images, gz=True)
        write_idx(debian / f"{prefix}-labels-idx1-ubyte", labels, gz=True)
        arrays[prefix] = images, labels
    monkeypatch.setattr(torchvision_sets, "DEBIAN_FASHION_MNIST", debian)
    loaded = get_dataset("fashion-mnist").load(tmp_path / "empty", "test")
    assert np.array_equal(loaded.labels.numpy(), [0, 1]) and int(loaded.images.max()) == 7
    assert get_dataset("fashion-mnist").locate(tmp_path / "empty") == debian


@pytest.mark.parametrize("break_it,message", [
    (lambda raw: write_idx(raw / "t10k-images-idx3-ubyte", np.zeros((4, 28, 28)), magic=2049), "magic number 2049, expected 2051"),
    (lambda raw: write_idx(raw / "t10k-labels-idx1-ubyte", np.zeros(3)), "4 images .* but 3 labels"),
    (lambda raw: (raw / "t10k-images-idx3-ubyte").write_bytes((raw / "t10k-images-idx3-ubyte").read_bytes()[:-10]), "header says shape"),
    (lambda raw: (raw / "t10k-labels-idx1-ubyte").unlink(), "MNIST not found: missing .*t10k-labels-idx1-ubyte.*--download"),
])
def test_malformed_idx_is_a_clear_error(tmp_path, break_it, message):
    write_mnist_layout(tmp_path)
    break_it(tmp_path / "MNIST" / "raw")
    with pytest.raises(EnsdiagError, match=message):
        get_dataset("mnist").load(tmp_path, "test")


def test_cifar10_pickles_read_back_exactly(tmp_path):
    arrays = write_cifar10_layout(tmp_path)
    test = get_dataset("cifar10").load(tmp_path, "test")
    data, labels = arrays["test_batch"]
    assert test.images.shape == (3, 3, 32, 32) and test.images.dtype == torch.uint8
    assert np.array_equal(test.images.numpy(), data)  # R, G, B planes -> channels
    assert np.array_equal(test.labels.numpy(), labels)
    train = get_dataset("cifar10").load(tmp_path, "train")
    expected = np.concatenate([arrays[f"data_batch_{i}"][0] for i in range(1, 6)])
    assert np.array_equal(train.images.numpy(), expected)


def test_cifar10_bad_batch_is_a_clear_error(tmp_path):
    write_cifar10_layout(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as handle:
        pickle.dump({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, handle)
    with pytest.raises(EnsdiagError, match=r"test_batch: 'data' must be uint8 of shape \(N, 3072\)"):
        get_dataset("cifar10").load(tmp_path, "test")
    (tmp_path / "cifar-10-batches-py" / "batches.meta").unlink()
    with pytest.raises(EnsdiagError, match="CIFAR-10 not found: missing .*batches.meta"):
        get_dataset("cifar10").load(tmp_path, "test")



def _plant(tmp_path, name):
    """A CIFAR-10 folder whose NAME, unpickled by the standard unpickler, creates a marker file."""
    write_cifar10_layout(tmp_path / "data")
    marker = tmp_path / "marker"
    content = ({"label_names": CreatesFile(marker)} if name == "batches.meta"
               else {"data": CreatesFile(marker), "labels": [0, 1, 2]})
    path = tmp_path / "data" / "cifar-10-batches-py" / name
    path.write_bytes(pickle.dumps(content, protocol=2))
    return path, marker


@pytest.mark.parametrize("name,split", [("data_batch_1", "train"), ("test_batch", "test"),
                                        ("batches.meta", "train"), ("batches.meta", "test")])
def test_cifar10_pickles_that_would_run_code_are_refused(tmp_path, name, split):
    path, marker = _plant(tmp_path, name)
    with pytest.raises(EnsdiagError) as error:
        get_dataset("cifar10").load(tmp_path / "data", split)
    assert not marker.exists(), f"unpickling {name} ran its code"
    assert re.fullmatch(rf"{path}: refused to unpickle (posix|os|nt)\.system: CIFAR-10 batches hold only arrays, lists "
                        r"and strings", str(error.value)), str(error.value)
    with open(path, "rb") as handle:  # the payload is live: the standard unpickler runs it
        pickle.load(handle)
    assert marker.exists()


def test_cli_train_on_a_crafted_cifar10_folder_is_one_line_and_runs_nothing(tmp_path, capsys):
    _, marker = _plant(tmp_path, "data_batch_1")
    from .cli import run_cli
    code, _, err = run_cli(capsys, "train", "--quiet", "--preset", "cifar10", "--method", "single", "--seeds", "1",
                           "--epochs", "1", "--data-dir", tmp_path / "data", "--out", tmp_path / "runs")
    assert code == 2 and "Traceback" not in err
    assert not marker.exists()
    assert_one_line_error(capsys, "train", "--quiet", "--preset", "cifar10", "--method", "single", "--seeds", "1",
                          "--epochs", "1", "--data-dir", tmp_path / "data", "--out", tmp_path / "runs",
                          match=r"data_batch_1: refused to unpickle (posix|os|nt)\.system")
    assert not marker.exists()


@pytest.mark.parametrize("damage,message", [
    (lambda data: data[: len(data) // 2], "not a (complete|readable) pickle"),
    (lambda data: data[:5], "not a (complete|readable) pickle"),
    (lambda data: b"", r"not a complete pickle \(empty or truncated\)"),
    (lambda data: b"GIF89a not a pickle at all" * 10, "not a readable pickle"),
], ids=["half", "header-only", "empty", "garbage"])
def test_cifar10_truncated_or_garbage_batch_is_one_line_naming_it(tmp_path, damage, message):
    write_cifar10_layout(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(EnsdiagError, match=rf"{path}: {message}") as error:
        get_dataset("cifar10").load(tmp_path, "test")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("protocol,numpy_core_names", [(0, False), (2, False), (2, True), (4, False), (5, False)],
                         ids=["protocol-0", "protocol-2", "protocol-2-numpy.core", "protocol-4", "protocol-5"])
def test_cifar10_pickles_of_every_protocol_read_back_exactly(tmp_path, protocol, numpy_core_names):
    import warnings
    arrays = write_cifar10_layout(tmp_path)
    repickle_cifar10_layout(tmp_path, protocol, numpy_core_names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy.core.* is mapped to numpy._core.*: no DeprecationWarning
        test = get_dataset("cifar10").load(tmp_path, "test")
        train = get_dataset("cifar10").load(tmp_path, "train")
    assert np.array_equal(test.images.numpy(), arrays["test_batch"][0])
    assert test.labels.dtype == torch.int64 and np.array_equal(test.labels.numpy(), arrays["test_batch"][1])
    assert np.array_equal(train.images.numpy(), np.concatenate([arrays[f"data_batch_{i}"][0] for i in range(1, 6)]))
    assert np.array_equal(train.labels.numpy(), np.concatenate([arrays[f"data_batch_{i}"][1] for i in range(1, 6)]))


@pytest.mark.parametrize("content,message", [
    ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}, r"labels must lie in 0\.\.9"),
    ({"data": np.zeros((2, 3072), np.uint8), "labels": [0]}, "2 images but 1 labels"),
    ({"data": np.zeros((2, 3072), np.uint8), "labels": ["cat", "dog"]}, "'labels' must be a list of integers"),
    ({"data": np.zeros((2, 3072), np.float32), "labels": [0, 1]}, r"'data' must be uint8 of shape \(N, 3072\), got float32"),
    ({"data": np.zeros((2, 3072), object), "labels": [0, 1]}, r"refused to unpickle an array of dtype object \(Python objects\)"),
    ([1, 2, 3], "not a CIFAR-10 batch"),
])
def test_cifar10_batch_contents_are_checked(tmp_path, content, message):
    write_cifar10_layout(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(pickle.dumps(content, protocol=2))
    with pytest.raises(EnsdiagError, match=rf"{path}: {message}"):
        get_dataset("cifar10").load(tmp_path, "test")

def test_svhn_mat_reads_back_with_label_10_as_0(tmp_path):
    x, y = write_svhn(tmp_path, labels=[10, 1, 5, 10, 9])
    loaded = get_dataset("svhn").load(tmp_path)
    assert loaded.labels.tolist() == [0, 1, 5, 0, 9]
    assert np.array_equal(loaded.images.numpy(), x.transpose(3, 2, 0, 1))  # (H,W,C,N) -> (N,C,H,W)


def test_svhn_wrong_shape_is_a_clear_error(tmp_path):
    from scipy.io import savemat
    savemat(str(tmp_path / "test_32x32.mat"), {"X": np.zeros((28, 28, 3, 2), np.uint8), "y": np.ones((2, 1))})
    with pytest.raises(EnsdiagError, match=r"X must be uint8 of shape \(32, 32, 3, N\)"):
        get_dataset("svhn").load(tmp_path)


def test_cifar10_c_severity_blocks_and_subsets(tmp_path):
    arrays, labels = write_cifar10_c(tmp_path, ["fog", "snow"], block=2)
    for severity in (1, 3, 5):
        splits = get_dataset("cifar10-c").load(tmp_path, corruptions=["fog", "snow", "frost"], severity=severity)
        assert list(splits) == ["fog", "snow"]  # frost's file is missing: skipped
        rows = slice((severity - 1) * 2, severity * 2)
        assert np.array_equal(splits["fog"].images.permute(0, 2, 3, 1).numpy(), arrays["fog"][rows])
        assert np.array_equal(splits["snow"].labels.numpy(), labels[rows])
    with pytest.raises(EnsdiagError, match="unknown CIFAR-10-C corruption"):
        get_dataset("cifar10-c").load(tmp_path, corruptions=["rain"])


def test_cifar10_c_mismatched_lengths(tmp_path):
    write_cifar10_c(tmp_path, ["fog"], block=2)
    np.save(tmp_path / "CIFAR-10-C" / "fog.npy", np.zeros((5, 32, 32, 3), np.uint8))
    with pytest.raises(EnsdiagError, match="fog.npy: expected 10 images"):
        get_dataset("cifar10-c").load(tmp_path)
    np.save(tmp_path / "CIFAR-10-C" / "fog.npy", np.zeros((10, 32, 32, 3), np.float32))
    with pytest.raises(EnsdiagError, match="fog.npy: images must be uint8"):
        get_dataset("cifar10-c").load(tmp_path)


def test_mnist_c_reads_each_corruption(tmp_path):
    arrays = write_mnist_c(tmp_path, ["shear", "zigzag"])
    splits = get_dataset("mnist-c").load(tmp_path)
    assert list(splits) == ["shear", "zigzag"]
    images, labels = arrays["zigzag"]
    assert np.array_equal(splits["zigzag"].images.numpy(), images.transpose(0, 3, 1, 2))
    assert np.array_equal(splits["zigzag"].labels.numpy(), labels)
    np.save(tmp_path / "mnist_c" / "shear" / "test_labels.npy", np.array([1.5, 2.5, 3.5]))
    with pytest.raises(EnsdiagError, match="labels must be a 1-D integer array"):
        get_dataset("mnist-c").load(tmp_path)


def test_every_dataset_reports_missing_files_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(torchvision_sets, "DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    for name, dataset in all_datasets().items():
        if dataset.expected_files(tmp_path):
            assert dataset.locate(tmp_path) is None
            with pytest.raises(EnsdiagError, match="not found: missing"):
                dataset.load(tmp_path)


@pytest.mark.skipif(not (torchvision_sets.DEBIAN_FASHION_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_from_debian(tmp_path):
    test = get_dataset("fashion-mnist").load(tmp_path, "test")
    assert test.images.shape == (10_000, 1, 28, 28)
    assert torch.bincount(test.labels).tolist() == [1000] * 10


class _Reduces:
    """Pickles as `function(*args)`: the building block of a crafted file."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


@pytest.mark.parametrize("payload", [
    # ndarray(shape, dtype, buffer, offset, strides): zero strides over one byte, 3 GB of "array"
    lambda: _Reduces(np.ndarray, (10**6, 3072), np.dtype("u1"), b"\0", 0, (0, 0)),
    # _reconstruct without its __setstate__: uninitialised memory of any shape
    lambda: _Reduces(np._core.multiarray._reconstruct, np.ndarray, (10**5, 3072), b"B"),
], ids=["zero-strides", "reconstruct-without-data"])
def test_cifar10_pickles_cannot_conjure_arrays_larger_than_the_file(tmp_path, payload):
    write_cifar10_layout(tmp_path / "data")
    path = tmp_path / "data" / "cifar-10-batches-py" / "test_batch"
    with open(path, "wb") as handle:
        pickle.dump({"data": payload(), "labels": [0] * 3}, handle, protocol=2)
    assert path.stat().st_size < 1000
    with pytest.raises(EnsdiagError, match=rf"{re.escape(str(path))}: refused to unpickle"):
        get_dataset("cifar10").load(tmp_path / "data", "test")


def test_cifar10_labels_that_are_not_a_list_are_refused(tmp_path):
    write_cifar10_layout(tmp_path / "data")
    path = tmp_path / "data" / "cifar-10-batches-py" / "test_batch"
    with open(path, "wb") as handle:
        pickle.dump({"data": np.zeros((3, 3072), np.uint8), "labels": np.array(3)}, handle)
    with pytest.raises(EnsdiagError, match="'labels' must be a list of integers"):
        get_dataset("cifar10").load(tmp_path / "data", "test")


def test_a_damaged_shift_set_fails_loudly_and_only_a_missing_one_is_skipped(tmp_path):
    from ensdiag.config import preset_config
    from ensdiag.data.preset import load_preset_data
    write_cifar10_layout(tmp_path)
    config = preset_config("cifar10")
    data = load_preset_data(config, tmp_path)
    assert set(data.skipped) == {"shift", "ood"} and "not found" in data.skipped["shift"]
    write_cifar10_c(tmp_path, ["fog"])
    (tmp_path / "CIFAR-10-C" / "labels.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(EnsdiagError, match="labels.npy"):
        load_preset_data(config, tmp_path)
