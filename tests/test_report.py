"""Reports from a run folder built by a fixture: two methods x three seeds with known metrics."""

import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from importlib.resources import files

import jsonschema
import pytest
import torch
from scipy import stats

from ensdiag.analysis import analyze_predictions
from ensdiag.config import preset_config
from ensdiag.experiment import prepare_run_dir
from ensdiag.io import atomic_write_json
from ensdiag.predictions import save_predictions
from ensdiag.report import make_report, render

from .cli import run_cli

SEEDS = (1, 2, 3)
ACCURACY = {"single": (0.90, 0.92, 0.94), "deep-ensemble": (0.95, 0.96, 0.97)}
NLL = {"single": (0.30, 0.28, 0.35), "deep-ensemble": (0.20, 0.22, 0.18)}


def fake_predictions(k, seed):
    g = torch.Generator().manual_seed(seed)
    return {"id": {"logits": torch.randn(k, 60, 10, generator=g) * 3, "labels": torch.randint(0, 10, (60,), generator=g)},
            "shift/blur": {"logits": torch.randn(k, 40, 10, generator=g), "labels": torch.randint(0, 10, (40,), generator=g)},
            "ood": {"logits": torch.randn(k, 50, 10, generator=g), "labels": None}}


@pytest.fixture
def run_dir(tmp_path):
    config = preset_config("digits", methods=["single", "deep-ensemble"], seeds=list(SEEDS), epochs=2)
    out = tmp_path / "run"
    prepare_run_dir(out, config, ["ensdiag", "train"])
    experiment = json.loads((out / "experiment.json").read_text())
    experiment.update(splits={"id": "digits test", "shift": "digits-C (procedural)", "ood": "natural-image patches"}, skipped={})
    atomic_write_json(out / "experiment.json", experiment)
    for method, k in (("single", 1), ("deep-ensemble", 3)):
        for index, seed in enumerate(SEEDS):
            folder = out / method / f"seed-{seed}"
            predictions = fake_predictions(k, seed)
            save_predictions(predictions, folder / "predictions.safetensors")
            from ensdiag.predictions import with_pooled_shift
            metrics = analyze_predictions(with_pooled_shift(predictions))
            calibration = metrics["analyzers"]["calibration"]["splits"]["id"]
            calibration["accuracy"]["value"] = ACCURACY[method][index]
            calibration["nll"]["value"] = NLL[method][index]
            atomic_write_json(folder / "metrics.json", metrics)
            atomic_write_json(folder / "meta.json", {"parameters": 1000 * k, "train_seconds": 2.0 * k + index})
            (folder / "history.jsonl").write_text("".join(json.dumps({"epoch": e, "loss": 1 / e, "val_accuracy": 0.5 + e / 10}) + "\n"
                                                          for e in (1, 2)))
    return out


def cell(report, table_id, method, column):
    table = next(t for t in report["tables"] if t["id"] == table_id)
    index = [c["name"] for c in table["columns"]].index(column)
    return next(r for r in table["rows"] if r["method"] == method)["cells"][index]


def test_ci_half_width_equals_scipy_t_interval(run_dir):
    report = make_report(run_dir, write=False)
    for method in ACCURACY:
        got = cell(report, "id", method, "Acc")
        values = ACCURACY[method]
        low, high = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / 3, scale=stats.sem(values))
        assert got["mean"] == pytest.approx(sum(values) / 3)
        assert got["ci"] == pytest.approx((high - low) / 2)
        assert got["n"] == 3


def test_diversity_table_shows_disagreement_on_id_shift_and_ood(run_dir):
    report = make_report(run_dir, write=False)
    table = next(t for t in report["tables"] if t["id"] == "diversity")
    assert [c["name"] for c in table["columns"]] == ["disagreement (id)", "disagreement (shift)",
                                                    "disagreement (ood)", "weight cosine", "weight cosine at init",
                                                    "weight cosine (aligned)", "aligned cosine, null"]
    shift = cell(report, "diversity", "deep-ensemble", "disagreement (shift)")
    expected = [json.loads((run_dir / "deep-ensemble" / f"seed-{s}" / "metrics.json").read_text())
                ["analyzers"]["disagreement"]["splits"]["shift"]["mean"]["value"] for s in SEEDS]
    assert shift["n"] == 3 and shift["mean"] == pytest.approx(sum(expected) / 3)


