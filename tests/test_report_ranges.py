"""Numbers read back from a run folder are range-checked: a damaged value (an accuracy of 1e308, a
negative training time, an epoch of 401 digits, a LoRA section with k = −3) is a one-line error
naming the file and how to recompute it, never averaged, printed in hundreds of digits or marked
best; readers of .jsonl rows are bounded in size."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from .cli import assert_one_line_error, run_cli
from .lora_reference import ADAPTERS

METRICS = Path("m") / "seed-0" / "metrics.json"


@pytest.fixture
def diagnoses(tmp_path, capsys):
    """A diagnosis folder with two methods analysed from predictions (m and n)."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "y.npy", rng.integers(0, 4, 60))
    for method in ("m", "n"):
        np.save(tmp_path / f"{method}.npy", rng.normal(size=(3, 60, 4)).astype(np.float32))
        code, _, err = run_cli(capsys, "analyze", tmp_path / f"{method}.npy", "--labels", tmp_path / "y.npy",
                               "--out", tmp_path / "runs", "--method", method, "--format", "json")
        assert code == 0, err
    return tmp_path / "runs"


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_an_accuracy_of_1e308_is_damage_not_the_best(diagnoses, capsys):
    edit(diagnoses / METRICS, lambda m: m["analyzers"]["calibration"]["splits"]["id"]["accuracy"].update(value=1e308))
    line = assert_one_line_error(capsys, "report", diagnoses, "--format", "markdown", "--no-figures",
                                 match=r"m/seed-0/metrics.json is damaged \(analyzers.calibration.splits.id.accuracy.value "
                                       r"is 1e\+308, outside \[0, 1\]\)")
    assert "0" * 30 not in line


@pytest.mark.parametrize("where,value", [(("disagreement", "splits", "id", "matrix", "value", 0, 1), -0.5),
                                         (("calibration", "splits", "id", "nll", "value"), -1.0),
                                         (("calibration", "splits", "id", "member_accuracy", "value", 1), 2.0),
                                         (("uncertainty", "splits", "id", "jsd", "value"), 10**400)])
def test_any_number_outside_its_range_is_damage(diagnoses, capsys, where, value):
    def change(metrics):
        node = metrics["analyzers"]
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
    edit(diagnoses / METRICS, change)
    assert_one_line_error(capsys, "report", diagnoses, "--no-figures", match="metrics.json is damaged")


def test_a_damaged_diagnosis_is_told_to_save_it_again_and_a_training_run_to_resume(diagnoses, run, capsys):
    edit(diagnoses / METRICS, lambda m: m["analyzers"]["calibration"]["splits"]["id"]["ece"].update(value=7))
    line = assert_one_line_error(capsys, "report", diagnoses, "--no-figures", match="is damaged")
    assert "save that run" in line and "--overwrite" in line and "train --resume" not in line
    edit(run / "single" / "seed-1" / "meta.json", lambda meta: meta.update(train_seconds=-1e308))
    line = assert_one_line_error(capsys, "report", run, "--no-figures", match=r"meta.json is damaged \(train_seconds is "
                                                                           r"-1e\+308, outside \[0, inf\]\)")
    assert "train --resume" in line


@pytest.mark.parametrize("row,match", [({"epoch": 10**400, "disagreement": 0.1}, "line 1 is not a diversity record"),
                                       ({"epoch": -1}, "line 1 is not"), ({"epoch": 1, "weight_cosine": 3.0}, "line 1"),
                                       ({"epoch": 1, "jsd": 1e999}, "line 1")])
def test_tracking_rows_out_of_range_are_damage(run, capsys, row, match):
    (run / "batch-ensemble" / "seed-1" / "diversity.jsonl").write_text(json.dumps(row).replace("1e999", "Infinity") + "\n")
    assert_one_line_error(capsys, "report", run, "--no-figures", match=f"diversity.jsonl is damaged \\({match}")


def test_a_jsonl_beyond_its_bound_is_refused_without_holding_it(run, capsys, monkeypatch):
    from ensdiag.report import load
    bound = max(path.stat().st_size for path in run.rglob("*.json*")) + 1  # every file the run holds fits
    monkeypatch.setattr(load, "MAX_FILE_BYTES", bound)
    (run / "batch-ensemble" / "seed-1" / "diversity.jsonl").write_text('{"epoch": 0}\n' * (bound // 10))
    assert_one_line_error(capsys, "report", run, "--no-figures", match=f"diversity.jsonl is damaged \\(larger than {bound:,} bytes")


@pytest.fixture
def lora_run(tmp_path, capsys):
    code, _, err = run_cli(capsys, "diversity", *ADAPTERS[:2], "--save", tmp_path / "runs", "--format", "json")
    assert code == 0, err
    return tmp_path / "runs"


@pytest.mark.parametrize("change,match", [
    (lambda s: s.update(k=-3), "k = -3, not a number of members"),
    (lambda s: s["summary"]["delta_cosine"].update(matrix=[[1.0]]), "delta_cosine matrix that is not 2×2"),
    (lambda s: s["summary"]["delta_cosine"].update(mean=5.0), "summary.delta_cosine.mean = 5.0"),
    (lambda s: s["summary"]["effective_rank"].update(mean=400.0), "summary.effective_rank.mean = 400.0"),
    (lambda s: s.update(members=["only one"]), "lists members that are not its k = 2"),
    (lambda s: s["summary"].update(norm=[1e308, 10**400]), "integer of 401 digits"),
])
def test_a_damaged_lora_section_is_refused_before_any_table_reads_it(lora_run, capsys, change, match):
    edit(lora_run / "lora" / "seed-0" / "lora.json", lambda record: change(record["lora"]))
    line = assert_one_line_error(capsys, "report", lora_run, "--no-figures", match=match)
    assert "save that run" in line


@pytest.fixture(scope="module")
def saved_metrics(tmp_path_factory):
    """A real metrics.json of an analysis with every split (id, shift, ood)."""
    import ensdiag
    import torch
    generator = torch.Generator().manual_seed(0)
    data = {name: torch.randn(90, 5, generator=generator) for name in ("id", "shift", "ood")}
    labels = torch.randint(0, 5, (90,), generator=generator)
    diagnosis = ensdiag.diagnose(lambda x: torch.stack([x, 0.5 * x, x.roll(1, 1)]), test=(data["id"], labels),
                                 shift=(data["shift"], labels), ood=data["ood"],
                                 measure=ensdiag.Measure(geometry=False))
    return json.loads(json.dumps(diagnosis.metrics))


def _values(node, path=()):
    """(path, value) of every number under a {"value": …} whose quantity has a known range."""
    from ensdiag.report.load import RANGES
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "value" and path and path[-1] in RANGES and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                yield path + ("value",), RANGES[path[-1]]
            else:
                yield from _values(value, path + (key,))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_range_checks_find_exactly_the_values_moved_outside(saved_metrics, data):
    from ensdiag.report.load import out_of_range
    assert out_of_range(saved_metrics) is None
    found = list(_values(saved_metrics))
    path, (low, high) = data.draw(st.sampled_from(found))
    inside = data.draw(st.floats(low, min(high, 1e300)))
    outside = data.draw(st.one_of(st.floats(-1e308, low - 1e-3), st.floats(high + 1e-3, 1e308))
                        if math.isfinite(high) else st.floats(-1e308, low - 1e-3))
    copy = json.loads(json.dumps(saved_metrics))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node["value"] = inside
    assert out_of_range(copy) is None
    node["value"] = outside
    assert out_of_range(copy).startswith(".".join(path))
