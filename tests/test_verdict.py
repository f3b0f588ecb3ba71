"""The verdict: shares of the Deep Ensemble's gain, on constructed runs whose answer is known,
reproducible intervals, and the sentences in every report format."""

import json
import math

import pytest
import torch

from ensdiag.predictions import save_predictions
from ensdiag.report.load import load_runs
from ensdiag.report.verdict import verdict

from .cli import run_cli

N = 40


def constant_logits(k, p_label, classes=2):
    """k identical members giving the label (class 0) probability p_label on every example."""
    row = torch.tensor([math.log(p_label), math.log(1 - p_label)])
    return row.expand(k, N, classes).clone()


def write_run(root, methods):
    """A run folder whose methods' predictions are given: {run name: (k, p_label)}."""
    from ensdiag.config import preset_config
    config = preset_config("digits", methods=list(methods), seeds=[1, 2])
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps({"format": "ensdiag.experiment/1", "config": config.to_dict()}))
    for run, (k, p) in methods.items():
        for seed in (1, 2):
            folder = root / run / f"seed-{seed}"
            folder.mkdir(parents=True)
            labels = torch.zeros(N, dtype=torch.long)
            save_predictions({"id": {"logits": constant_logits(k, p), "labels": labels}}, folder / "predictions.safetensors")
            (folder / "metrics.json").write_text(json.dumps({"analyzers": {}, "splits": {"id": {"n": N}}}))
            (folder / "meta.json").write_text(json.dumps({"run": run, "seed": seed}))
    return root


def test_a_method_halfway_between_single_and_deep_ensemble_gets_half_the_nll_gain(tmp_path):
    midway = math.sqrt(0.6 * 0.9)  # −log p halfway between −log 0.6 and −log 0.9
    root = write_run(tmp_path / "run", {"single": (1, 0.6), "deep-ensemble": (3, 0.9), "batch-ensemble": (3, midway)})
    found = verdict(root, load_runs(root)["runs"])
    entry = found["batch-ensemble"]
    assert entry["nll"]["value"] == pytest.approx(0.5) and entry["nll"]["interval"] == pytest.approx([0.5, 0.5])
    assert entry["seeds"] == 2
    assert entry["diversity"]["value"] is None  # identical members: the Deep Ensemble has no diversity to compare with
    assert verdict(root, load_runs(root)["runs"]) == found  # a fixed generator: the same intervals every time


def test_no_share_is_given_when_the_deep_ensemble_gains_nothing(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.7), "deep-ensemble": (3, 0.7), "batch-ensemble": (3, 0.8)})
    entry = verdict(root, load_runs(root)["runs"])["batch-ensemble"]
    assert entry["nll"]["value"] is None and entry["nll"]["reference_gain"] == pytest.approx(0.0)


@pytest.fixture(scope="module")
def trio_run(tmp_path_factory):
    """single, Deep Ensemble and BatchEnsemble, two seeds, two epochs on the embedded digits."""
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    out = tmp_path_factory.mktemp("trio") / "run"
    run_experiment(preset_config("digits", methods=["single", "deep-ensemble", "batch-ensemble"], seeds=[1, 2], epochs=2,
                                 members=2), out, "data", quiet=True)
    return out


def test_the_sentences_appear_in_every_report_format_and_the_train_summary(trio_run, capsys):
    for fmt in ("table", "markdown", "html", "latex", "json"):
        code, text, err = run_cli(capsys, "report", trio_run, "--format", fmt, "--no-figures")
        assert code == 0, err
        assert "BatchEnsemble" in text and "Deep Ensemble" in text and "paired bootstrap" in text, fmt
    code, _, err = run_cli(capsys, "train", "--method", "single,deep-ensemble,batch-ensemble", "--seeds", "1,2",
                           "--epochs", "2", "--members", "2", "--out", trio_run)  # finished: only the summary
    assert code == 0 and "paired bootstrap" in err


def test_bias_variance_diversity_table_for_methods_with_two_seeds(trio_run, capsys):
    code, text, err = run_cli(capsys, "report", trio_run, "--format", "markdown", "--no-figures")
    assert code == 0, err
    assert "Bias, variance and diversity over seeds" in text and "CE diversity" in text and "Brier variance" in text


def test_members_table_and_analyzer_notes_in_the_report(trio_run, tmp_path, capsys):
    import shutil

    from ensdiag.report import make_report
    run = tmp_path / "run"
    shutil.copytree(trio_run, run)
    metrics_path = run / "deep-ensemble" / "seed-1" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["analyzers"]["temperature"]["note"] = "every fitted temperature is within 0.01 of 1"
    metrics_path.write_text(json.dumps(metrics))
    report = make_report(run, write=False)
    members = next(t for t in report["tables"] if t["id"] == "members")
    for row in members["rows"]:
        worst, best = row["cells"][0]["mean"], row["cells"][1]["mean"]
        assert worst <= best
    temperature = next(t for t in report["tables"] if t["id"] == "temperature")
    assert "Deep Ensemble (seed 1): every fitted temperature is within 0.01 of 1." in temperature["note"]
