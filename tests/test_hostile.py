"""Hostile and damaged input: every case exits 0 or 2 with one line naming the file or option,
never a traceback, never code execution, and nothing outside the run folder is touched."""

import json
import shutil

import pytest
import torch

import ensdiag
from ensdiag.config import preset_config
from ensdiag.data.batching import Normalize
from ensdiag.data.preset import load_preset_data
from ensdiag.experiment import run_experiment
from ensdiag.train import FitData, fit

from .cli import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny finished run: single and BatchEnsemble, one seed, two epochs on the embedded digits."""
    out = tmp_path_factory.mktemp("finished") / "run"
    config = preset_config("digits", methods=["single", "batch-ensemble"], seeds=[1], epochs=2, members=2)
    run_experiment(config, out, "data", quiet=True)
    return out


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "box" / "run"  # `box` holds only the run: nothing else may appear in it
    shutil.copytree(finished_run, copy)
    return copy


def outside_untouched(run):
    return sorted(p.name for p in run.parent.iterdir()) == ["run"]


DAMAGE = {
    "truncated metrics.json": ("single/seed-1/metrics.json", lambda text: text[: len(text) // 2]),
    "truncated meta.json": ("single/seed-1/meta.json", lambda text: text[:10]),
    "garbage history line": ("single/seed-1/history.jsonl", lambda text: text + "garbage\n"),
    "history row without loss": ("single/seed-1/history.jsonl", lambda text: '{"epoch": 1}\n'),
    "experiment.json is a list": ("experiment.json", lambda text: "[1, 2]"),
    "metrics are {}": ("batch-ensemble/seed-1/metrics.json", lambda text: "{}"),
    "meta is a number": ("batch-ensemble/seed-1/meta.json", lambda text: "3"),
    "config has a string lr": ("experiment.json", lambda text: text.replace('"lr": 0.01', '"lr": "fast"')),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_run_folders_give_one_line_naming_the_file(run, capsys, case):
    relative, damage = DAMAGE[case]
    path = run / relative
    path.write_text(damage(path.read_text()))
    line = assert_one_line_error(capsys, "report", run, "--format", "json", "--no-figures", match=relative.split("/")[-1])
    assert "weights_only" not in line and outside_untouched(run)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated", b"\x80\x04garbage"])
def test_damaged_training_state_is_a_clear_error(run, capsys, content):
    folder = run / "single" / "seed-1"
    (folder / "meta.json").unlink()  # the seed is unfinished again, with a damaged resume point
    (folder / "training-state.pt").write_bytes(content)
    line = assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match="training-state.pt is damaged")
    assert "weights_only" not in line and "delete it" in line


def test_truncated_real_training_state_is_a_clear_error(run, capsys, tmp_path):
    config = preset_config("digits", methods=["single"], seeds=[1], epochs=1)
    data = load_preset_data(config, "data")
    fit_data = FitData(data.train.images[:64], data.train.labels[:64], data.train.images[64:96],
                       data.train.labels[64:96], Normalize(config.mean, config.std, "cpu"))
    state = tmp_path / "state.pt"  # a real training state, then cut short
    fit(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)), config, fit_data, 1, state, "cpu")
    folder = run / "single" / "seed-1"
    (folder / "meta.json").unlink()
    (folder / "training-state.pt").write_bytes(state.read_bytes()[:-100])
    assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match="training-state.pt is damaged")


@pytest.mark.parametrize("change,match", [
    ({"methods": ["../../x"]}, "unknown method '../../x'"),
    ({"epochs": -3}, "--epochs must be at least 1"),
    ({"seeds": ["a"]}, "seeds must be tuple"),
    ({"members": 0}, "--members must be at least 1"),
    ({"lr": None}, "lr must be float"),
    ({"evil": 1}, "unknown fields 'evil'"),
])
def test_resume_validates_the_stored_config_like_user_input(run, capsys, change, match):
    path = run / "experiment.json"
    experiment = json.loads(path.read_text())
    experiment["config"].update(change)
    path.write_text(json.dumps(experiment))
    for seed_folder in run.glob("*/seed-1"):
        (seed_folder / "meta.json").unlink()
    assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match=match)
    assert outside_untouched(run) and not (run.parent.parent / "x").exists()


@pytest.mark.parametrize("args,match", [
    (["--lr", "inf"], "--lr must be a finite number"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--dropout", "nan"], "--dropout must be a finite number"),
    (["--val-fraction", "nan"], "--val-fraction must be a finite number"),
    (["--be-init", "normal:nan"], "not a finite number"),
    (["--be-init", "random-sign:inf"], "not a finite number"),
])
def test_float_options_must_be_finite(tmp_path, capsys, args, match):
    assert_one_line_error(capsys, "train", "--quiet", "--out", tmp_path / "r", *args, match=match)
    assert not (tmp_path / "r").exists()


def test_a_diverging_run_stops_at_the_epoch_and_keeps_the_last_finite_state(tmp_path, capsys):
    line = assert_one_line_error(capsys, "train", "--quiet", "--method", "single", "--seeds", "1", "--epochs", "3",
                                 "--lr", "1e38", "--out", tmp_path / "r", match=r"single seed 1: training diverged in epoch \d")
    folder = tmp_path / "r" / "single" / "seed-1"
    assert not (folder / "meta.json").exists() and not (folder / "model.safetensors").exists()
    state = folder / "training-state.pt"
    if state.exists():  # diverged after epoch 1: the state of the last finite epoch is kept
        saved = torch.load(state, weights_only=True)
        assert all(torch.isfinite(t).all() for t in saved["model"].values())
        assert "resumes from there" in line
