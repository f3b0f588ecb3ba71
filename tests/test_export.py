"""Exports: the flat view of a diagnosis (the same names for every k), per-example rows checked
against SciPy and brute force, the report's long CSV read back (csv module, pandas), Parquet,
and `ensdiag report A B` over several run folders."""

import csv
import io
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

import ensdiag
from ensdiag.export import REPORT_FIELDS, example_rows, flat_metrics, report_rows, to_csv
from ensdiag.report import make_report
from tests.cli import run_cli, run_recorded
from tests.documents import recorded_commands
from tests.test_report import ACCURACY, SEEDS, run_dir  # noqa: F401  (the fixture)


def _members(k, seed=0):
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3)) for _ in range(k)]


def _data(n=90, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def test_the_flat_view_has_the_same_names_for_every_k_and_says_why_a_number_is_missing():
    x, y = _data()
    one = ensdiag.diagnose(_members(1), test=(x, y), ood=torch.randn(40, 12) * 3,
                           measure=ensdiag.Measure(geometry=False)).flat()
    members = _members(3)
    three = ensdiag.diagnose(members, test=(x, y), ood=torch.randn(40, 12) * 3,
                             measure=ensdiag.Measure(geometry=False))
    flat = three.flat()
    assert list(one) == list(flat) and len(flat) > 30  # a loop over methods needs no special case
    assert math.isnan(one["disagreement/id/mean"]) and "two members" in one.reasons["disagreement/id/mean"]
    assert math.isnan(one["uncertainty/id/jsd"]) and "k = 1" in one.reasons["uncertainty/id/jsd"]
    assert math.isnan(flat["calibration/shift/accuracy"]) and flat.reasons["calibration/shift/accuracy"] == "no shift split"
    assert "geometry" in flat.reasons["cka/id/mean"]
    # the numbers themselves, against an independent computation
    with torch.no_grad():
        votes = torch.stack([member(x) for member in members]).argmax(-1).numpy()
    pairs = [(i, j) for i in range(3) for j in range(3) if i != j]
    assert flat["disagreement/id/mean"] == pytest.approx(np.mean([np.mean(votes[i] != votes[j]) for i, j in pairs]))
    probs = torch.softmax(three.predictions["id"]["logits"].double(), -1).mean(0).numpy()
    assert flat["calibration/id/accuracy"] == pytest.approx(np.mean(probs.argmax(1) == y.numpy()))
    assert "calibration/id/accuracy" not in flat.reasons


def test_the_full_flat_view_adds_every_stored_scalar():
    x, y = _data()
    diagnosis = ensdiag.diagnose(_members(3), test=(x, y), measure=ensdiag.Measure(geometry=False))
    full = diagnosis.flat(full=True)
    probs = torch.softmax(diagnosis.predictions["id"]["logits"].double(), -1).mean(0).numpy()
    brier = np.mean(((probs - np.eye(3)[y.numpy()]) ** 2).sum(1))
    assert full["calibration/id/brier"] == pytest.approx(brier)
    assert set(diagnosis.flat()) < set(full)


def test_per_example_rows_match_scipy_and_brute_force():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 25, 5, generator=generator) * 2
    labels = torch.randint(0, 5, (25,), generator=generator)
    rows = example_rows({"id": {"logits": logits, "labels": labels}, "ood": {"logits": logits[:, :7], "labels": None}},
                        probabilities=True)
    assert [row["split"] for row in rows] == ["id"] * 25 + ["ood"] * 7
    members = torch.softmax(logits.double(), -1).numpy()
    mean = members.mean(0)
    votes = members.argmax(-1)
    for row in rows[:25]:
        i = row["index"]
        assert row["prediction"] == mean[i].argmax() and row["confidence"] == pytest.approx(mean[i].max())
        assert row["correct"] == (mean[i].argmax() == labels[i].item())
        assert row["nll"] == pytest.approx(-math.log(mean[i, labels[i]]))
        assert row["entropy"] == pytest.approx(stats.entropy(mean[i]))
        expected = np.mean([stats.entropy(members[m, i]) for m in range(4)])
        assert row["expected_entropy"] == pytest.approx(expected)
        assert row["jsd"] == pytest.approx(max(stats.entropy(mean[i]) - expected, 0), abs=1e-12)
        assert row["member_agreement"] == pytest.approx(np.mean(votes[:, i] == mean[i].argmax()))
        differing = [votes[a, i] != votes[b, i] for a in range(4) for b in range(a + 1, 4)]
        assert row["disagreement"] == pytest.approx(np.mean(differing))
        assert [row[f"p_{c}"] for c in range(5)] == pytest.approx(mean[i].tolist())
    assert rows[-1]["label"] is None and rows[-1]["nll"] is None


