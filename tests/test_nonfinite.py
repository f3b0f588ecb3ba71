"""Non-finite numbers and empty splits: a defined JSON form (null + status) and readable cells, never a crash."""

import io
import json
import math

import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

from ensdiag.analysis import analyze_predictions, metric
from ensdiag.stats import metrics as M
from ensdiag.stats import weighted as W
from ensdiag.stats.examples import Examples
from ensdiag.report.render import cell_text, format_number, to_json
from ensdiag.report.terminal import cell, heatmap_table, metrics_table, ood_table

from .cli import run_cli

NAN, INF = float("nan"), float("inf")


def strict_json(data) -> str:
    """JSON as ensdiag writes it: a NaN or infinity anywhere raises."""
    return json.dumps(data, allow_nan=False)


def rendered(renderable) -> str:
    console = Console(width=200, file=io.StringIO())
    console.print(renderable)
    return console.file.getvalue()


def splits(id_logits, id_labels=None, ood_logits=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, n, c = id_logits.shape
    labels = id_labels if id_labels is not None else torch.randint(0, c, (n,), generator=g)
    return {"id": {"logits": id_logits, "labels": labels},
            "ood": {"logits": ood_logits if ood_logits is not None else torch.randn(k, 6, c, generator=g), "labels": None}}


def dig(result, *path):
    node = result["analyzers"]
    for key in path:
        node = node[key]
    return node


# --- the representation: metric() ---------------------------------------------------------------

@pytest.mark.parametrize("value,status", [(0.25, "ok"), (3, "ok"), (NAN, "nan"), (INF, "inf"), (-INF, "-inf"), (None, "n/a")])
def test_metric_scalar_status(value, status):
    entry = metric(value, "a definition")
    assert entry["status"] == status
    assert entry["value"] == (value if status == "ok" else None)
    strict_json(entry)


def test_metric_lists_and_matrices_become_null_where_non_finite():
    entry = metric([[0.0, NAN], [INF, 1.0]], "a matrix", bins={"accuracy": [NAN, 0.5]})
    assert entry["value"] == [[0.0, None], [None, 1.0]] and entry["status"] == "non-finite"
    assert entry["bins"] == {"accuracy": [None, 0.5]}  # extras are made JSON-safe too
    assert metric([0.5, 1.0], "per member")["status"] == "ok"
    assert metric(None, "no samples", status="empty") == {"value": None, "definition": "no samples", "status": "empty"}
    strict_json(entry)


# --- the metric functions on undefined predictions ------------------------------------------------

def test_metrics_of_nan_logits_are_nan_not_numbers_that_look_measured():
    logits = torch.randn(3, 8, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.zeros(8, dtype=torch.int64)
    logits[1, 2, 0] = NAN  # member 1, sample 2: torch's argmax would pick the NaN (class 0 = the label)
    split = Examples(logits, labels)
    assert all(math.isnan(float(W.mean(values))) for values in (split.correct, split.nll, split.brier))
    assert math.isnan(float(W.ece(split.confidence, split.correct)))
    member = M.member_accuracy(split)
    assert math.isnan(member[1]) and not math.isnan(member[0]) and not math.isnan(member[2])
    d = M.disagreement_matrix(logits)
    assert torch.isnan(d[1, [0, 2]]).all() and torch.isnan(d[[0, 2], 1]).all() and (d.diagonal() == 0).all()
    assert not torch.isnan(d[0, 2]) and math.isnan(M.mean_off_diagonal(d))
    assert torch.isnan(Examples(logits, None).jsd[2]) and not torch.isnan(Examples(logits, None).jsd[[0, 1, 3]]).any()


# --- analyze_predictions: JSON-safe with statuses -----------------------------------------------------

def test_empty_split_gives_empty_statuses_and_ood_is_skipped_with_a_reason():
    result = analyze_predictions(splits(torch.zeros(2, 0, 3), torch.zeros(0, dtype=torch.int64)))
    strict_json(result)
    for key in ("accuracy", "nll", "ece", "brier", "member_accuracy", "member_nll"):
        entry = dig(result, "calibration", "splits", "id", key)
        assert entry["value"] is None and entry["status"] == "empty"
    assert sum(dig(result, "calibration", "splits", "id", "ece")["bins"]["count"]) == 0  # the bins stay, empty
    assert dig(result, "calibration", "splits", "id", "n") == 0
    for key in ("entropy", "expected_entropy", "jsd"):
        assert dig(result, "uncertainty", "splits", "id", key)["status"] == "empty"
    for key in ("matrix", "mean", "normalized"):
        assert dig(result, "disagreement", "splits", "id", key)["status"] == "empty"
    assert dig(result, "disagreement", "splits", "ood", "mean")["status"] == "ok"  # the other split is unaffected
    ood = dig(result, "ood")
    assert ood["status"] == "skipped" and "id split is empty" in ood["reason"]


def test_empty_ood_split_skips_ood_detection():
    result = analyze_predictions(splits(torch.randn(2, 5, 3), ood_logits=torch.zeros(2, 0, 3)))
    strict_json(result)
    assert dig(result, "ood")["status"] == "skipped" and "ood split is empty" in dig(result, "ood")["reason"]
    assert dig(result, "uncertainty", "splits", "ood", "entropy")["status"] == "empty"
    assert dig(result, "calibration", "splits", "id", "accuracy")["status"] == "ok"


def nan_member_logits():
    logits = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(2))
    logits[1] = NAN  # a member with NaN weights
    return logits


def plus_inf_logits():
    logits = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(3))
    logits[0, 4, 2] = INF  # softmax is inf/inf there
    return logits


