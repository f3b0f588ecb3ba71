"""Every command of docs/own-models.md's "Bring your own ensemble" section runs, as bash reads it, in-process."""

import json
from pathlib import Path

from .cli import run_cli, run_recorded
from .documents import recorded_commands

ROOT = Path(__file__).parents[1]


def test_every_bring_your_own_example_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()  # the commands name files of the repository, relative to its root
    (tmp_path / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    commands = recorded_commands("docs/own-models.md", "Bring your own ensemble", tmp_path)
    assert len(commands) == 8 and sum(command[0] == "ensdiag" for command in commands) == 6
    assert {command[0] for command in commands} == {"ensdiag", "python"}
    for command in commands:
        run_recorded(capsys, command, ROOT)
    assert (tmp_path / "de-mlp.safetensors").exists()
    code, out, err = run_cli(capsys, "analyze", "byo-predictions.safetensors", "--format", "json")
    assert code == 0, err
    auroc = json.loads(out)["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"]
    assert auroc > 0.8  # the example's OOD set is one the members tell apart, as the page says