def test_the_report_as_long_rows_keeps_every_seed_and_interval(run_dir):  # noqa: F811
    report = make_report(run_dir, write=False)
    rows = list(csv.DictReader(io.StringIO(to_csv(report_rows(report), REPORT_FIELDS))))
    accuracy = [row for row in rows if row["table"] == "id" and row["column"] == "Acc"]
    for method, values in ACCURACY.items():
        mine = {int(row["seed"]): float(row["value"]) for row in accuracy if row["method"] == method}
        assert mine == pytest.approx(dict(zip(SEEDS, values)))
        first = next(row for row in accuracy if row["method"] == method)
        low, high = stats.t.interval(0.95, 2, loc=np.mean(values), scale=stats.sem(values))
        assert (float(first["low"]), float(first["high"])) == pytest.approx((low, high))
        assert first["key"] == "calibration/id/accuracy" and first["split"] == "id"
    # per-seed values come from each seed's own metrics.json
    seed = SEEDS[1]
    stored = json.loads((run_dir / "deep-ensemble" / f"seed-{seed}" / "metrics.json").read_text())
    disagreement = next(row for row in rows if row["column"] == "disagreement (ood)" and row["method"] == "deep-ensemble"
                        and row["seed"] == str(seed))
    assert float(disagreement["value"]) == pytest.approx(stored["analyzers"]["disagreement"]["splits"]["ood"]["mean"]["value"])
    single = [row for row in rows if row["column"] == "disagreement (ood)" and row["method"] == "single"]
    assert len(single) == 3 and all(row["value"] == "" for row in single)  # N/A: one row per seed all the same


