"""A budget, not a fixed cost: examples chosen from measured costs, early stops at a precision
target, every step's choice recorded and every skipped step saying why."""

import json
import math
import re
import time

import pytest
import torch

import ensdiag
from ensdiag.core.planned_predictions import NEED_MARGIN, random_order
from ensdiag.numbers import parse_precision, parse_seconds
from ensdiag.errors import EnsdiagError

from .cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("given,seconds", [("5m", 300), ("90s", 90), ("1h30m", 5400), ("1.5h", 5400), ("300", 300),
                                           (42, 42)])
def test_durations_are_read_with_their_units(given, seconds):
    assert parse_seconds(given) == seconds


@pytest.mark.parametrize("given", ["", "5 minutes", "1e3", "-5m", "0s", "m"])
def test_a_budget_that_is_not_a_duration_is_refused(given):
    with pytest.raises(EnsdiagError, match="budget"):
        parse_seconds(given)
    with pytest.raises(EnsdiagError, match="precision"):
        parse_precision("nan")


class Ensemble(torch.nn.Module):
    """Three members that see a little of the input each; `delay` seconds per example, as a big network would."""

    def __init__(self, delay=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(6, 4) for _ in range(3))
        self.delay = delay

    def forward(self, x):
        time.sleep(self.delay * len(x))
        return torch.stack([layer(x + 0.3 * i) for i, layer in enumerate(self.layers)])


def _data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, :4].argmax(1) + (torch.rand(n, generator=g) < 0.3).long()) % 4


@pytest.mark.slow
@pytest.mark.clock  # wall-clock budgets: run alone
def test_a_budget_reads_a_seeded_random_subsample_and_says_so():
    x, y = _data(4000)
    diagnosis = ensdiag.diagnose(Ensemble(delay=5e-4), test=(x, y), ood=_data(4000, seed=1)[0],
                                 measure=ensdiag.Measure(budget="2s"),
                                 context=ensdiag.Context(progress=False))
    record = diagnosis.metrics["budget"]
    step, ood = (next(step for step in record["steps"] if step["step"] == f"predict {name}") for name in ("id", "ood"))
    n = step["n"]
    assert 0 < n < 4000 and step["of"] == 4000 and step["stopped"] == "budget"
    assert ood["n"] < 4000 and 0.5 < ood["n"] / n < 2  # the splits share the budget alike
    assert diagnosis.metrics["splits"]["id"]["n"] == n
    assert torch.equal(diagnosis.predictions["id"]["labels"], y[random_order("id", 4000)[:n]])  # seeded, not the first n
    nll = diagnosis.metrics["analyzers"]["calibration"]["splits"]["id"]["nll"]["interval"]
    assert nll["n"] == n and nll["full_split"]["of"] == 4000
    assert nll["low"] <= nll["full_split"]["low"] <= nll["full_split"]["high"] <= nll["high"]
    assert record["seconds"] == 2 and record["costs"]["predict per example"] > 0 and record["full_estimate_seconds"] > 0


@pytest.mark.slow
@pytest.mark.clock  # wall-clock budgets: run alone
def test_a_precision_target_stops_a_split_once_its_headline_intervals_are_narrow():
    x, y = _data(40_000)
    diagnosis = ensdiag.diagnose(Ensemble(), test=(x, y), measure=ensdiag.Measure(detail=True, precision=0.03),
                                 context=ensdiag.Context(progress=False))
    step = next(step for step in diagnosis.metrics["budget"]["steps"] if step["step"] == "predict id")
    assert step["stopped"] == "precision reached" and step["n"] < 40_000 and step["half_width"] <= 0.03
    widths = [(entry["high"] - entry["low"]) / 2 for entry in _headline_intervals(diagnosis.metrics)]
    assert widths and max(widths) <= 0.03 * 1.25  # the stored intervals (1,000 resamples) agree with the check (200)
    adaptive = diagnosis.metrics["analyzers"]["calibration"]["splits"]["id"]["ece_adaptive"]["interval"]
    assert adaptive["low"] is not None  # a detail number keeps its interval, however wide, without holding the split back


def _headline_intervals(metrics):
    from types import SimpleNamespace

    from ensdiag.analysis import all_analyzers
    from ensdiag.core.intervals import targets
    for name, analyzer in all_analyzers().items():
        result = metrics["analyzers"].get(name, {})
        if analyzer.needs != "predictions" or result.get("status") != "ok":
            continue
        headline = SimpleNamespace(columns=[c for c in analyzer.columns if c.headline])
        for path, _ in targets(headline, result, {"id": {"logits": torch.zeros(1, 1, 1)}}):
            node = result
            for key in path[:-1]:
                node = node[key]
            if node.get("interval", {}).get("low") is not None:
                yield node["interval"]


def _intervals(node):
    if isinstance(node, dict):
        if "interval" in node and isinstance(node["interval"], dict):
            yield node["interval"]
        for child in node.values():
            yield from _intervals(child)


@pytest.mark.slow
@pytest.mark.clock  # wall-clock budgets: run alone
def test_a_stream_is_read_in_its_own_order():
    x, y = _data(20_000)
    stream = ((x[i:i + 500], y[i:i + 500]) for i in range(0, 20_000, 500))
    diagnosis = ensdiag.diagnose(Ensemble(), test=stream, measure=ensdiag.Measure(precision=0.05),
                                 context=ensdiag.Context(progress=False))
    n = diagnosis.metrics["splits"]["id"]["n"]
    assert 0 < n < 20_000 and torch.equal(diagnosis.predictions["id"]["labels"], y[:n])


