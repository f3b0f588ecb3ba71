"""Coverage on populations ensdiag did not make (benchmarks/interval_coverage.py): the committed record holds
every example-level column covering at the floor, or printing no interval with its reason; a few
cells run again here with the code as it is now; the populations' truths agree with ensdiag's own
numbers on a large draw (written independently, with numpy alone)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # coverage simulations: the slow tier

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    """A module of benchmarks/ (scripts, not a package: loaded from their files)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


P = _script("coverage_populations")
C = _script("interval_coverage")
R = _script("coverage_resume")


def _record() -> dict:
    records = sorted((ROOT / "benchmarks" / "results").glob("coverage-*.json"))
    assert records, "no coverage record committed (python benchmarks/interval_coverage.py)"
    return json.loads(records[-1].read_text())


def _refused_now() -> dict:
    """{column key: reason} of the columns the code as it is prints no interval for, with its reason
    (on one drawn test set): the record's tallies of their former construction are why."""
    import torch

    from ensdiag.core import inspect_predictions
    population, rng = P.POPULATIONS["over-confident"], np.random.default_rng(0)
    drawn = {split: population.draw(split, 300, rng) for split in ("id", "shift", "ood")}
    predictions = {split: {"logits": torch.from_numpy(found["logits"]),
                           "labels": None if found["labels"] is None else torch.from_numpy(found["labels"])}
                   for split, found in drawn.items()}
    metrics = json.loads(inspect_predictions(predictions, detail=True).to_json())
    found = {}

    def walk(node, path):
        if isinstance(node, dict):
            interval = node.get("interval")
            if isinstance(interval, dict) and interval.get("low") is None and interval.get("note"):
                found["/".join((*path, "value"))] = interval["note"]
            for key, child in node.items():
                walk(child, (*path, key))
    walk(metrics["analyzers"], ())
    return found


def _failures(cells: list[dict], floor: float, refused: dict | None = None) -> list[str]:
    """Every (cell, column) whose printed interval's coverage has a binomial upper bound below the
    floor, prints a value outside it, or prints no interval without a reason; every column that never
    covers. `refused`: columns the code now prints no interval for (their tallies are the why)."""
    found, covers = [], {}
    for cell in cells:
        for key, column in cell["columns"].items():
            if key in (refused or {}):
                continue
            tally, where = column["ensdiag"], f"{cell['population']} N = {cell['n']}: {key}"
            if not tally["replicates"]:
                if not column["notes"]:
                    found.append(f"{where}: no interval and no reason")
                continue
            if tally["value_outside"] and not (key.startswith("paths/") and column["truth"] == 0.0):
                # (a barrier of identical curves prints 1.1e-16 beside [0, 0]: records before C.ROUNDING count it)
                found.append(f"{where}: the value outside its interval {tally['value_outside']} times")
            if tally.get("covered") is None:  # no population value to cover (a direction of a zero ECE)
                continue
            covers[key] = covers.get(key, 0) + tally["covered"]
            if tally["coverage_interval"][1] < floor:
                found.append(f"{where}: covered {tally['covered']} of {tally['replicates']} "
                             f"(upper bound {tally['coverage_interval'][1]:.3f})")
    found += [f"{key} never covers" for key, hits in covers.items() if hits == 0]
    return found


def test_the_committed_record_shows_every_column_covering_or_saying_why_not():
    record = _record()
    assert record["cells"] and record["settings"]["level"] == 0.95
    refused = _refused_now()
    assert {"calibration/splits/id/mce/value", "calibration/splits/id/ece_direction/value"} <= set(refused)
    assert not _failures(record["cells"], record["settings"]["floor"], refused)
    sizes = {cell["n"] for cell in record["cells"]}
    assert sizes == set(C.SIZES)  # every N of the issue
    reached = min(max(part["to"][str(n)] for part in record["parts"] if "to" in part) for n in sizes)
    assert reached >= C.REPLICATES, f"the record holds {reached} replicates per cell, the issue asks for {C.REPLICATES}"
    mce = [cell["columns"]["calibration/splits/id/mce/value"] for cell in record["cells"]
           if "calibration/splits/id/mce/value" in cell["columns"]]
    assert mce and all(column["ensdiag"]["replicates"] == 0 and column["notes"] for column in mce)