@pytest.mark.parametrize("make", [nan_member_logits, plus_inf_logits], ids=["nan", "+inf"])
def test_undefined_logits_give_nan_statuses_not_exceptions(make):
    result = analyze_predictions(splits(make()))
    strict_json(result)
    # (weight similarity needs weights, temperature a validation split: both skip here)
    assert all(r["status"] == "ok" for name, r in result["analyzers"].items()
               if name not in ("weight-similarity", "temperature"))
    for key in ("accuracy", "nll", "ece", "brier"):
        entry = dig(result, "calibration", "splits", "id", key)
        assert entry["value"] is None and entry["status"] == "nan"
    assert dig(result, "calibration", "splits", "id", "member_accuracy")["status"] == "non-finite"
    for key in ("entropy", "expected_entropy", "jsd"):
        assert dig(result, "uncertainty", "splits", "id", key)["status"] == "nan"
    assert dig(result, "disagreement", "splits", "id", "matrix")["status"] == "non-finite"
    assert dig(result, "disagreement", "splits", "id", "mean")["status"] == "nan"
    assert dig(result, "disagreement", "splits", "id", "normalized")["status"] == "nan"
    assert dig(result, "disagreement", "splits", "ood", "mean")["status"] == "ok"
    for score in ("msp", "entropy", "jsd"):
        for key in ("auroc", "aupr_out", "aupr_in", "fpr95_ood_as_id", "fpr95_id_as_ood"):
            assert dig(result, "ood", "scores", score, key)["status"] == "nan"
            assert dig(result, "ood", "scores", score, key)["value"] is None


def test_minus_inf_logit_on_the_label_gives_an_infinite_nll():
    logits = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(4))
    labels = torch.tensor([0, 1, 2, 0, 1])
    logits[:, 0, 0] = -INF  # every member gives the label probability 0: −log 0 = inf
    result = analyze_predictions(splits(logits, labels))
    strict_json(result)
    nll = dig(result, "calibration", "splits", "id", "nll")
    assert nll["value"] is None and nll["status"] == "inf"
    assert dig(result, "calibration", "splits", "id", "accuracy")["status"] == "ok"  # the argmax is well defined
    assert dig(result, "ood", "scores", "msp", "auroc")["status"] == "ok"


# --- the CLI on a predictions file with an empty split ------------------------------------------------

@pytest.fixture
def empty_id_file(tmp_path):
    path = tmp_path / "empty.safetensors"
    save_file({"id/logits": torch.zeros(2, 0, 3), "id/labels": torch.zeros(0, dtype=torch.int64)}, str(path))
    return path


def test_analyze_json_of_an_empty_split(empty_id_file, capsys):
    code, out, err = run_cli(capsys, "analyze", empty_id_file, "--format", "json")
    assert code == 0, err
    data = json.loads(out, parse_constant=lambda token: pytest.fail(f"{token} in the JSON"))
    assert data["splits"]["id"] == {"n": 0, "labelled": True}
    assert data["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["status"] == "empty"
    assert data["analyzers"]["disagreement"]["splits"]["id"]["mean"]["status"] == "empty"


def test_analyze_table_of_an_empty_split(empty_id_file, capsys):
    code, out, err = run_cli(capsys, "analyze", empty_id_file)
    assert code == 0 and "Traceback" not in out + err
    row = next(line for line in out.splitlines() if " id " in line)
    assert row.count("empty") == 7  # Acc, NLL, ECE, Brier, H, JSD, disagreement


# --- cells --------------------------------------------------------------------------------------

def test_terminal_cells_show_the_status_word_or_na():
    assert cell(None) == "N/A" and cell(0.12345) == "0.123"
    assert (cell(NAN), cell(INF), cell(-INF)) == ("nan", "inf", "-inf")
    assert cell(metric(NAN, "d")) == "nan" and cell(metric(INF, "d")) == "inf" and cell(metric(-INF, "d")) == "-inf"
    assert cell(metric(None, "d", status="empty")) == "empty" and cell(metric(None, "d")) == "N/A"
    assert cell(metric(0.5, "d")) == "0.500"
    assert cell({"value": None, "definition": "d"}) == "N/A"  # metrics.json written before statuses existed


def test_terminal_tables_of_nan_results_render():
    result = analyze_predictions(splits(nan_member_logits()))
    text = rendered(metrics_table(result)) + rendered(ood_table(result))
    id_row = next(line for line in text.splitlines() if line.startswith("│ id"))
    assert id_row.count("nan") == 7  # Acc, NLL, ECE, Brier, H, JSD, disagreement
    assert "nan" in text.split("AUROC")[1]
    matrix = dig(result, "disagreement", "splits", "id", "matrix")["value"]
    assert "N/A" in rendered(heatmap_table(matrix, "with undefined entries"))
    assert "not stored" in rendered(heatmap_table(None, "k > 256"))
    assert "nan" in rendered(heatmap_table([[0.0, NAN], [NAN, 0.0]], "raw NaN"))


def test_report_cells_and_json_never_crash_on_non_finite_numbers():
    assert format_number(None, "id", 0) == "N/A" and format_number(NAN, "id", 0) == "nan"
    assert format_number(INF, "cost", 0) == "inf" and format_number(-INF, "id", 1) == "-inf"
    assert cell_text({"mean": NAN, "ci": NAN, "n": 2, "values": [], "expected": 3}, "id", 0) == "nan"
    assert cell_text({"mean": None, "ci": None, "n": 0, "values": []}, "id", 0) == "N/A"
    assert cell_text({"mean": 0.5, "ci": 0.01, "n": 3, "values": []}, "id", 0) == "0.500 ± 0.010"
    assert json.loads(to_json({"tables": [{"rows": [{"cells": [{"mean": NAN, "ci": INF, "values": [1.0, -INF]}]}]}]})) == \
        {"tables": [{"rows": [{"cells": [{"mean": None, "ci": None, "values": [1.0, None]}]}]}]}
