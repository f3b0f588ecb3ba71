"""The README's "From Python" section runs as written."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_from_python_block_runs(tmp_path, monkeypatch, capsys):
    section = (ROOT / "README.md").read_text().split("## From Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "README.md (From Python)", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 and all(0 <= float(value) <= 1 for value in printed)
    assert (tmp_path / "runs" / "mine" / "deep-ensemble" / "seed-0" / "metrics.json").is_file()
    from ensdiag.report import make_report
    assert make_report(tmp_path / "runs" / "mine", write=False)["methods"] == ["deep-ensemble"]