# one cell with the code as it is: at 24 replicates per run, the ~50 columns of a full population would make a
# false alarm likely in CI; the committed record (200 replicates per cell, confirmed where under) is where coverage is judged
@pytest.mark.parametrize("population, n", [("hard OOD", 1000)])
def test_a_few_cells_run_again_cover(population, n):
    """The record's code may be older than the code: a few cells with the code as it is now (the
    floor over 24 replicates is loose, but a construction that misses most of the time fails it)."""
    truths = P.true_values(P.POPULATIONS[population], 100_000)
    columns = C.run_cell(population, n, range(24), truths)
    assert len(columns) > (40 if P.POPULATIONS[population].everything else 8)
    assert not _failures([{"population": population, "n": n, "columns": columns}], C.FLOOR)


def test_the_truths_are_ensdiag_s_values_on_a_large_draw():
    """The truths are written from the definitions alone; on 200,000 drawn examples ensdiag's own
    plug-in values sit at them (the smooth statistics within their sampling error)."""
    import torch

    from ensdiag.analysis import analyze_predictions
    population = P.POPULATIONS["over-confident"]
    truths = P.true_values(population, 200_000)
    rng = np.random.default_rng(0)
    drawn = {split: population.draw(split, 200_000, rng) for split in ("id", "ood")}
    predictions = {split: {"logits": torch.from_numpy(found["logits"]),
                           "labels": None if found["labels"] is None else torch.from_numpy(found["labels"])}
                   for split, found in drawn.items()}
    metrics = analyze_predictions(predictions, only=["calibration", "disagreement", "ood", "ensemble-gain"])
    for key, tolerance in [("calibration/splits/id/accuracy/value", 0.004), ("calibration/splits/id/nll/value", 0.01),
                           ("calibration/splits/id/ece/value", 0.004), ("disagreement/splits/id/mean/value", 0.003),
                           ("ood/scores/msp/auroc/value", 0.004), ("ensemble-gain/splits/id/kl_diversity/value", 0.002)]:
        name, *path = key.split("/")
        node = metrics["analyzers"][name]
        for part in path:
            node = node[part]
        assert node == pytest.approx(truths[key], abs=tolerance), key


def test_a_record_resumes_across_a_change_that_moves_no_number_and_names_one_that_does():
    """--resume after the measured code changed: replicate 0 of every cell by the record's commit (a git
    worktree) and by the code now. HEAD and the working tree agree on every number here (the suite runs on
    committed code); a moved interval end or a column present once only is named."""
    import argparse
    import subprocess
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    if R.uncommitted():
        pytest.skip("the measured files have uncommitted changes: HEAD is not the code here")
    args = argparse.Namespace(populations=["easy OOD"], sizes=[200], only=["ood"])
    R.same_numbers("HEAD", ["benchmarks/interval_coverage.py"], args)  # raises SystemExit where a number moved
    real = R.differences
    R.differences = lambda then, now, tolerance: real(then, {cell: {} for cell in now}, tolerance)  # every column gone
    try:
        with pytest.raises(SystemExit, match=r"gives other numbers \(\d+\), e.g. easy OOD\|200 \S+: only then"):
            R.same_numbers("HEAD", ["benchmarks/interval_coverage.py"], args)
    finally:
        R.differences = real
    outcome = {"value": 0.9, "ensdiag": [0.8, 0.95], "note": None, "construction": "logit",
               "candidates": {"percentile": [0.85, 0.93]}}
    then = {"easy OOD|200": {"ood/auroc": outcome, "ood/aupr": outcome}}
    assert R.differences(then, json.loads(json.dumps(then))) == []
    nudged = {"easy OOD|200": {"ood/auroc": {**outcome, "ensdiag": [0.8, 0.95 * (1 + 1e-13)]}, "ood/aupr": outcome}}
    assert R.differences(then, nudged) == []  # the last bits of a sum taken in another order
    added = {"easy OOD|200": {key: {**outcome, "candidates": {**outcome["candidates"], "logit": [0.7, 0.96]}}
                              for key in ("ood/auroc", "ood/aupr")}}
    assert R.differences(then, added) == []  # a candidate added since: tallied from the replicates it ran on
    moved = {"easy OOD|200": {"ood/auroc": {**outcome, "candidates": {"percentile": [0.85, 0.931]}}}}
    found = R.differences(then, moved)
    assert len(found) == 2 and "ood/aupr: only then" in found[0] and "ood/auroc: candidates" in found[1]


