"""Your data on the command line: `--data` for evaluate/diversity (an image folder, .npz, .npy),
`--shift`/`--ood` replacing a preset's sets in train, evaluate and diversity."""

import json

import numpy as np
import pytest
import torch

import ensdiag
from ensdiag.data.batching import Normalize
from ensdiag.data.constants import DIGITS_MEAN, DIGITS_STD
from tests.cli import assert_one_line_error, run_cli


def _images(n=80, seed=0):
    generator = np.random.default_rng(seed)
    return generator.integers(0, 256, (n, 1, 8, 8), dtype=np.uint8), generator.integers(0, 10, n)


@pytest.fixture
def model_file(finished_run):
    return finished_run / "batch-ensemble" / "seed-1" / "model.safetensors"


def test_diversity_on_an_npz_gives_the_python_api_numbers(model_file, tmp_path, capsys):
    images, labels = _images()
    np.savez(tmp_path / "mine.npz", images=images, labels=labels)
    code, out, err = run_cli(capsys, "diversity", model_file, "--data", tmp_path / "mine.npz", "--format", "json")
    assert code == 0, err
    found = json.loads(out)
    model = ensdiag.load_model(model_file)
    diagnosis = ensdiag.diagnose(model, test=(torch.from_numpy(images), torch.from_numpy(labels)),
                                 normalize=Normalize(DIGITS_MEAN, DIGITS_STD))
    ours = diagnosis.metrics["analyzers"]
    assert found["analyzers"]["disagreement"]["splits"]["id"]["matrix"]["value"] == ours["disagreement"]["splits"]["id"]["matrix"]["value"]
    assert found["analyzers"]["cka"]["splits"]["id"]["layers"]
    for layer, entry in found["analyzers"]["cka"]["splits"]["id"]["layers"].items():
        torch.testing.assert_close(torch.tensor(entry["linear"]["value"]),
                                   torch.tensor(ours["cka"]["splits"]["id"]["layers"][layer]["linear"]["value"]))
    assert "mine.npz (80 images, .npz, " in found["split_titles"]["id"]
    assert found["split_titles"]["ood"].startswith("natural-image patches")  # the fitting preset's, not replaced


def test_evaluate_reads_an_image_folder_and_files_for_ood_and_shift(model_file, tmp_path, capsys):
    from PIL import Image
    images, labels = _images(30)
    for index, (image, label) in enumerate(zip(images, labels)):
        folder = tmp_path / "folder" / f"class-{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0]).resize((16, 16)).save(folder / f"{index}.png")  # resized back to 8×8 on reading
    np.save(tmp_path / "ood.npy", _images(20, seed=1)[0])
    np.savez(tmp_path / "shift.npz", x=_images(25, seed=2)[0], y=_images(25, seed=2)[1])
    code, out, err = run_cli(capsys, "evaluate", model_file, "--data", tmp_path / "folder", "--ood", tmp_path / "ood.npy",
                             "--shift", tmp_path / "shift.npz", "--format", "json")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["splits"]["id"]["n"] == 30 and metrics["splits"]["ood"]["n"] == 20
    assert metrics["splits"]["shift"]["n"] == 25
    assert "image folder, resized to 8×8" in metrics["split_titles"]["id"]
    assert metrics["analyzers"]["ood"]["status"] == "ok"


def test_train_replaces_the_presets_ood_set_and_records_the_path(tmp_path, capsys):
    np.save(tmp_path / "ood.npy", _images(40, seed=3)[0])
    code, out, err = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--quiet",
                             "--ood", tmp_path / "ood.npy", "--out", tmp_path / "run")
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "experiment.json").read_text())["config"]
    assert config["ood"] == str((tmp_path / "ood.npy").resolve())
    metrics = json.loads((tmp_path / "run" / "single" / "seed-1" / "metrics.json").read_text())
    assert metrics["splits"]["ood"]["n"] == 40


@pytest.mark.parametrize("args,match", [
    (["--data", "nowhere/mine.npz"], "--data nowhere/mine.npz does not exist"),
    (["--ood", "not-a-dataset"], "unknown --ood dataset 'not-a-dataset'"),
    (["--normalize", "0.5"], "--normalize must be MEAN"),
    (["--normalize", "0.5,0.2:0.1,0.1"], "needs 1 finite means"),
])
def test_bad_data_options_are_one_line_errors(model_file, capsys, args, match):
    assert_one_line_error(capsys, "evaluate", model_file, *args, match=match)


@pytest.mark.parametrize("content,match", [
    ({"labels": np.zeros(3, dtype=np.int64)}, "no 'images'"),
    ({"images": np.zeros((3, 8, 8), dtype=np.int32)}, "must be uint8"),
    ({"images": np.zeros((3, 1, 8, 8), dtype=np.uint8), "labels": np.zeros(4, dtype=np.int64)}, "labels must be 3"),
    ({"images": np.full((3, 1, 8, 8), np.nan, dtype=np.float32)}, "NaN"),
    ({"images": np.zeros((3, 1, 5, 5), dtype=np.uint8)}, "does not run on images of shape"),
    ({"images": np.zeros((3, 1, 8, 8), dtype=np.uint8), "labels": np.array([0, 1, 99])}, "out of range"),
])
def test_damaged_data_files_are_one_line_errors(model_file, tmp_path, capsys, content, match):
    np.savez(tmp_path / "bad.npz", **content)
    assert_one_line_error(capsys, "evaluate", model_file, "--data", tmp_path / "bad.npz", match=match)


def test_a_damaged_image_and_an_empty_folder_are_one_line_errors(model_file, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(capsys, "evaluate", model_file, "--data", tmp_path / "empty", match="not an image folder")
    (tmp_path / "broken" / "a").mkdir(parents=True)
    (tmp_path / "broken" / "a" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    assert_one_line_error(capsys, "evaluate", model_file, "--data", tmp_path / "broken", match="not a readable image")


def test_a_model_that_fits_no_preset_needs_its_normalisation(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 3, (1, 5, 5))
    ensdiag.save_model(model, tmp_path / "m.safetensors")
    np.savez(tmp_path / "d.npz", images=np.zeros((6, 1, 5, 5), dtype=np.uint8), labels=np.arange(6) % 3)
    assert_one_line_error(capsys, "evaluate", tmp_path / "m.safetensors", "--data", tmp_path / "d.npz",
                          match="pass --normalize")
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "m.safetensors", "--data", tmp_path / "d.npz",
                             "--normalize", "none", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["splits"]["id"]["n"] == 6 and "no shift set given" in json.loads(out)["skipped_splits"]["shift"]
