"""One model, one set of images, the same numbers on every path: training's own evaluation,
`ensdiag evaluate --data`, `ensdiag diversity --data` and `ensdiag.diagnose()` all go through the
inspection core, with the preprocessing the model file records applied by default."""

import json

import numpy as np
import pytest
import torch

import ensdiag
from ensdiag.data.constants import DIGITS_MEAN, DIGITS_STD
from tests.cli import run_cli

QUANTITIES = [("calibration", "splits", "id", "accuracy"), ("calibration", "splits", "id", "nll"),
              ("calibration", "splits", "id", "ece"), ("calibration", "splits", "id", "brier"),
              ("uncertainty", "splits", "id", "jsd"), ("disagreement", "splits", "id", "mean")]


def _value(analyzers, path):
    node = analyzers
    for key in path:
        node = node[key]
    return node["value"]


@pytest.fixture(scope="module")
def test_split():
    from ensdiag.config import preset_config
    from ensdiag.data.preset import load_preset_data
    return load_preset_data(preset_config("digits"), "data", with_train=False).test


def test_training_evaluate_and_diagnose_agree(finished_run, test_split, tmp_path, capsys):
    run = finished_run / "batch-ensemble" / "seed-1"
    trained = json.loads((run / "metrics.json").read_text())["analyzers"]
    np.savez(tmp_path / "test.npz", images=test_split.images.numpy(), labels=test_split.labels.numpy())
    code, out, err = run_cli(capsys, "evaluate", run / "model.safetensors", "--data", tmp_path / "test.npz", "--format", "json")
    assert code == 0, err
    evaluated = json.loads(out)["analyzers"]
    model = ensdiag.load_model(run / "model.safetensors")
    assert model.preprocess is not None  # the model file records how its inputs were normalised
    diagnosed = ensdiag.diagnose(model, test=(test_split.images, test_split.labels),
                                 measure=ensdiag.Measure(geometry=False)).metrics["analyzers"]
    for path in QUANTITIES:
        expected = _value(trained, path)
        assert _value(evaluated, path) == pytest.approx(expected, abs=1e-6), path
        assert _value(diagnosed, path) == pytest.approx(expected, abs=1e-6), path
    # the initial-cosine baseline is on every path
    for found in (trained, evaluated, diagnosed):
        assert found["weight-similarity"]["initial"]["value"] == pytest.approx(trained["weight-similarity"]["initial"]["value"])


def test_diagnose_without_the_recorded_preprocessing_measures_something_else(finished_run, test_split):
    """The default is not a no-op: raw images, un-normalised, give other numbers (so the test above can fail)."""
    model = ensdiag.load_model(finished_run / "batch-ensemble" / "seed-1" / "model.safetensors")
    data = (test_split.images, test_split.labels)
    default = ensdiag.diagnose(model, test=data, measure=ensdiag.Measure(geometry=False)).metrics["analyzers"]
    raw = ensdiag.diagnose(model, test=data, normalize="none", measure=ensdiag.Measure(geometry=False)).metrics["analyzers"]
    assert _value(raw, QUANTITIES[1]) != pytest.approx(_value(default, QUANTITIES[1]), abs=1e-3)


def test_a_damaged_preprocessing_record_counts_as_not_recorded(finished_run, tmp_path):
    """As in a file written before the record existed: the preset ensdiag trained it on says."""
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    path = finished_run / "batch-ensemble" / "seed-1" / "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    for damaged in ('{"mean": [0.5], "std": [0]}', '{"mean": "x"}', "[[[[", '{"mean": [1e999], "std": [1]}'):
        save_file(load_file(path), str(tmp_path / "m.safetensors"), {**metadata, "ensdiag.preprocess": damaged})
        assert ensdiag.load_model(tmp_path / "m.safetensors").preprocess == (DIGITS_MEAN, DIGITS_STD), damaged
    built = ensdiag.build_model("mlp", "deep-ensemble", 2, 10, (1, 8, 8))  # not trained by ensdiag: nothing assumed
    assert built.preprocess is None and ensdiag.ensembles.as_ensemble(built).preprocess is None


def test_torchvision_members_take_cifar_sized_data(tmp_path, capsys):
    """torchvision's ResNet-18 maps 32×32 images to logits (adaptive pooling): asked of the network,
    not of the 224×224 its architecture records (a network of fixed input size is refused:
    tests/test_your_data.py)."""
    import torchvision
    torch.manual_seed(0)
    for i in range(2):
        torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), tmp_path / f"tv{i}.pt")
    images = np.random.default_rng(0).integers(0, 256, (12, 3, 32, 32), dtype=np.uint8)
    np.savez(tmp_path / "d32.npz", images=images, labels=np.arange(12) % 10)
    code, out, err = run_cli(capsys, "diversity", tmp_path / "tv0.pt", tmp_path / "tv1.pt", "--arch", "torchvision:resnet18",
                             "--data", tmp_path / "d32.npz", "--normalize", "none", "--no-geometry", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["analyzers"]["disagreement"]["splits"]["id"]["mean"]["value"] is not None
