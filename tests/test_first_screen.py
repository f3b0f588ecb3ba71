"""The first screen: what `ensdiag report RUN --format summary` (the README's main job ends with it)
prints fits an 80 × 24 terminal, each efficient method's line leads with its effective ensemble size
and interval, and every terminal table of the report fits 80 columns without hiding a number."""

import io
import json
import math
import re

import pytest
import torch


from .cli import run_cli
from .test_effective_size import K, grid_runs, sizes_of, write_folder

METHODS = {"single": [0], "mc-dropout": [K] * K, "deep-ensemble": list(range(K)),
           "batch-ensemble": list(range(K, 2 * K))}  # MC Dropout as copies: it reads 1; BatchEnsemble as a second DE
EFFICIENT = {"mc-dropout": "MC Dropout", "batch-ensemble": "BatchEnsemble"}


@pytest.fixture(scope="module")
def screen_run(tmp_path_factory):
    """The main job's four methods × three seeds (synthetic predictions, known sizes)."""
    from ensdiag.analysis import analyze_predictions
    from ensdiag.io import atomic_write_json
    from ensdiag.predictions import load_predictions
    (root := tmp_path_factory.mktemp("first-screen") / "runs").mkdir()
    run = write_folder(root / "demo", METHODS, grid_runs(n=400, n_val=200))
    for path in run.glob("*/seed-*/predictions.safetensors"):  # the per-split tables' numbers, 4 methods wide
        atomic_write_json(path.parent / "metrics.json", analyze_predictions(load_predictions(path)[0]))
    return run


@pytest.fixture(scope="module")
def screen_report(screen_run):
    from ensdiag.report import make_report
    return make_report(screen_run, write=False)


def check_summary(text: str, sizes: dict):
    """≤ 24 lines of ≤ 80 columns; each efficient method's line leads with its size and interval."""
    lines = text.splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80, text
    for method, label in EFFICIENT.items():
        found = sizes[method]["cnll"]
        low, high = found["interval"]
        line = next(line for line in lines if line.startswith(label + " "))
        # "BatchEnsemble (k = 4) ≡ a Deep Ensemble of 4.1 [3.2, 5.0] members" (or "… 1.0, ∞) members")
        lead = re.match(rf"{label} \(k = {K}\) ≡ a Deep Ensemble of ([\d.,]+) \[([\d.,]+), ([\d.,]+|∞)[\])] members",
                        line)
        assert lead, line
        assert float(lead[1].replace(",", "")) == pytest.approx(found["value"], abs=0.05)
        assert float(lead[2].replace(",", "")) == pytest.approx(low, abs=0.05)
        assert lead[3] == "∞" if high == float("inf") else float(lead[3].replace(",", "")) == pytest.approx(high, abs=0.05)
    assert sizes["mc-dropout"]["cnll"]["value"] == pytest.approx(1.0, abs=0.05)  # copies of one member
    return lines


def test_the_summary_fits_80_by_24_and_leads_each_efficient_method_with_its_size(screen_report, screen_run):
    """What `ensdiag report runs/demo --format summary` prints once the report is written (the
    command's own run, figures and all, is the slow test below)."""
    from ensdiag.report import render
    report = {**screen_report, "run": "runs/demo", "written": "report.md, report.html and figures/ written to runs/demo"}
    lines = check_summary(render(report, "summary", "runs/demo"), screen_report["effective_size"])
    assert "Open it: python3 -m webbrowser runs/demo/report.html" in lines