def test_best_and_second_marks_follow_the_column_direction(run_dir):
    report = make_report(run_dir, write=False)
    assert cell(report, "id", "deep-ensemble", "Acc")["mark"] == "best"  # ↑: higher wins
    assert "mark" not in cell(report, "id", "single", "Acc")  # of two, "second best" would only mean the worse
    assert cell(report, "id", "deep-ensemble", "NLL")["mark"] == "best"  # ↓: lower wins
    assert "mark" not in cell(report, "id", "single", "H")  # undirected columns are never marked


def test_a_second_best_needs_three_values_and_a_share_below_zero_is_no_ones_best():
    from ensdiag.report.aggregate import _marks
    rows = [{"cells": [{"mean": value}]} for value in (0.9, 0.5, -0.2)]
    _marks(rows, [("share", None, "up")], valid=lambda value: value >= 0)
    assert [row["cells"][0].get("mark") for row in rows] == ["best", None, None]  # -0.2 is not ranked
    rows = [{"cells": [{"mean": value}]} for value in (0.9, 0.5, 0.7)]
    _marks(rows, [("share", None, "up")])
    assert [row["cells"][0].get("mark") for row in rows] == ["best", None, "second"]


def parse_markdown_tables(text):
    tables, current = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            current = tables.setdefault(line[3:], [])
        elif line.startswith("| ") and current is not None and not line.startswith("| Method"):
            current.append([c.strip() for c in line.strip("|").split("|")])
    return tables


def test_markdown_parses_back_to_the_same_numbers_and_marks(run_dir):
    report = make_report(run_dir, write=False)
    tables = parse_markdown_tables(render(report, "markdown"))
    rows = {row[0]: row[1:] for row in tables["In-distribution (digits test)"]}
    for method, label in (("single", "Single"), ("deep-ensemble", "Deep Ensemble")):
        acc = rows[label][0]
        mean, half = map(float, re.sub(r"\*\*|</?ins>", "", acc).split("±"))
        expected = cell(report, "id", method, "Acc")
        assert mean == pytest.approx(expected["mean"], abs=5e-4) and half == pytest.approx(expected["ci"], abs=5e-4)
    assert rows["Deep Ensemble"][0].startswith("**") and not rows["Single"][0].startswith("<ins>")  # two rows: no second
    labels = [column["name"] for column in next(t for t in report["tables"] if t["id"] == "id")["columns"]]
    assert rows["Single"][labels.index("JSD")] == "N/A"  # JSD for k = 1


def test_json_validates_against_its_schema(run_dir, capsys):
    code, out, _ = run_cli(capsys, "report", run_dir, "--format", "json")
    assert code == 0
    schema = json.loads(files("ensdiag.report").joinpath("schema.json").read_text())
    jsonschema.validate(json.loads(out), schema)


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.images, self.headings, self._in_h2 = [], [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_h2 = tag == "h2"
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data):
        if self._in_h2:
            self.headings.append(data)
            self._in_h2 = False


def test_html_is_self_contained_with_every_table_and_figure(run_dir):
    report = make_report(run_dir)
    page = (run_dir / "report.html").read_text()
    parser = _Collector()
    parser.feed(page)
    assert parser.tags.count("table") == len(report["tables"])
    assert all(t["title"] in parser.headings for t in report["tables"])
    assert len(parser.images) == len(report["figures"]) >= 4
    assert all(src.startswith("data:image/png;base64,") for src in parser.images)
    assert "http://" not in page and "https://" not in page


