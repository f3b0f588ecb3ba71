"""The `llm` tier: lm-evaluation-harness 0.4.13 run for real (needs the `[llm]` extra; `.ci/run`
installs it and runs `pytest -m llm`).

- lm-eval writes today what tests/fixtures/lm_eval/out/numbers holds (make_more_fixtures.py run
  again into a temporary folder and compared line by line): the fixtures cannot drift from it;
- `ensdiag evaluate ADAPTER… --base BASE --tasks ensnum` runs lm-eval on a group whose choices are
  numbers and reads the logs it wrote with no glue: each member's accuracy per subtask is lm-eval's
  `acc`, each group number lm-eval's, every ensemble number a float64 recomputation from those
  files; `ensdiag analyze` on the same logs gives the same numbers;
- `ensdiag evaluate … --tasks ensgen` (generate_until): each member's accuracy is lm-eval's exact_match.
"""

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from .cli import run_cli
from .test_lm_eval import FIXTURES, check, summary
from .test_lm_eval_numbers import NUMBERS, SUBTASKS, recomputed, results, rows

HAS_EXTRA = all(importlib.util.find_spec(name) for name in ("lm_eval", "transformers", "peft"))
pytestmark = [pytest.mark.llm, pytest.mark.slow,
              pytest.mark.skipif(not HAS_EXTRA, reason="needs the [llm] extra (lm-eval, transformers, peft)")]
ADAPTERS = sorted((FIXTURES / "lora-r4").iterdir())
TASKS = [*SUBTASKS, "ensgen"]


def same(found, expected, where):
    """Equal, numbers written as strings within float32 rounding of another machine's kernels."""
    if isinstance(expected, dict):
        assert isinstance(found, dict) and set(found) == set(expected), where
        for key in expected:
            same(found[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected), where
        for index, (a, b) in enumerate(zip(found, expected)):
            same(a, b, f"{where}[{index}]")
    elif isinstance(expected, str) and _number(expected) is not None and _number(found) is not None:
        assert _number(found) == pytest.approx(_number(expected), rel=1e-5, abs=1e-6), where
    else:
        assert found == expected, where


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and isinstance(text, str) and text not in ("True", "False") else None


def test_lm_eval_writes_today_what_the_fixtures_hold(tmp_path):
    subprocess.run([sys.executable, str(FIXTURES / "make_more_fixtures.py"), "--logs-only", str(tmp_path)], check=True,
                   timeout=900, capture_output=True)
    fresh = sorted(tmp_path.iterdir())
    assert [folder.name for folder in fresh] == [folder.name for folder in sorted(NUMBERS.iterdir())]
    for new, old in zip(fresh, sorted(NUMBERS.iterdir())):
        for task in TASKS:
            for a, b in zip(rows(new, task), rows(old, task), strict=True):
                keep = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash",
                        "prompt_hash", "target_hash", "acc", "acc_norm", "exact_match")
                same({key: a.get(key) for key in keep}, {key: b.get(key) for key in keep}, f"{new.name} {task}")
        mine, theirs = results(new)["results"], results(old)["results"]
        for task, entry in theirs.items():
            for key, value in entry.items():
                if "," in key and "stderr" not in key:
                    assert mine[task][key] == pytest.approx(value, abs=1e-12), (task, key)


def model_folders(run):
    return sorted(folder for member in sorted((run / "lm-eval").iterdir()) for folder in member.iterdir() if folder.is_dir())


def test_evaluate_reads_numeric_choices_as_lm_eval_scored_them(tmp_path, capsys):
    code, out, err = run_cli(capsys, "evaluate", *ADAPTERS, "--base", FIXTURES / "base", "--tasks", "ensnum",
                             "--include-path", FIXTURES / "tasks", "--out", tmp_path / "runs", "--format", "json")
    assert code == 0, err
    metrics = json.loads(out)
    members = model_folders(tmp_path / "runs" / "lora-r4" / "seed-0")
    assert len(members) == 3
    calibration = metrics["analyzers"]["calibration"]["splits"]
    for task in SUBTASKS:
        assert calibration[f"id/{task}"]["member_accuracy"]["value"] == pytest.approx(
            [results(member)["results"][task]["acc,none"] for member in members], abs=1e-12), task
        check(metrics, summary(*recomputed(members, [task])), f"id/{task}")
    check(metrics, summary(*recomputed(members, SUBTASKS)))
    groups = metrics["lm_eval"]["groups"]["groups"]
    for group in ("ensnum", "ensnum_more"):
        assert groups[group]["member_accuracy"]["value"] == pytest.approx(
            [results(member)["results"][group]["acc,none"] for member in members], abs=1e-12), group
    assert not groups["ensnum"]["by_size"] and groups["ensnum_more"]["by_size"]
    code, again, err = run_cli(capsys, "analyze", *members, "--task", "ensnum", "--format", "json")
    assert code == 0, err
    weight_space = metrics["analyzers"].pop("lora")
    assert weight_space["k"] == 3
    assert json.loads(again)["analyzers"] == metrics["analyzers"]  # the same reading, no glue between them


def test_evaluate_scores_generated_answers_by_lm_evals_exact_match(tmp_path, capsys):
    code, out, err = run_cli(capsys, "evaluate", *ADAPTERS, "--base", FIXTURES / "base", "--tasks", "ensgen",
                             "--include-path", FIXTURES / "tasks", "--out", tmp_path / "runs", "--format", "json")
    assert code == 0, err
    found = json.loads(out)
    run = tmp_path / "runs" / "lora-r4" / "seed-0"
    members = model_folders(run)
    filter_name = found["lm_eval"]["filter"]
    assert found["generated"]["id"]["member_accuracy"]["value"] == pytest.approx(
        [results(member)["results"]["ensgen"][f"exact_match,{filter_name}"] for member in members], abs=1e-12)
    assert json.loads((run / "generated.json").read_text())["generated"] == found["generated"]
    assert (run / "lora.json").is_file() and found["analyzers"]["lora"]["k"] == 3
