"""The first minute: typos answered before torch is imported (with the nearest name), help that
reads at 80 columns, the presets' defaults in one table."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.cli import run_cli

TYPOS = [
    (["train", "--preset", "digts"], "did you mean 'digits'"),
    (["train", "--method", "deep-ensembel"], "did you mean 'deep-ensemble'"),
    (["train", "--ood", "fashion-mnst"], "did you mean 'fashion-mnist'"),
    (["train", "--out", "README.md"], "exists and is not a directory"),
    (["train", "--resume", "nowhere"], "is not an ensdiag run"),
    (["diversity", "nope.safetensors"], "MODEL nope.safetensors does not exist"),
    (["evaluate", "nope.pt"], "MODEL nope.pt does not exist"),
    (["evaluate", "README.md", "--data", "nowhere/x.npz"], "--data nowhere/x.npz does not exist"),
    (["analyze", "nope.npy"], "PREDICTIONS nope.npy does not exist"),
    (["import", "nope.pt", "--out", "x.safetensors"], "SRC nope.pt does not exist"),
    (["report", "nope"], "not an ensdiag run"),
    (["report", "README.md"], "is a file, not a run folder"),
    (["report", "--format", "markdwn"], "did you mean 'markdown'"),
    (["report", "--conventions", "torch-uncertainy"], "did you mean 'torch-uncertainty'"),
]


@pytest.mark.parametrize("args,match", TYPOS)
def test_a_typo_is_answered_before_torch_is_imported(args, match):
    script = ("import sys\nfrom ensdiag.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as done:\n"
              "    print('exit', done.code, 'torch' in sys.modules)\n")
    root = os.path.dirname(os.path.dirname(__file__))
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("exit 2 False"), (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and match in lines[0], lines


def test_the_names_checked_before_torch_is_imported_are_the_registries():
    from pathlib import Path

    from ensdiag.data import all_datasets
    from ensdiag.nn.methods import run_methods
    from ensdiag.registries import names_module
    from ensdiag.report import FORMATS
    import ensdiag.names as names
    assert (Path(names.__file__)).read_text() == names_module(), \
        "regenerate it: python -m ensdiag.registries names > ensdiag/names.py"
    assert set(names.METHODS) == set(run_methods()) and set(names.DATASETS) == set(all_datasets())
    assert names.REPORT_FORMATS == {name: extension for name, (extension, _) in FORMATS.items()}


def test_did_you_mean_only_when_a_name_is_close():
    from ensdiag.errors import unknown
    assert "did you mean 'mimo'" in str(unknown("method", "mimmo", ["mimo", "single"]))
    assert "did you mean" not in str(unknown("method", "xyz", ["mimo", "single"]))


COMMANDS = ["train", "evaluate", "diversity", "analyze", "import", "report", "bench", "models", "datasets", "presets"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_reads_at_80_columns(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    assert not re.search(r"^\s+-[^\s]*…", out, flags=re.M) and "<bool>" not in out  # no cut option name, no flag value
    assert "{" not in out.splitlines()[0]
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    assert re.match(r"Usage: ensdiag \S+ \[OPTIONS\]( [A-Z_]+(\.\.\.)?| \[[A-Z_]+\](\.\.\.)?)*$", out.splitlines()[0]), \
        out.splitlines()[0]  # [RUN_DIR]...: none or several


def test_the_command_list_is_not_cut(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(capsys, "--help")
    listed = out.split("Commands:", 1)[1].strip().splitlines()
    assert len(listed) >= 10 and not any(line.rstrip().endswith("...") for line in listed)


def test_presets_lists_every_presets_defaults(capsys):
    from ensdiag.config import PRESETS
    code, out, _ = run_cli(capsys, "presets", "--format", "json")
    rows = json.loads(out)
    assert code == 0 and set(rows) == set(PRESETS)
    assert rows["digits"]["epochs"] == PRESETS["digits"].epochs and rows["cifar10"]["optimizer"] == "sgd"


def test_train_shows_what_it_loads_on_a_terminal_and_nothing_in_a_pipe(monkeypatch):
    import io

    from rich.console import Console

    from ensdiag import console as cli
    screen = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=screen, force_terminal=True, width=80))
    with cli.loading("loading torch …"):
        pass
    assert "loading torch" in screen.getvalue()
    piped = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=piped, force_terminal=False))
    with cli.loading("loading torch …"):
        pass
    assert piped.getvalue() == ""  # a script's stderr stays one line per failure


def test_a_dependency_that_fails_to_import_is_one_line_not_a_traceback():
    script = "import sys\nsys.modules['typer'] = None\nfrom ensdiag.entry import main\nmain(['--version'])\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("error: ensdiag cannot start: importing typer failed")


def test_datasets_lists_without_torch_and_prints_every_path_whole(tmp_path):
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "data"
    script = ("import sys\nfrom ensdiag.cli import main\ntry:\n    main(['datasets', '--data-dir', sys.argv[1]])\n"
              "except SystemExit:\n    pass\nprint('torch', 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script, str(deep)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"}, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.stdout.rstrip().endswith("torch False"), done.stdout[-300:]
    assert f"expects in {deep}/MNIST/raw/:" in done.stdout  # one line, not folded mid-word at 80 columns