def test_figures_exist_and_are_images(run_dir):
    headline = make_report(run_dir)
    assert all(figure["svg"] is None for figure in headline["figures"])  # PNG unless asked
    assert {f["name"] for f in headline["figures"]} == {"diversity", "reliability", "ood-scores", "training", "risk-coverage"}
    # the detail catalogue's figures are named where the figures are, and drawn on request
    import html

    from ensdiag.report.render import ON_REQUEST
    pairs = next(title for title in headline["figures_on_request"] if title.startswith("Member pairs"))
    assert len(headline["figures_on_request"]) == 2
    markdown, page = (run_dir / "report.md").read_text(), (run_dir / "report.html").read_text()
    assert f"{ON_REQUEST} " in markdown and pairs in markdown.split(ON_REQUEST)[1]
    assert "<code>ensdiag report --detail</code>" in page and html.escape(pairs) in page.split("<code>ensdiag report --detail</code>")[1]
    report = make_report(run_dir, svg=True, detail=True)
    assert report["figures_on_request"] == [] and ON_REQUEST not in (run_dir / "report.md").read_text()
    names = {f["name"] for f in report["figures"]}
    assert names == {"diversity", "member-pairs", "reliability", "smooth-reliability", "ood-scores", "training",
                     "risk-coverage"}
    for figure in report["figures"]:
        png, svg = run_dir / figure["png"], run_dir / figure["svg"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert b"<svg" in svg.read_bytes()[:1000]
    assert (run_dir / "report.md").read_text().count("](figures/") == len(names)


def test_missing_seeds_are_reported_not_averaged(run_dir):
    (run_dir / "deep-ensemble" / "seed-3" / "metrics.json").unlink()
    report = make_report(run_dir, write=False)
    got = cell(report, "id", "deep-ensemble", "Acc")
    assert got["n"] == 2 and got["mean"] == pytest.approx(0.955)
    assert report["missing_seeds"] == {"deep-ensemble": [3]}
    markdown = render(report, "markdown")
    assert "(n=2/3)" in markdown and "seed(s) 3" in markdown


def test_reference_paper_rows_only_for_cifar10(run_dir, capsys):
    code, _, err = run_cli(capsys, "report", run_dir, "--reference", "paper", "--format", "markdown")
    assert code != 0 and "CIFAR-10" in err
    experiment = json.loads((run_dir / "experiment.json").read_text())
    experiment["config"]["preset"] = "cifar10"
    atomic_write_json(run_dir / "experiment.json", experiment)
    report = make_report(run_dir, reference="paper", write=False)
    table = next(t for t in report["tables"] if t["id"] == "id")
    published = [r for r in table["rows"] if r.get("reference")]
    assert len(published) == 4 and published[2]["cells"][0]["mean"] == 0.952
    assert all("mark" not in c for r in published for c in r["cells"])
    assert "paper (published)" in render(report, "markdown")
    # the paper's FPR95 is the ID→OOD direction its code computed; the other direction is not published
    ood = {r["method"]: r for r in next(t for t in report["tables"] if t["id"] == "ood")["rows"] if r.get("reference")}
    assert cell_named(report, "ood", ood["deep-ensemble"], "FPR95 ID→OOD")["mean"] == 0.199
    assert cell_named(report, "ood", ood["deep-ensemble"], "FPR95 OOD→ID")["mean"] is None


def cell_named(report, table_id, row, column):
    table = next(t for t in report["tables"] if t["id"] == table_id)
    return row["cells"][[c["name"] for c in table["columns"]].index(column)]


def test_latex_uses_booktabs_and_marks(run_dir):
    text = render(make_report(run_dir, write=False), "latex")
    assert r"\toprule" in text and r"\textbf{0.960 $\pm$" in text
    assert r"\underline{" not in text  # two methods: a best, no second best


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")
def test_html_renders_in_headless_chromium(run_dir, tmp_path):
    from PIL import Image
    make_report(run_dir)
    shot = tmp_path / "shot.png"
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,1600",
                             (run_dir / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.exists(), result.stderr[-2000:]
    image = Image.open(shot).convert("L")
    low, high = image.getextrema()
    assert high - low > 100  # text and figures, not a blank page
    histogram = image.histogram()
    assert sum(histogram[:200]) > 0.01 * image.width * image.height


def wide_report():
    """Four methods x ten corruptions: wider than 80 columns as the paper lays it out."""
    names = ["blur", "brightness", "contrast", "gaussian_noise", "impulse_noise", "rotate", "scale", "shear",
             "stripe", "translate"]
    rows = [{"method": m, "label": label, "cells": [{"mean": 0.5 + i / 100 + j / 1000, "ci": 0.012, "n": 3, "expected": 3}
                                                     for j in range(len(names))]}
            for i, (m, label) in enumerate([("single", "Single"), ("mc-dropout", "MC Dropout"),
                                            ("deep-ensemble", "Deep Ensemble"), ("batch-ensemble", "BatchEnsemble")])]
    return {"tables": [{"id": "shift-corruptions", "title": "Accuracy per corruption", "note": "",
                        "columns": [{"name": n, "direction": "up"} for n in names], "rows": rows}]}


@pytest.mark.parametrize("width", [80, 200])
def test_terminal_tables_fit_the_terminal_and_hide_no_number(width):
    from rich.console import Console
    from ensdiag.report import to_rich

    console = Console(width=width, record=True, file=io.StringIO())
    for table in to_rich(wide_report(), width=width):
        console.print(table)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width and "…" not in text
    assert all(line.rstrip().endswith(("┓", "┃", "┩", "│", "┘")) for line in lines[1:])  # right border intact
    for value in ("0.500 ± 0.012", "0.539 ± 0.012", "BatchEnsemble", "translate ↑"):
        assert value in text
    header = next(line for line in lines if "Single" in line)
    assert ("BatchEnsemble" in header) == (width == 80)  # methods become columns only when it must


def test_seeds_measured_on_different_shift_pools_are_flagged(run_dir):
    for seed, title in zip(SEEDS, ["MNIST-C (5 of 15 corruptions; missing: …)", "MNIST-C", "MNIST-C"]):
        meta = run_dir / "deep-ensemble" / f"seed-{seed}" / "meta.json"
        atomic_write_json(meta, {**json.loads(meta.read_text()), "splits": {"shift": title}})
    table = next(t for t in make_report(run_dir, write=False)["tables"] if t["id"] == "shift")
    assert "different shift sets" in table["note"] and "5 of 15 corruptions" in table["note"]


def test_a_report_is_rebuilt_without_importing_training_code(run_dir):
    import subprocess
    import sys
    script = ("import sys\nfrom ensdiag.report import make_report, render\n"
              f"render(make_report({str(run_dir)!r}), 'markdown')\n"
              "print(sorted(m for m in sys.modules if m.startswith('ensdiag.') and m.split('.')[1] in "
              "('train', 'experiment', 'bench', 'predict', 'checkpoint', 'evaluate')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def toy_analyzer():
    """A plug-in-style analyzer registered from this test file alone, with two declared columns."""
    from ensdiag.analysis import ANALYZERS, Column, metric, register_analyzer

    @register_analyzer("toy-margin", description="mean top-2 margin of p̄", columns=[
        Column("margin", ("splits", "id", "margin", "value"), "up", "mean of p̄'s top-1 minus top-2 probability",
               ("toy",), 10),
        Column("toy margin (id)", ("splits", "id", "margin", "value"), None, "the same, in the diversity table",
               ("diversity",), 99)])
    def toy(predictions, weights=None):
        p = predictions["id"]["logits"].softmax(-1).mean(0).topk(2).values
        return {"splits": {"id": {"margin": metric((p[:, 0] - p[:, 1]).mean().item(), "top-1 minus top-2")}}}

    yield toy
    ANALYZERS.pop("toy-margin")


def add_toy_results(run_dir, toy):
    from ensdiag.predictions import load_predictions
    for folder in run_dir.glob("*/seed-*"):
        metrics = json.loads((folder / "metrics.json").read_text())
        predictions, _ = load_predictions(folder / "predictions.safetensors")
        metrics["analyzers"]["toy-margin"] = {"status": "ok", **toy(predictions)}
        atomic_write_json(folder / "metrics.json", metrics)


def test_a_plugin_analyzers_declared_columns_appear_in_every_report_format(run_dir, toy_analyzer):
    add_toy_results(run_dir, toy_analyzer)
    report = make_report(run_dir, write=False)
    toy = next(t for t in report["tables"] if t["id"] == "toy")
    margin = json.loads((run_dir / "single" / "seed-1" / "metrics.json").read_text())["analyzers"]["toy-margin"]
    assert toy["columns"] == [{"name": "margin", "direction": "up", "split": None, "key": "toy-margin/id/margin"}]
    assert cell(report, "toy", "single", "margin")["values"][0] == margin["splits"]["id"]["margin"]["value"]
    assert [c["name"] for c in next(t for t in report["tables"] if t["id"] == "diversity")["columns"]][-1] == "toy margin (id)"
    assert report["definitions"]["margin"] == "mean of p̄'s top-1 minus top-2 probability"
    for fmt in ("markdown", "latex", "html", "json"):
        assert "toy margin (id)" in render(report, fmt) and "margin" in render(report, fmt)


def test_a_declared_column_missing_from_a_result_is_an_error_not_na(run_dir, toy_analyzer, capsys):
    add_toy_results(run_dir, toy_analyzer)
    path = run_dir / "deep-ensemble" / "seed-2" / "metrics.json"
    metrics = json.loads(path.read_text())
    del metrics["analyzers"]["toy-margin"]["splits"]["id"]["margin"]
    atomic_write_json(path, metrics)
    from .cli import assert_one_line_error
    assert_one_line_error(capsys, "report", run_dir, "--format", "json", "--no-figures",
                          match=r"deep-ensemble/seed-2/metrics.json: the toy-margin analyzer declares the report column "
                                r"'(toy )?margin( \(id\))?' at splits.id.margin.value, which its result lacks")


def test_a_seed_without_a_split_is_left_out_of_that_cell(run_dir):
    """A seed trained before the shift set was on disk has no shift numbers: n = 2/3, not an error."""
    path = run_dir / "deep-ensemble" / "seed-3" / "metrics.json"
    metrics = json.loads(path.read_text())
    for name in [n for n in metrics["splits"] if n.startswith("shift")]:
        del metrics["splits"][name]
        for result in metrics["analyzers"].values():
            result.get("splits", {}).pop(name, None)
    atomic_write_json(path, metrics)
    report = make_report(run_dir, write=False)
    assert cell(report, "shift", "deep-ensemble", "Acc")["n"] == 2
    assert cell(report, "id", "deep-ensemble", "Acc")["n"] == 3


def test_the_report_can_show_torch_uncertainty_conventions(run_dir, capsys):
    from tests.cli import assert_one_line_error
    ours = make_report(run_dir, write=False)
    theirs = make_report(run_dir, write=False, conventions="torch-uncertainty")
    assert theirs["conventions"] == "torch-uncertainty" and ours["conventions"] == "ensdiag"
    labels = {column["name"] for table in theirs["tables"] for column in table["columns"]}
    assert {"AURC (torch-uncertainty)"} <= labels and "AURC" not in labels
    assert [t["id"] for t in ours["tables"]] == [t["id"] for t in theirs["tables"]]
    metrics = json.loads((run_dir / "deep-ensemble" / f"seed-{SEEDS[0]}" / "metrics.json").read_text())["analyzers"]
    got = cell(theirs, "selective", "deep-ensemble", "AURC (torch-uncertainty)")
    values = [json.loads((run_dir / "deep-ensemble" / f"seed-{seed}" / "metrics.json").read_text())["analyzers"]
              ["selective"]["splits"]["id"]["aurc_trapezoid"]["value"] for seed in SEEDS]
    assert got["mean"] == pytest.approx(sum(values) / len(values)) and "aurc_trapezoid" in metrics["selective"]["splits"]["id"]
    assert_one_line_error(capsys, "report", run_dir, "--conventions", "sklearn", "--no-figures", match="unknown --conventions")


def test_figures_label_each_colour_scale_and_say_which_methods_they_leave_out(finished_run, tmp_path):
    import shutil

    from ensdiag.report.figures import heatmap_grid
    figure = heatmap_grid([("a", [("disagreement", [[0, 0.2], [0.2, 0]], "disagreement"),
                                  ("weight cosine", [[1, 0.9], [0.9, 1]], "cosine")])])
    labels = [ax.get_ylabel() for ax in figure.axes if ax.get_label() == "<colorbar>"]
    assert sorted(labels) == ["disagreement (high: members differ)", "weight cosine (high: members alike)"]
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    report = make_report(run)
    titles = {figure["name"]: figure["title"] for figure in report["figures"]}
    assert "Not drawn: Single" in titles["cka-layers"]  # single has one weight set: said, not silently absent


def seed_values(run_dir, method, *path, seeds=SEEDS):
    values = []
    for seed in seeds:
        node = json.loads((run_dir / method / f"seed-{seed}" / "metrics.json").read_text())["analyzers"]
        for key in path:
            node = node[key]
        values.append(node)
    return values


def test_the_ood_table_shows_the_score_asked_for(run_dir, capsys):
    from tests.cli import assert_one_line_error
    default = make_report(run_dir, write=False)
    assert default["ood_score"] == "msp" and "score 1 − MSP" in next(t for t in default["tables"] if t["id"] == "ood")["title"]
    report = make_report(run_dir, write=False, ood_score="energy")
    table = next(t for t in report["tables"] if t["id"] == "ood")
    assert report["ood_score"] == "energy" and "score energy" in table["title"]
    values = seed_values(run_dir, "deep-ensemble", "ood", "scores", "energy", "auroc", "value")
    assert cell(report, "ood", "deep-ensemble", "AUROC")["mean"] == pytest.approx(sum(values) / 3)
    assert cell(report, "ood", "deep-ensemble", "AUROC")["mean"] != cell(default, "ood", "deep-ensemble", "AUROC")["mean"]
    votes = make_report(run_dir, write=False, ood_score="variation_ratio")  # one member has no vote to vary
    assert cell(votes, "ood", "single", "AUROC")["mean"] is None and cell(votes, "ood", "deep-ensemble", "AUROC")["n"] == 3
    assert make_report(run_dir, write=False, ood_score="mutual_information")["ood_score"] == "jsd"
    assert_one_line_error(capsys, "report", run_dir, "--ood-score", "energi", "--no-figures",
                          match="unknown --ood-score 'energi'; did you mean 'energy'")


def test_an_ood_score_that_older_runs_lack_is_na_there_not_an_error(run_dir):
    path = run_dir / "deep-ensemble" / f"seed-{SEEDS[0]}" / "metrics.json"
    metrics = json.loads(path.read_text())
    ood = metrics["analyzers"]["ood"]
    ood["version"] = 1
    for name in ("energy", "max_logit", "variation_ratio", "expected_entropy"):
        del ood["scores"][name]
    atomic_write_json(path, metrics)
    found = cell(make_report(run_dir, write=False, ood_score="max_logit"), "ood", "deep-ensemble", "AUROC")
    assert found["n"] == 2 and found["mean"] == pytest.approx(
        sum(seed_values(run_dir, "deep-ensemble", "ood", "scores", "max_logit", "auroc", "value", seeds=SEEDS[1:])) / 2)


def test_new_calibration_and_pair_columns_and_their_peer_values(run_dir):
    ours = make_report(run_dir, write=False)
    theirs = make_report(run_dir, write=False, conventions="torch-uncertainty")
    smooth = seed_values(run_dir, "deep-ensemble", "calibration", "splits", "id", "smooth_ece_tu", "value")
    assert cell(theirs, "calibration", "deep-ensemble", "SmoothECE (torch-uncertainty)")["mean"] == pytest.approx(
        sum(smooth) / 3)
    assert cell(ours, "calibration", "deep-ensemble", "MCE (reads high)")["n"] == 3
    assert cell(ours, "selective", "deep-ensemble", "AUGRC")["mean"] == pytest.approx(
        sum(seed_values(run_dir, "deep-ensemble", "selective", "splits", "id", "augrc", "value")) / 3)
    pairs = next(t for t in ours["tables"] if t["id"] == "pairs")
    assert [c["name"] for c in pairs["columns"]] == ["KL (id)", "JSD (id)", "ambiguity (id)", "double-fault (id)",
                                                    "error corr (id)", "Yule's Q (id)"]
    jsd = seed_values(run_dir, "deep-ensemble", "member-pairs", "splits", "id", "jsd", "mean", "value")
    assert cell(ours, "pairs", "deep-ensemble", "JSD (id)")["mean"] == pytest.approx(sum(jsd) / 3)
    assert cell(ours, "pairs", "single", "JSD (id)")["mean"] is None  # k = 1: skipped


def test_report_detail_draws_the_detail_figures_from_the_command_line(run_dir, capsys):
    code, _, _ = run_cli(capsys, "report", run_dir, "--format", "json", "--out", run_dir / "r.json")
    assert code == 0 and not (run_dir / "figures" / "member-pairs.png").exists()
    code, _, _ = run_cli(capsys, "report", run_dir, "--format", "json", "--out", run_dir / "r.json", "--detail")
    assert code == 0 and (run_dir / "figures" / "member-pairs.png").is_file()
    assert "![Member pairs" in (run_dir / "report.md").read_text()


def test_the_ood_histogram_draws_the_chosen_score(run_dir):
    report = make_report(run_dir, ood_score="energy", detail=True)
    titles = {figure["name"]: figure["title"] for figure in report["figures"]}
    assert "energy" in titles["ood-scores"] and "σ*" in titles["smooth-reliability"]