def test_the_report_csv_reads_into_pandas(run_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    """docs/loggers-and-exports.md's commands as written, on the run as `runs/demo`."""
    pandas = pytest.importorskip("pandas")
    (tmp_path / "runs").mkdir()
    demo = run_dir.rename(tmp_path / "runs" / "demo")
    monkeypatch.chdir(tmp_path)
    commands = recorded_commands("docs/loggers-and-exports.md", "Tables", tmp_path)
    assert [command[:2] for command in commands] == [["ensdiag", "report"], ["python", "-c"]]
    for command in commands:
        run_recorded(capsys, command, tmp_path)
    pivot = capsys.readouterr().out
    frame = pandas.read_csv(tmp_path / "demo.csv")
    assert list(frame.columns) == list(REPORT_FIELDS)
    means = frame[frame.table == "id"].groupby(["method", "column"])["value"].mean()
    assert means[("deep-ensemble", "Acc")] == pytest.approx(np.mean(ACCURACY["deep-ensemble"]))
    assert "deep-ensemble" in pivot and "single" in pivot  # the pivot by method, printed
    assert ensdiag.report.report_frame(demo).shape == frame.shape


def test_a_diagnosis_as_data_frames_and_parquet(tmp_path):
    pandas = pytest.importorskip("pandas")
    x, y = _data()
    diagnosis = ensdiag.diagnose(_members(3), test=(x, y), measure=ensdiag.Measure(geometry=False))
    metrics = diagnosis.to_frame()
    assert set(metrics.columns) >= {"name", "value", "reason", "definition"}
    assert metrics.set_index("name")["value"]["calibration/id/accuracy"] == diagnosis.flat()["calibration/id/accuracy"]
    examples = diagnosis.to_frame("examples")
    assert len(examples) == 90 and examples["confidence"].between(1 / 3, 1).all()
    diagnosis.save_examples(tmp_path / "examples.csv")
    assert pandas.read_csv(tmp_path / "examples.csv")["jsd"].to_numpy() == pytest.approx(examples["jsd"].to_numpy())
    pytest.importorskip("pyarrow")
    diagnosis.save_examples(tmp_path / "examples.parquet")
    assert pandas.read_parquet(tmp_path / "examples.parquet")["prediction"].tolist() == examples["prediction"].tolist()


def _save(folder, methods, seeds, ood=True, titles=None):
    x, y = _data(60)
    for method, k in methods:
        for seed in seeds:
            ensdiag.diagnose(_members(k, seed), test=(x, y), ood=torch.randn(30, 12) * 3 if ood else None,
                             measure=ensdiag.Measure(geometry=False),
                             context=ensdiag.Context(titles=titles)).save(folder, method, seed)


def test_folders_of_different_data_are_reported_side_by_side_never_averaged(tmp_path, capsys):
    """A digits folder and a FashionMNIST folder: every method kept apart by folder (no row pools their
    seeds), each folder's verdict formed within it, and the report says why; a folder without a single
    model and a Deep Ensemble says why its methods get no verdict line."""
    _save(tmp_path / "digits", [("single", 1), ("deep-ensemble", 3), ("batch-ensemble", 3)], [0, 1],
          titles={"test": "digits (scikit-learn) test"})
    _save(tmp_path / "fashion", [("deep-ensemble", 3), ("batch-ensemble", 3)], [2, 3],
          titles={"test": "FashionMNIST test"})
    report = make_report([tmp_path / "digits", tmp_path / "fashion"], write=False)
    assert set(report["methods"]) == {"single@digits", "deep-ensemble@digits", "batch-ensemble@digits",
                                      "deep-ensemble@fashion", "batch-ensemble@fashion"}
    for table in report["tables"]:
        for row in table["rows"]:
            assert all(cell.get("n", 0) <= 2 for cell in row["cells"]), (table["id"], row["method"])  # 2 seeds each
    assert "never averaged" in report["notes"][0] and "FashionMNIST test" in report["notes"][0]
    assert report["verdict"]["batch-ensemble@digits"]["seeds"] == 2 and "batch-ensemble@fashion" not in report["verdict"]
    verdict = next(table for table in report["tables"] if table["id"] == "verdict")
    assert "BatchEnsemble (fashion): no verdict — no `single` run beside it to compare with." in verdict["note"]
    code, out, err = run_cli(capsys, "report", tmp_path / "digits", tmp_path / "fashion", "--format", "markdown")
    assert code == 0 and "never averaged" in out


def test_a_report_of_two_folders_merges_methods_and_seeds(tmp_path, capsys):
    _save(tmp_path / "monday", [("single", 1), ("deep-ensemble", 3)], [0, 1])
    _save(tmp_path / "tuesday", [("deep-ensemble", 3), ("batch-ensemble", 3)], [2, 3])
    before = sorted(p.name for p in (tmp_path / "monday").iterdir())
    report = make_report([tmp_path / "monday", tmp_path / "tuesday"])
    assert report["methods"] == ["single", "deep-ensemble", "batch-ensemble"] and report["seeds"] == [0, 1, 2, 3]
    acc = next(t for t in report["tables"] if t["id"] == "id")
    deep = next(r for r in acc["rows"] if r["method"] == "deep-ensemble")
    assert deep["seeds"] == [0, 1, 2, 3] and deep["cells"][0]["n"] == 4  # seeds pooled from both folders
    assert sorted(p.name for p in (tmp_path / "monday").iterdir()) == before  # neither folder is written to
    code, out, err = run_cli(capsys, "report", tmp_path / "monday", tmp_path / "tuesday", "--format", "markdown")
    assert code == 0, err
    assert "| Deep Ensemble |" in out and "| BatchEnsemble |" in out


def test_the_same_method_and_seed_in_two_folders_are_kept_apart_by_folder(tmp_path, capsys):
    for folder in ("jan", "feb"):
        _save(tmp_path / folder, [("single", 1), ("deep-ensemble", 3), ("batch-ensemble", 3)], [0, 1])
    report = make_report([tmp_path / "jan", tmp_path / "feb"], write=False)
    assert report["methods"] == ["single@jan", "deep-ensemble@jan", "batch-ensemble@jan", "single@feb",
                                 "deep-ensemble@feb", "batch-ensemble@feb"]
    labels = [row["label"] for row in report["tables"][1]["rows"]]
    assert "Deep Ensemble (jan)" in labels and "BatchEnsemble (feb)" in labels
    alone = make_report(tmp_path / "jan", write=False)  # each folder's verdict, as it would be on its own
    assert report["verdict"]["batch-ensemble@jan"]["seeds"] == alone["verdict"]["batch-ensemble"]["seeds"] == 2
    assert report["verdict"]["batch-ensemble@jan"]["diversity"] == alone["verdict"]["batch-ensemble"]["diversity"]
    code, out, err = run_cli(capsys, "report", tmp_path / "jan", tmp_path / "jan", "--format", "json")
    assert code == 2 and "twice" in err


def test_report_examples_writes_every_runs_examples(tmp_path, capsys):
    _save(tmp_path / "mine", [("single", 1), ("deep-ensemble", 3)], [0])
    code, _, err = run_cli(capsys, "report", tmp_path / "mine", "--format", "json", "--no-figures",
                           "--examples", tmp_path / "examples.csv")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "examples.csv").open()))
    assert len(rows) == 2 * (60 + 30) and {row["method"] for row in rows} == {"single", "deep-ensemble"}
    assert {row["split"] for row in rows} == {"id", "ood"}
    code, _, err = run_cli(capsys, "report", tmp_path / "mine", "--examples", tmp_path / "examples.txt")
    assert code == 2 and ".csv or .parquet" in err


def test_flat_metrics_of_a_damaged_result_is_nan_with_a_reason():
    metrics = {"splits": {"id": {"n": 3}}, "analyzers": {"calibration": {"status": "ok", "version": 3, "splits": {
        "id": {"accuracy": {"value": None, "status": "nan", "definition": "d"}, "nll": "not a metric"}}}}}
    flat = flat_metrics(metrics)
    assert math.isnan(flat["calibration/id/accuracy"]) and "nan" in flat.reasons["calibration/id/accuracy"]
    assert math.isnan(flat["calibration/id/ece"]) and flat.reasons["calibration/id/ece"] == "not in the analyzer's result"
    assert math.isnan(flat["calibration/id/nll"])