@pytest.mark.slow
def test_the_main_jobs_last_command_prints_that_screen(screen_run, capsys, monkeypatch):
    """As the README's main job ends: `ensdiag report runs/demo --format summary` at COLUMNS=80."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(screen_run.parents[1])
    code, out, err = run_cli(capsys, "report", "runs/demo", "--format", "summary")
    assert code == 0, err
    code, text, err = run_cli(capsys, "report", "runs/demo", "--format", "json", "--no-figures")
    lines = check_summary(out, json.loads(text)["effective_size"])
    assert "Open it: python3 -m webbrowser runs/demo/report.html" in lines


def test_sizes_come_from_predictions_alone_llm_padding_included(tmp_path):
    """A folder of predictions only (no model file, as `ensdiag analyze` saves an LLM's adapters'
    answers), its questions padded with choices of probability 0 as lm-eval logs of fewer choices are
    (foreign/predictions.PAD_LOGIT): the sizes are those of the unpadded predictions."""
    from ensdiag.foreign.predictions import PAD_LOGIT
    pool = grid_runs(seeds=(1, 2), n=300, n_val=150)
    padded = {seed: {"test": (torch.nn.functional.pad(data["test"][0], (0, 2), value=PAD_LOGIT), data["test"][1]),
                     "val": (torch.nn.functional.pad(data["val"][0], (0, 2), value=PAD_LOGIT), data["val"][1]),
                     "ood": torch.nn.functional.pad(data["ood"], (0, 2), value=PAD_LOGIT)}
              for seed, data in pool.items()}
    methods = {"deep-ensemble": list(range(K)), "lora-r4": list(range(K, 2 * K))}
    plain = sizes_of(write_folder(tmp_path / "plain", methods, pool))
    root = write_folder(tmp_path / "padded", methods, padded)
    assert {path.name for path in root.rglob("*") if path.is_file()} == {
        "experiment.json", "predictions.safetensors", "metrics.json", "meta.json"}
    found = sizes_of(root)
    for metric in ("cnll", "brier", "auroc"):
        assert found["lora-r4"][metric]["value"] == pytest.approx(plain["lora-r4"][metric]["value"], rel=1e-6), metric
        assert found["lora-r4"][metric]["interval"] == pytest.approx(plain["lora-r4"][metric]["interval"], rel=1e-6)
    assert found["deep-ensemble"]["cnll"]["value"] == pytest.approx(K, rel=1e-9)


def test_every_terminal_table_fits_80_columns_and_hides_no_number(screen_report):
    from rich.console import Console

    from ensdiag.report import to_rich
    from ensdiag.report.render import cell_text
    report = screen_report
    assert any(table["id"] == "id" and len(table["rows"]) == 4 for table in report["tables"])  # 4 methods wide
    console = Console(width=80, record=True, file=io.StringIO())
    for part in to_rich(report, width=80):
        console.print(part)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    squeezed = "".join(text.split())  # a cell may wrap inside its column, never lose a character
    for table in report["tables"]:
        for row in table["rows"]:
            for index, cell in enumerate(row["cells"]):
                shown = "".join(cell_text(cell, table["id"], index, compact=True).split())
                assert shown in squeezed, (table["id"], row["method"], shown)


@pytest.mark.parametrize("value, interval, extrapolated, said", [
    (1.14, [1.0, 1.31], False, "(k = 4) ≡ a Deep Ensemble of 1.1 [1.0, 1.3] members"),
    (3.2, [2.1, 5.5], True, "(k = 4) ≡ a Deep Ensemble of 3.2 [2.1, 5.5] members, upper bound extrapolated beyond its 4"),
    (6.0, [4.5, float("inf")], True, "(k = 4) ≡ a Deep Ensemble of 6.0 [4.5, ∞) members, extrapolated beyond its 4"),
    (1234.0, [12.0, float("inf")], True, "≡ a Deep Ensemble of 1,234 [12, ∞) members, extrapolated beyond its 4"),
])
def test_a_size_beyond_the_deep_ensembles_is_said_to_be_extrapolated(value, interval, extrapolated, said):
    from ensdiag.report.verdict_text import size_phrase
    sizes = {"members": 4, "reference_members": 4,
             "cnll": {"value": value, "interval": interval, "extrapolated": extrapolated}}
    assert said in size_phrase(sizes)
    assert ("extrapolated" in size_phrase(sizes)) == extrapolated


def test_one_diagnosis_per_split_table_fits_80_columns_with_every_cell_whole():
    """`evaluate`/`analyze`'s per-split table: wider than the terminal, its splits become columns,
    as many side by side as 80 columns hold; every cell of the wide table is in them, whole."""
    from rich.console import Console

    from ensdiag.core import inspect_predictions
    from ensdiag.report.terminal import _split_rows, metrics_tables
    generator = torch.Generator().manual_seed(0)
    predictions = {split: {"logits": torch.randn(4, 300, 10, generator=generator),
                           "labels": torch.randint(0, 10, (300,), generator=generator) if split != "ood" else None}
                   for split in ("id", "shift", "val", "ood")}
    metrics = json.loads(inspect_predictions(predictions).to_json())
    tables = metrics_tables(metrics, "toy", width=80)
    assert len(tables) > 1  # 4 splits of intervals do not fit side by side
    printed = ""
    for table in tables:
        buffer = io.StringIO()
        Console(file=buffer, width=80).print(table)
        printed += buffer.getvalue()
    assert max(len(line) for line in printed.splitlines()) <= 80
    for split, cells in _split_rows(metrics):
        assert split in printed and all(cell in printed for cell in cells)
    wide = metrics_tables(metrics, "toy", width=None)
    assert len(wide) == 1 and len(wide[0].columns) == 9  # no width: the splits as rows, as before


@pytest.mark.parametrize("width", [80, 60])
def test_every_table_of_one_diagnosis_fits_the_terminal_with_every_number_whole(width):
    """All of `evaluate`/`analyze`'s tables at 80 columns — the per-split, OOD and conformal ones — with
    every number of the wide tables (intervals included) printed whole, and the OOD scores' short
    names defined in a note; with no width the wide tables are as before."""
    from rich.console import Console

    from ensdiag.core import inspect_predictions
    from ensdiag.report.inspection import metrics_view
    from ensdiag.report.terminal import cell
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 10, (400,), generator=generator)
    predictions = {"id": {"logits": torch.randn(4, 400, 10, generator=generator)
                          + 3 * torch.nn.functional.one_hot(labels, 10), "labels": labels},
                   "ood": {"logits": torch.randn(4, 300, 10, generator=generator), "labels": None}}
    metrics = json.loads(inspect_predictions(predictions).to_json())
    tables, notes = metrics_view(metrics, "toy", width=width)
    buffer = io.StringIO()
    for table in tables:
        Console(file=buffer, width=10_000).print(table)  # as wide as they are: rich would crop them to the console
    printed = buffer.getvalue()
    assert max(len(line) for line in printed.splitlines()) <= width and "…" not in printed, printed
    analyzers = metrics["analyzers"]
    for name, entry in analyzers["ood"]["scores"].items():
        assert name in printed and f"{name}: {entry['score']}" in " ".join(notes)
        for key in ("auroc", "aupr_out", "aupr_in", "fpr95_ood_as_id", "fpr95_id_as_ood"):
            assert cell(entry[key], interval=True) in printed or (cell(entry[key]) in printed
                                                                   and not entry[key].get("interval"))
    scores = analyzers["conformal"]["scores"]
    for found in (scores["lac"], scores["aps"]):
        for key in ("coverage", "set_size"):
            assert cell(found[key], interval=True) in printed
    wide, _ = metrics_view(metrics, "toy", width=None)
    assert [len(table.columns) for table in wide][-2:] == [6, 6]  # the OOD and conformal tables as they were


def _json_numbers(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _json_numbers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _json_numbers(value)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield node


def test_every_number_on_the_first_screen_is_in_the_reports_json(screen_report):
    """The screen says nothing the report's JSON does not hold: each number on a method's line is one of the
    JSON's effective sizes, intervals, seed counts or seeds needed (with their ranges), as printed."""
    import math

    from ensdiag.report import render
    report = json.loads(json.dumps({**screen_report, "run": "runs/demo", "written": None}, default=str))
    text = render(report, "summary", "runs/demo")
    shown = set()
    for value in _json_numbers({"sizes": report["effective_size"], "verdict": report["verdict"],
                                "seeds": len(report["seeds"])}):
        if math.isfinite(value):
            shown |= {f"{value:.1f}", f"{value:,.0f}", f"{value * 100:.0f}", f"{value:.2f}", f"{value:.3g}"}
    lines = [line for line in text.splitlines()[2:] if not line.startswith(("Report:", "Open it:", "  number behind"))]
    numbers = [token for line in lines for token in re.findall(r"\d[\d,]*(?:\.\d+)?", line)]
    assert numbers and all(token in shown for token in numbers), [token for token in numbers if token not in shown]


