"""Names from files reach no terminal, spreadsheet, Markdown viewer or browser as anything but text.

lm-eval logs whose subtask names (file names `samples_<task>_<date>.jsonl` and the results'
`group_subtasks`) and filter carry escape sequences, formulas, HTML and Markdown are analysed,
saved and reported in every `report --format` (the registry's list), shown by `analyze`,
`evaluate` and `diversity` on the terminal, exported as CSV and rendered as the notebook's HTML;
every output is checked for the class, not the examples: no raw control character, no cell a
spreadsheet would evaluate, no HTML element that was not ensdiag's own. The sinks themselves
(ensdiag/text.py) are checked on any text."""

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ensdiag import text as sink

from .cli import assert_one_line_error, run_cli

LM_EVAL = Path(__file__).parent / "fixtures" / "lm_eval" / "out" / "lora-r4"
# one subtask per class of attack: formulas, terminal escapes (CSI, OSC with BEL, C1, bidi), HTML, Markdown
SUBTASKS = {"=1+1": "ensgroup_add", "@SUM(1+1)|x](y)": "ensgroup_sub", "+cmd\tx\r": "ensgroup_add",
            "-t\x1b[2Jx\x9b31m\u202eb": "ensgroup_sub", "<img src=x onerror=alert(1)>": "ensgroup_add"}
FILTER = "none\x1b]0;PWNED\x07\x1b[31mRED<script>x</script>"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")  # any control but "\n"
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def hostile_logs(root: Path) -> Path:
    """Two members' lm-eval logs of group `ensgroup`, whose subtasks and filter are named as above."""
    for member in sorted(LM_EVAL.iterdir())[:2]:
        folder = root / member.name
        folder.mkdir(parents=True)
        (results,) = member.glob("results_*.json")
        date = results.name.removeprefix("results_").removesuffix(".json")
        data = json.loads(results.read_text())
        data["group_subtasks"] = {"ensgroup": list(SUBTASKS)}
        (folder / results.name).write_text(json.dumps(data))
        for name, source in SUBTASKS.items():
            (path,) = member.glob(f"samples_{source}_*.jsonl")
            text = path.read_text().replace('"filter": "none"', f'"filter": {json.dumps(FILTER)}')
            (folder / f"samples_{name}_{date}.jsonl").write_text(text)
    return root


def assert_clean(text: str, kind: str = "text"):
    """No raw control character (but newlines); in Markdown and HTML no element from a name; in CSV
    no cell a spreadsheet evaluates."""
    assert not RAW.search(text), repr(RAW.search(text).group(0))
    if kind in ("markdown", "html"):
        assert "<img src=x" not in text and "<script" not in text
    if kind == "markdown":
        assert "](y)" not in text
    if kind == "csv":
        for row in csv.reader(io.StringIO(text)):
            for cell in row:
                if cell.startswith(FORMULA):
                    float(cell)  # a negative number is a number; any other such cell would be a formula


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """(the logs, a run folder holding their analysis as run `m`)."""
    from .cli import run_cli as run
    root = tmp_path_factory.mktemp("hostile")
    logs = hostile_logs(root / "logs")

    class Quiet:  # capsys is function-scoped: the module's run is made without it
        def readouterr(self):
            return type("C", (), {"out": "", "err": ""})()
    import contextlib
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code, _, _ = run(Quiet(), "analyze", logs, "--task", "ensgroup", "--out", root / "runs", "--method", "m")
    assert code == 0
    return logs, root / "runs"


@pytest.mark.slow
def test_analyze_shows_every_name_as_text(hostile, capsys):
    logs, runs = hostile
    code, out, err = run_cli(capsys, "analyze", logs, "--task", "ensgroup")
    assert code == 0, err
    for shown in (out, err):
        assert_clean(shown)
    assert "t\\x1b[2Jx" in out and "\\x1b]0;PWNED\\x07" in err  # escaped, still readable
    saved = (runs / "m" / "seed-0" / "metrics.json").read_text()  # JSON keeps the name, escaped by JSON itself
    assert "id/-t\x1b[2Jx\x9b31m\u202eb" in json.loads(saved)["splits"]
    assert_clean(saved)


@pytest.mark.parametrize("fmt", __import__("ensdiag.report", fromlist=["FORMATS"]).FORMATS)
def test_every_report_format_writes_names_as_text(hostile, capsys, fmt, tmp_path):
    _, runs = hostile
    code, out, err = run_cli(capsys, "report", runs, "--format", fmt, "--no-figures")
    assert code == 0, err
    assert_clean(out, fmt)
    assert_clean(err)
    (tmp_path / "r").mkdir()
    code, _, err = run_cli(capsys, "report", runs, "--format", fmt, "--no-figures", "--out", tmp_path / "r")
    assert code == 0, err
    assert_clean(next((tmp_path / "r").iterdir()).read_text(), fmt)


def test_the_run_folders_own_report_files_write_names_as_text(hostile, capsys, tmp_path):
    _, runs = hostile
    copy = shutil.copytree(runs, tmp_path / "runs")
    code, _, err = run_cli(capsys, "report", copy, "--format", "json")
    assert code == 0, err
    assert_clean((copy / "report.md").read_text(), "markdown")
    assert_clean((copy / "report.html").read_text(), "html")
    assert "&lt;img src=x onerror=alert(1)&gt;" in (copy / "report.md").read_text()