def test_a_cell_under_the_floor_is_confirmed_on_fresh_replicates_of_its_column_alone():
    """coverage_confirm.py: a (cell, column) under the floor gets fresh replicates (indices from FIRST on)
    of its analyzer alone, added to its tallies — the same tallies a run of those replicates gives — the
    other columns untouched; a confirmed pair is not confirmed again, a resume goes on from the rounds'
    replicate index, and the docs table marks the pair."""
    F, docs_tables = _script("coverage_confirm"), _script("docs_tables")
    population, n, key = "calibrated", 200, "disagreement/splits/id/mean/value"
    truths = P.true_values(P.POPULATIONS[population], 20_000)
    columns = C.run_cell(population, n, range(2), truths, only=["disagreement", "uncertainty"])
    low = {**columns[key]["ensdiag"], "covered": 0, "coverage_interval": C.clopper_pearson(0, 2)}  # as if both missed
    columns[key] = {**columns[key], "ensdiag": low}
    untouched = json.loads(json.dumps(columns))
    record = {"settings": {"floor": C.FLOOR, "sizes": [n], "replicates_wanted": 2, "truth_examples": 20_000, "level": 0.95},
              "populations": {population: {"description": "", "truths": truths}},
              "cells": [{"population": population, "n": n, "columns": columns}],
              "parts": [{"commit": "abc", "from": {str(n): 0}, "to": {str(n): 2}}]}
    assert F.under_floor(record) == [(population, n, key)]
    F.confirm(record, F.under_floor(record), replicates=3)
    fresh = C.run_cell(population, n, range(F.FIRST, F.FIRST + 3), truths, only=["disagreement"])[key]["ensdiag"]
    tally = record["cells"][0]["columns"][key]["ensdiag"]
    assert tally["replicates"] == 5 and tally["covered"] == fresh["covered"]
    assert tally["coverage_interval"] == pytest.approx(C.clopper_pearson(fresh["covered"], 5))
    after = json.loads(json.dumps(record["cells"][0]["columns"]))
    assert {k: v for k, v in after.items() if k != key} == {k: v for k, v in untouched.items() if k != key}
    part = record["parts"][-1]["confirm"]
    assert {name: part[name] for name in ("population", "n", "columns", "from", "to")} == \
        {"population": population, "n": n, "columns": [key], "from": F.FIRST, "to": F.FIRST + 3}
    assert part["fresh"][key]["covered"] == fresh["covered"] and part["fresh"][key]["replicates"] == 3  # apart
    assert F.under_floor(record) == []  # confirmed once
    record["populations"][population]["truths"] = json.loads(json.dumps(truths))
    _, start, parts, _ = R.resumed(record, {population: truths})
    assert start == {n: 2} and parts[-1] == record["parts"][-1]  # the rounds go on from replicate 2
    rendered = "\n".join(docs_tables.coverage(record | {"populations": {population: {}}}))
    assert "replicates per cell: 2 at N = 200" in rendered and f"† of 5 ({population})" in rendered
    assert f"the fresh replicates alone: {fresh['covered']} of 3" in rendered