@pytest.mark.parametrize("sizes, said", [
    ({"cnll": {"value": 2.6, "interval": [1.0, math.inf]}}, "(k = 1): 3 seeds cannot tell it from one Deep-Ensemble member"),
    ({"cnll": {"value": 4.0, "interval": [4.0, 4.0]}, "reference": True}, "(k = 4): the reference, ≡ 4 members by construction"),
    ({"cnll": {"value": 1.0, "interval": [1.0, 1.0]}}, "≡ no more than one Deep-Ensemble member, on every resample"),
    ({"cnll": {"value": 2.6, "interval": [1.8, math.inf]}}, "≡ a Deep Ensemble of 2.6 [1.8, ∞) members"),
])
def test_a_size_is_a_point_only_where_its_interval_says_something(sizes, said):
    """No line leads with a point whose interval is [1, ∞): the seeds cannot tell the method from one member; the
    Deep Ensemble is the reference (K by construction, not a measurement); no zero-width interval is printed."""
    from ensdiag.report.verdict_text import size_phrase
    k = 4 if sizes.get("reference") or "[1.8" in said or "no more" in said else 1
    phrase = size_phrase({"members": k, "reference_members": 4, "seeds": 3, **sizes})
    assert said in phrase and "[1.0, ∞)" not in phrase and "[4.0, 4.0]" not in phrase


def test_overlapping_printed_sizes_are_said_not_to_be_ranked():
    from ensdiag.report.verdict_text import to_summary
    sizes = {"a": {"members": 4, "reference_members": 4, "seeds": 3, "cnll": {"value": 1.5, "interval": [1.2, 2.0]}},
             "b": {"members": 4, "reference_members": 4, "seeds": 3, "cnll": {"value": 1.8, "interval": [1.4, 3.0]}},
             "c": {"members": 4, "reference_members": 4, "seeds": 3, "cnll": {"value": 3.5, "interval": [3.1, 3.9]}}}
    text = to_summary({"run": "r", "methods": ["a", "b", "c"], "effective_size": sizes, "labels": {}, "seeds": [1, 2, 3],
                       "verdict": {"x": {}}})
    assert "The sizes of a and b: their intervals overlap, so these seeds do not rank them." in " ".join(text.split())