def test_two_run_folders_named_like_attacks_report_as_text(hostile, capsys, tmp_path):
    _, runs = hostile
    first, second = (shutil.copytree(runs, tmp_path / name) for name in ("=cmd\x1b[2J", "<b>x</b>"))
    for fmt in ("table", "markdown", "csv", "html"):
        code, out, err = run_cli(capsys, "report", first, second, "--format", fmt)
        assert code == 0, err
        assert_clean(out, fmt)
        assert_clean(err)


@pytest.mark.slow
def test_per_example_csv_and_the_python_outputs_write_names_as_text(hostile, capsys, tmp_path):
    from ensdiag.core import inspect_predictions
    from ensdiag.foreign.lm_eval import LmEvalOptions, load_lm_eval_predictions
    logs, runs = hostile
    code, _, err = run_cli(capsys, "report", runs, "--no-figures", "--format", "json", "--examples", tmp_path / "e.csv")
    assert code == 0, err
    assert_clean((tmp_path / "e.csv").read_text(), "csv")
    about = {}
    predictions, _ = load_lm_eval_predictions([logs], options=LmEvalOptions(task="ensgroup"), about=about)
    from ensdiag.results import Diagnosis  # the public API's diagnosis: the core's data with its displays
    diagnosis = Diagnosis.of(inspect_predictions(predictions, "logs", about["titles"]))
    assert_clean(diagnosis._repr_html_(), "html")
    assert_clean(repr(diagnosis))
    assert_clean(diagnosis.to_markdown(), "markdown")
    assert_clean(diagnosis.save_examples(tmp_path / "d.csv").read_text(), "csv")
    from ensdiag.export import to_csv
    assert_clean(to_csv([{"name": name, "value": -1.5} for name in SUBTASKS]), "csv")


def test_evaluate_and_diversity_show_paths_and_folders_as_text(capsys, tmp_path):
    import numpy as np

    from ensdiag.checkpoint import save_model
    from ensdiag.nn import build_model
    model = save_model(build_model("mlp", "deep-ensemble", 2, 3, (1, 8, 8)), tmp_path / "m\x1b[31m.safetensors")
    data = tmp_path / "d\x1b]0;x\x07<img src=x>.npz"
    np.savez(data, images=np.zeros((6, 1, 8, 8), dtype=np.uint8), labels=np.arange(6) % 3)
    code, out, err = run_cli(capsys, "evaluate", model, "--data", data, "--normalize", "none")
    assert code == 0, err
    assert_clean(out + err)
    code, out, err = run_cli(capsys, "diversity", model, "--data", data, "--normalize", "none", "--no-geometry")
    assert code == 0, err
    assert_clean(out + err)


def test_errors_and_option_values_are_escaped(capsys, tmp_path):
    line = assert_one_line_error(capsys, "analyze", tmp_path / "x\x1b[2J\x9b.jsonl", match="does not exist")
    assert "\\x1b[2J\\x9b" in line and not RAW.search(line)
    line = assert_one_line_error(capsys, "report", tmp_path, "--format", "x\x1b]0;t\x07", match="unknown")
    assert not RAW.search(line)


# ---------------------------------------------------------------- the sinks, on any text

@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_the_sinks_hold_on_any_text(text):
    for out in (sink.terminal(text), sink.markdown(text), sink.html(text), sink.latex(text), sink.csv_cell(text)):
        assert not RAW.search(out) and "\n" not in out
    assert not sink.csv_cell(text).lstrip(" ").startswith(FORMULA)
    assert "<" not in sink.markdown(text) and "<" not in sink.html(text) and '"' not in sink.html(text)
    assert "](" not in sink.markdown(text) and not re.search(r"(?<!\\)\|", sink.markdown(text))
    assert not re.search(r"(?<!\\)[{}$^#%&_~]", sink.latex(text).replace(r"\textbackslash{}", "").replace(
        r"\textasciitilde{}", "").replace(r"\textasciicircum{}", "").replace(r"$\pm$", "").replace(
        r"$\uparrow$", "").replace(r"$\downarrow$", ""))
    assert sink.terminal(sink.terminal(text)) == sink.terminal(text)  # escaping twice changes nothing more


def test_what_the_sinks_leave_as_it_is():
    assert sink.terminal("deep-ensemble, ± 0.031 [0.024, 0.039] é ✓") == "deep-ensemble, ± 0.031 [0.024, 0.039] é ✓"
    assert sink.terminal("a\nb", keep="\n") == "a\nb" and sink.terminal("a\nb") == "a\\x0ab"
    assert sink.csv_cell(-0.5) == -0.5 and sink.csv_cell("id/shift") == "id/shift" and sink.csv_cell("=1") == "'=1"
    assert sink.markdown("0.385 [0.224, 0.637]") == "0.385 [0.224, 0.637]"
    assert sink.terminal_safe({"t\x1b": ["\x07", 1.5, None]}) == {"t\\x1b": ["\\x07", 1.5, None]}