def _model_and_data():
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 4, (1, 6, 6))
    g = torch.Generator().manual_seed(3)
    x = torch.rand(1500, 1, 6, 6, generator=g)
    return model, (x, torch.randint(0, 4, (1500,), generator=g)), torch.rand(800, 1, 6, 6, generator=g)


@pytest.mark.slow
@pytest.mark.clock  # wall-clock budgets: run alone
def test_geometry_steps_report_what_they_read_and_a_step_out_of_time_says_why():
    from ensdiag.report.inspection import diversity_view
    model, test, ood = _model_and_data()
    roomy = ensdiag.diagnose(model, test=test, ood=ood, train=test,
                             measure=ensdiag.Measure(detail=True, budget="10m"),
                             context=ensdiag.Context(progress=False))
    steps = {step["step"]: step for step in roomy.metrics["budget"]["steps"]}
    assert steps["paths"]["pairs"] == 2 and steps["paths"]["points"] == [11, 11] and steps["paths"]["n"] > 0
    assert set(steps["cka"]["n"]) == {"id", "ood"} and steps["cka"]["half_width"]["id"] is not None
    assert roomy.metrics["analyzers"]["paths"]["loss_barrier"]["interval"]["n"] == steps["paths"]["n"]
    assert roomy.metrics["analyzers"]["cka"]["splits"]["id"]["mean"]["interval"]["low"] is not None
    # ever tighter budgets (a fast machine fits everything in 0.6 s; a loaded one refuses it, naming its least)
    # until one leaves member geometry out: every budget accepted on the way is a limit, every step ok or skipped
    budgets, tight, tried = [0.6, 0.45, 0.35, 0.25, 0.18], None, 0
    while budgets and tried < 8:
        budget, tried = budgets.pop(0), tried + 1
        try:
            found = ensdiag.diagnose(model, test=test, ood=ood, train=test,
                                     measure=ensdiag.Measure(budget=f"{budget:g}s"),
                                     context=ensdiag.Context(progress=False))
        except EnsdiagError as refusal:
            named = re.search(r"give at least ([\d.]+) s", str(refusal))
            if named is None:
                pytest.fail(str(refusal))
            least = math.ceil(float(named.group(1)) / (1 + NEED_MARGIN) * 20) / 20  # the least, without the margin
            assert least <= 3, f"{budget:g} s was refused, naming {least:g} s (a pilot of this toy costs well under 1 s)"
            budgets = [least] if least > budget else []
            continue
        record = found.metrics["budget"]
        assert record["spent_seconds"] <= budget * 1.1 + 0.2  # a budget is a limit (and 0.2 s for what it cannot stop)
        for name in ("cka", "paths", "alignment", "rank-structure"):
            result = found.metrics["analyzers"][name]
            assert result["status"] == "ok" or (result["status"] == "skipped" and result["reason"].startswith("budget: ")
                                                and record["skipped"][name])
        if record["skipped"]:
            tight = found
            break
    assert tight is not None, "no budget between the least and 0.6 s left member geometry out"
    items, notes = diversity_view(tight.metrics, "toy")
    assert any("skipped —" in note for note in notes)


@pytest.mark.slow
@pytest.mark.clock  # wall-clock budgets: run alone
def test_a_budget_that_cannot_hold_the_least_is_refused_before_it_is_spent():
    """Reading 32 examples of each of 5 splits takes this ensemble about 1.6 s (10 ms per example): a
    budget of 1 s is refused after its pilot, naming what it would need; 4 s holds it, and ends in time."""
    x, y = _data(400)
    splits = {"test": (x, y), "ood": _data(400, seed=1)[0], "shift": (x + 1, y), "val": (x - 1, y)}
    began = time.perf_counter()
    with pytest.raises(EnsdiagError, match=r"a budget of 1 s cannot hold the least .* give at least [\d.]+ s"):
        ensdiag.diagnose(Ensemble(delay=0.01), measure=ensdiag.Measure(budget="1s"), context=ensdiag.Context(progress=False), **splits)
    assert time.perf_counter() - began < 1.5  # said after the pilot, not after the budget
    began = time.perf_counter()
    diagnosis = ensdiag.diagnose(Ensemble(delay=0.01), measure=ensdiag.Measure(budget="4s"), context=ensdiag.Context(progress=False), **splits)
    assert time.perf_counter() - began <= 4 * 1.1 + 1  # within the budget and 10 % (and Python's own start of it)
    assert all(diagnosis.metrics["splits"][name]["n"] >= 32 for name in ("id", "ood", "shift", "val"))


@pytest.mark.slow
@pytest.mark.clock  # wall-clock budgets: run alone
def test_the_commands_take_a_budget_and_refuse_a_bad_one(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    assert_one_line_error(capsys, "evaluate", path, "--budget", "soon", match="not a duration")
    assert_one_line_error(capsys, "diversity", path, "--precision-target", "-1", match="above 0")
    code, out, err = run_cli(capsys, "evaluate", path, "--budget", "20s", "--format", "json")
    assert code == 0
    record = json.loads(out)["budget"]
    assert record["seconds"] == 20 and any(step["step"] == "predict id" for step in record["steps"])
    code, out, err = run_cli(capsys, "diversity", path, "--precision-target", "0.05")
    assert code == 0 and "a target half-width of 0.05" in err and "predict id:" in err
