"""The Python blocks of the README's and docs/own-models.md's "From Python" sections run as written."""

import pytest

from ensdiag.report import make_report

from .documents import blocks, section


@pytest.mark.parametrize("document", ["README.md", "docs/own-models.md"])
def test_the_from_python_block_runs(document, tmp_path, monkeypatch, capsys):
    (block,) = blocks(section(document, "From Python"), "python")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{document} (From Python)", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 and all(0 <= float(value) <= 1 for value in printed)
    assert (tmp_path / "runs" / "mine" / "deep-ensemble" / "seed-0" / "metrics.json").is_file()
    assert make_report(tmp_path / "runs" / "mine", write=False)["methods"] == ["deep-ensemble"]
