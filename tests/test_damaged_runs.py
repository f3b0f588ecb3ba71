"""Hostile and damaged input: every case exits 0 or 2 with one line naming the file or option,
never a traceback, never code execution, and nothing outside the run folder is touched.
(Property-based cases: test_random_inputs.py; output paths: test_outputs.py.)"""

import json

import pytest
import torch

import ensdiag
from ensdiag.config import preset_config
from ensdiag.data.batching import Normalize
from ensdiag.data.preset import load_preset_data
from ensdiag.train import FitData, fit

from .cli import assert_one_line_error, run_cli


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
    (["--seeds", "18446744073709551616"], "--seeds must lie in -2"),
    (["--seeds", "-9223372036854775809"], "--seeds must lie in -2"),
])
def test_float_options_must_be_finite(tmp_path, capsys, args, match):
    assert_one_line_error(capsys, "train", "--quiet", "--out", tmp_path / "r", *args, match=match)
    assert not (tmp_path / "r").exists()


def test_a_diverging_run_stops_at_the_epoch_and_keeps_the_last_finite_state(tmp_path, capsys):
    line = assert_one_line_error(capsys, "train", "--quiet", "--method", "single", "--seeds", "1", "--epochs", "3",
                                 "--lr", "1e38", "--out", tmp_path / "r", match=r"single seed 1: training diverged in epoch \d")
    assert_one_line_error(capsys, "train", "--quiet", "--method", "single", "--seeds", "1,2", "--epochs", "3",
                          "--lr", "1e38", "--out", tmp_path / "grid",
                          match=r"2 runs diverged \(the others finished\): single seed 1: .*; single seed 2: ")
    folder = tmp_path / "r" / "single" / "seed-1"
    assert not (folder / "meta.json").exists() and not (folder / "model.safetensors").exists()
    state = folder / "training-state.pt"
    if state.exists():  # diverged after epoch 1: the state of the last finite epoch is kept
        saved = torch.load(state, weights_only=True)
        assert all(torch.isfinite(t).all() for t in saved["model"].values())
        assert "resumes from there" in line


def test_an_ensemble_too_big_for_memory_is_refused_before_training(tmp_path, capsys, monkeypatch):
    import ensdiag.experiment
    monkeypatch.setattr(ensdiag.experiment, "physical_memory", lambda: 64 * 2**20)  # a 64 MiB machine
    assert_one_line_error(capsys, "train", "--method", "deep-ensemble", "--members", "1000", "--out", tmp_path / "r",
                          "--quiet", match=r"deep-ensemble with k = 1000 needs about 0\.\d GiB .*lower --members")
    assert not (tmp_path / "r").exists()
    assert_one_line_error(capsys, "train", "--members", "5000", "--quiet", match="--members must be at most 4096")


def test_hundreds_of_members_train_and_are_diagnosed(tmp_path, capsys):
    """k = 300 on the embedded digits (k = 1000 was once killed at 23.6 GB by a k×k×N tensor); k > 256 stores no matrix."""
    code, _, err = run_cli(capsys, "train", "--method", "batch-ensemble", "--members", "300", "--seeds", "1",
                           "--epochs", "1", "--out", tmp_path / "r", "--quiet")
    assert code == 0, err
    metrics = json.loads((tmp_path / "r" / "batch-ensemble" / "seed-1" / "metrics.json").read_text())
    disagreement = metrics["analyzers"]["disagreement"]["splits"]["id"]
    assert disagreement["matrix"]["value"] is None and 0 <= disagreement["mean"]["value"] <= 1


def test_run_folders_written_by_older_ensdiag_still_report(run, capsys):
    """Kernel-wise BatchEnsemble on the mlp, one FPR95 key, NaN losses in a history: all as 0.1 wrote them."""
    experiment = json.loads((run / "experiment.json").read_text())
    experiment["config"]["methods"].append("batch-ensemble-kernel")
    del experiment["config"]["be_loss"]
    (run / "experiment.json").write_text(json.dumps(experiment))
    path = run / "single" / "seed-1" / "metrics.json"
    metrics = json.loads(path.read_text())
    msp = metrics["analyzers"]["ood"]["scores"]["msp"]
    legacy = msp.pop("fpr95_ood_as_id")
    msp.pop("fpr95_id_as_ood")
    msp["fpr95"] = legacy
    path.write_text(json.dumps(metrics))
    history = run / "single" / "seed-1" / "history.jsonl"
    history.write_text(history.read_text() + '{"epoch": 3, "loss": NaN, "accuracy": 0.1, "val_accuracy": null}\n')
    code, out, err = run_cli(capsys, "report", run, "--format", "json", "--no-figures")
    assert code == 0, err
    ood = next(t for t in json.loads(out)["tables"] if t["id"] == "ood")
    column = [c["name"] for c in ood["columns"]].index("FPR95 OOD→ID")
    assert next(r for r in ood["rows"] if r["method"] == "single")["cells"][column]["mean"] == legacy["value"]


def test_a_damaged_predictions_file_is_named_by_the_report_which_draws_the_rest(run, capsys):
    """A predictions file cut short: the report (figures included) is built from the other runs and says which
    run was left out and why, in its data and its notes."""
    path = run / "batch-ensemble" / "seed-1" / "predictions.safetensors"
    path.write_bytes(path.read_bytes()[:200])
    code, out, err = run_cli(capsys, "report", run, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    why = report["damaged_runs"]["batch-ensemble"]["1"]
    assert str(path) in why and "is not a readable safetensors file" in why
    assert f"BatchEnsemble seed 1: left out of the verdict, effective size and bias–variance — {why}." in report["notes"]
    assert "ood-scores" in {figure["name"] for figure in report["figures"]}  # the single model's histogram
    assert outside_untouched(run)
