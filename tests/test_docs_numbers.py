"""Numbers in the README and docs come from committed result files and follow them."""

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .documents import block_after

ROOT = Path(__file__).resolve().parents[1]


def test_the_peer_convention_gap_in_the_docs_is_the_committed_measurement():
    result = json.loads((ROOT / "benchmarks" / "results" / "peer-conventions-digits.json").read_text())
    assert result["sentence"].rstrip(".") in (ROOT / "docs" / "conventions.md").read_text()
    assert result["runs"] > 0 and all(entry["values"] > 0 for entry in result["summary"].values())


def test_the_peer_convention_script_measures_run_folders(finished_run, tmp_path):
    out = tmp_path / "gap.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_conventions.py"), str(finished_run), "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    metrics = json.loads((finished_run / "single" / "seed-1" / "metrics.json").read_text())["analyzers"]
    gaps = [abs(entry["aurc"]["value"] - entry["aurc_trapezoid"]["value"]) for entry in metrics["selective"]["splits"].values()]
    assert result["runs"] == 2 and result["summary"]["AURC"]["max_abs_difference"] >= max(gaps)


def test_the_readme_run_time_range_is_the_example_cost_table():
    report = (ROOT / "examples" / "digits-report" / "report.md").read_text()
    table = report.split("## Computational cost", 1)[1].split("\n## ", 1)[0]
    means = [float(cells[3].strip(" *<>/ins").split(" ±")[0]) for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| Method") and (cells := line.split("|"))]
    expected = f"{min(means):.1f}–{max(means):.1f} s of training per run"
    assert expected in (ROOT / "README.md").read_text(), expected


def test_the_typo_to_error_times_in_the_docs_are_the_committed_measurement():
    result = json.loads((ROOT / "benchmarks" / "results" / "startup-cpu.json").read_text())
    seconds, ratio = result["seconds"], result["ratio_to_version"]
    typos = [name for name in seconds if not name.startswith(("ensdiag --version", "import torch"))]
    sentence = (f"A mistyped command answers in {min(seconds[k] for k in typos):.2f}–{max(seconds[k] for k in typos):.2f} s, "
                f"{min(ratio[k] for k in typos):.1f}–{max(ratio[k] for k in typos):.1f}× `ensdiag --version`")
    assert sentence in (ROOT / "docs" / "performance.md").read_text()
    assert max(seconds[k] for k in typos) < seconds["import torch (for scale)"]  # the point of the checks


def _docs_tables():
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "benchmarks" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_performance_table_is_rendered_from_a_record_of_this_version():
    """Each table between `<!-- table KIND RECORD -->` markers is what benchmarks/docs_tables.py
    renders from its record now, and that record was written by this ensdiag version."""
    import ensdiag
    tables = _docs_tables()
    kinds = set()
    for document in tables.DOCUMENTS:
        for kind, relative, text in tables.blocks(document):
            kinds.add(kind)
            assert text == tables.render(kind, relative, document), f"{document}: {kind} {relative} is stale"
            record = json.loads((ROOT / relative).read_text())
            assert record["environment"]["ensdiag"] == ensdiag.__version__, \
                f"{document} cites {relative}, written by ensdiag {record['environment']['ensdiag']}: rerun it"
    assert kinds == set(tables.RENDERERS)  # every renderer has a table, and every table a renderer


def test_the_performance_docs_cite_no_record_of_another_version():
    """Prose may cite records too: every bench, diagnose, peer or denormals record named in the
    README or docs/performance.md is one of this version."""
    import ensdiag
    for document in ("README.md", "docs/performance.md"):  # docs/conventions.md cites the coverage record only
        cited = set(re.findall(r"((?:bench|diagnose|peer-training|denormals|main-job)-[\w-]+\.json)", (ROOT / document).read_text()))
        assert cited, document
        for name in cited:
            record = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
            assert record["environment"]["ensdiag"] == ensdiag.__version__, f"{document} cites {name} of another version"


def test_the_install_size_in_the_docs_is_the_committed_measurement():
    record = json.loads((ROOT / "benchmarks" / "results" / "install-size.json").read_text())["gib"]
    expected = (f"A fresh environment takes {record['environment']:.1f} GiB, {record['nvidia']:.1f} GiB of it NVIDIA's "
                f"CUDA libraries and {record['triton']:.1f} GiB Triton")
    assert expected in " ".join((ROOT / "docs" / "install.md").read_text().split()), expected


def test_the_readme_verdict_lines_are_the_example_summary():
    """The README shows the main job's last screen as the example's summary.txt holds it; its lines
    per method (wrapped at 80 columns) are the same run's report's verdict lines."""
    summary = (ROOT / "examples" / "digits-report" / "summary.txt").read_text().splitlines()
    block = block_after("README.md", "verdict lines")
    assert summary and block.strip("\n").splitlines() == summary
    unwrapped = []
    for line in summary:
        if line.startswith("  ") and unwrapped:
            unwrapped[-1] += " " + line.strip()
        else:
            unwrapped.append(line)
    verdicts = [line for line in unwrapped if line.startswith(("MC Dropout (k = 4)", "BatchEnsemble (k = 4)"))]
    report = (ROOT / "examples" / "digits-report" / "report.md").read_text()
    assert len(verdicts) == 2 and all(line in report for line in verdicts)  # the same run's report says the same


def test_the_readme_main_job_seconds_are_the_committed_record():
    """The README's main-job row quotes the record it names (medians of its warm rounds)."""
    readme = (ROOT / "README.md").read_text()
    name = re.search(r"\[`(main-job-[\w-]+\.json)`\]", readme).group(1)
    record = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    summary, budget = record["summary"], record["rounds"][-1]["budget"]
    expected = (f"grid {summary['grid_seconds']:.1f} s, report {summary['report_seconds']:.1f} s, "
                f"diversity {budget['wall_seconds']:.0f} s")
    assert expected in readme, expected


def test_the_contention_bench_times_every_job_beside_the_work_it_starts_and_ends_it(tmp_path):
    """benchmarks/contention.py on a stand-in job (writes a run's meta.json) and stand-in other work: each job
    in each condition, its ratios to idle, the other work ended, and the record renders into a table."""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location("contention", ROOT / "benchmarks" / "contention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    job = [sys.executable, "-c", "import json, pathlib, time\ntime.sleep(0.1)\nfolder = pathlib.Path('runs/x/seed-1')\n"
           "folder.mkdir(parents=True)\n(folder / 'meta.json').write_text(json.dumps({'train_seconds': 2.0, "
           "'eval_seconds': 0.5, 'environment': {'threads': 1, 'threads_from': 'ensdiag'}}))"]
    other = [sys.executable, "-c", "import os, time\nprint('ready', flush=True)\ntime.sleep(600)"]
    started = []
    real_beside = bench.beside

    def beside(commands, env):
        with real_beside(commands, env) as pids:
            started.extend(pids)
            yield pids
    bench.beside = contextlib.contextmanager(beside)
    found = bench.measure({"stand-in": [job, [sys.executable, "-c", "pass"]]},
                          {"idle": [], "beside a PyTorch job": [other], "beside 2 busy loops": [other, other]},
                          1, tmp_path, dict(os.environ), log=lambda text: None)
    assert set(found["conditions"]) == {"idle", "beside a PyTorch job", "beside 2 busy loops"} and len(started) == 3
    for pid in started:  # every process the bench started has ended (and was reaped)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    idle = found["conditions"]["idle"]["stand-in"]
    assert len(idle["steps"]) == 2 and idle["train_seconds"] == 2.0 and [tuple(t) for t in idle["threads"]] == [(1, "ensdiag")]
    ratios = found["ratios"]["beside a PyTorch job"]["stand-in"]
    assert ratios["train_seconds"] == 1.0 and ratios["seconds"] > 0
    assert list(found["targets"]) == [f"stand-in beside a PyTorch job ≤ 3× idle ({key})"
                                      for key in ("seconds", "train seconds", "diagnosis seconds")]
    record = {**found, "settings": {"rounds": 1, "env": {}}}
    table = "\n".join(_docs_tables().contention(record))
    assert "| stand-in, training (meta.json) | 2.0 | 2.0 (1.0×) | 2.0 (1.0×) |" in table
