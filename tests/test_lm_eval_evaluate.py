"""`ensdiag evaluate ADAPTER_DIR… --base MODEL_DIR --tasks NAME`: its options are checked before
lm-eval runs, a missing `[llm]` extra is one line saying how to get it, and where the extra is
installed lm-eval scores the fixture adapters into the run folder, giving the predictions of the
committed logs lm-eval wrote for the same adapters, beside their weight space, in one report."""

import importlib.util
import json

import pytest

from .cli import assert_one_line_error, run_cli
from .test_lm_eval import FIXTURES, LORA

ADAPTERS = sorted((FIXTURES / "lora-r4").iterdir())
BASE, TASKS = FIXTURES / "base", FIXTURES / "tasks"
HAS_EXTRA = all(importlib.util.find_spec(name) for name in ("lm_eval", "transformers", "peft"))


def test_without_the_extra_evaluate_says_how_to_get_it(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    assert_one_line_error(capsys, "evaluate", *ADAPTERS, "--base", BASE, "--tasks", "ensq",
                          match=r"runs lm-evaluation-harness, and lm_eval\b.*not installed: pip install 'ensdiag\[llm\]'")


@pytest.mark.parametrize("args, match", [
    ([*ADAPTERS, "--tasks", "ensq"], "give the base model's local folder with --base MODEL_DIR"),
    ([*ADAPTERS, "--base", "gpt2", "--tasks", "ensq"], "--base gpt2 is not a local model folder .* never a model from the hub"),
    ([*ADAPTERS, "--base", BASE], "name the task lm-eval scores the adapters on with --tasks NAME"),
    ([*ADAPTERS, "--base", BASE, "--tasks", "ens q"], "--tasks: task name 'ens q' must be"),
    ([*ADAPTERS, "--base", BASE, "--tasks", "ensq", "--include-path", FIXTURES / "nowhere"], "is not a folder of task YAML"),
    ([*ADAPTERS, "--base", BASE, "--tasks", "ensq", "--preset", "digits"], "--preset does not apply to LoRA adapters"),
    ([*ADAPTERS, "--base", BASE, "--tasks", "ensq", "--method", "a/b"], "method name 'a/b' must be"),
    ([ADAPTERS[0], "--base", BASE, "--tasks", "ensq"], "k ≥ 2 adapter folders"),
    ([BASE / "model.safetensors", "--tasks", "ensq"], "--base, --tasks, .* are for LoRA adapter folders"),
])
def test_the_options_are_checked_before_lm_eval_runs(args, match, capsys, monkeypatch):
    monkeypatch.setattr("ensdiag.lora.harness.check_extra", lambda: None)
    assert_one_line_error(capsys, "evaluate", *args, match=match)


def test_an_earlier_evaluation_is_not_merged_into(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ensdiag.lora.harness.check_extra", lambda: None)
    (tmp_path / "lora-r4" / "seed-0" / "lm-eval").mkdir(parents=True)
    assert_one_line_error(capsys, "evaluate", *ADAPTERS, "--base", BASE, "--tasks", "ensq", "--include-path", TASKS,
                          "--out", tmp_path, match="holds lm-eval logs of an earlier evaluation")


@pytest.mark.llm
@pytest.mark.skipif(not HAS_EXTRA, reason="needs the [llm] extra (lm-eval, transformers, peft)")
def test_lm_eval_scores_every_adapter_into_one_run_of_both_parts(tmp_path, capsys):
    code, out, err = run_cli(capsys, "evaluate", *ADAPTERS, "--base", BASE, "--tasks", "ensq", "--ood-task", "ensood",
                             "--include-path", TASKS, "--out", tmp_path / "runs", "--format", "json")
    assert code == 0, err
    found = json.loads(out)
    run = tmp_path / "runs" / "lora-r4" / "seed-0"  # named after the adapters' folder
    logs = sorted((run / "lm-eval").glob("member-*/*/samples_ensq_*.jsonl"))
    assert len(logs) == 3 and {p.name for p in run.iterdir()} >= {"metrics.json", "predictions.safetensors", "lora.json"}
    code, committed, err = run_cli(capsys, "analyze", LORA, "--task", "ensq", "--ood-task", "ensood", "--format", "json")
    committed = json.loads(committed)
    for split in ("id", "ood"):  # lm-eval scored the same adapters as when it wrote the fixtures
        for analyzer, key in (("uncertainty", "entropy"), ("disagreement", "mean")):
            assert found["analyzers"][analyzer]["splits"][split][key]["value"] == pytest.approx(
                committed["analyzers"][analyzer]["splits"][split][key]["value"], rel=1e-5)
    assert found["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"] == pytest.approx(
        committed["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"], rel=1e-5)
    # one metrics layout: `analyze`'s, with the weight space as the `lora` analyzer, as `diversity` prints it
    assert set(found) == set(committed) and set(found["analyzers"]) == {*committed["analyzers"], "lora"}
    assert "interval" in found["analyzers"]["calibration"]["splits"]["id"]["nll"]
    code, weights, err = run_cli(capsys, "diversity", *ADAPTERS, "--base", BASE, "--format", "json")
    assert code == 0, err
    weights = json.loads(weights)["analyzers"]["lora"]
    assert found["analyzers"]["lora"]["k"] == weights["k"] == 3
    assert found["analyzers"]["lora"]["summary"]["delta_cosine"]["mean"] == pytest.approx(
        weights["summary"]["delta_cosine"]["mean"], rel=1e-9)
    code, report, err = run_cli(capsys, "report", tmp_path / "runs", "--format", "json", "--no-figures")
    tables = {table["id"]: table for table in json.loads(report)["tables"]}
    row = tables["llm"]["rows"][0]
    assert row["method"] == "lora-r4" and all(cell["mean"] is not None for cell in row["cells"][:6])


@pytest.mark.llm
@pytest.mark.skipif(not HAS_EXTRA, reason="needs the [llm] extra (lm-eval, transformers, peft)")
def test_a_task_whose_documents_are_on_the_hub_is_one_line(tmp_path, capsys):
    assert_one_line_error(capsys, "evaluate", *ADAPTERS, "--base", BASE, "--tasks", "arc_easy", "--limit", "2",
                          "--out", tmp_path, match="lm-eval cannot load the task arc_easy: .*it would need the Hugging Face hub")
    assert_one_line_error(capsys, "evaluate", *ADAPTERS, "--base", BASE, "--tasks", "no_such_task", "--include-path", TASKS,
                          "--out", tmp_path, match="lm-eval cannot load the task no_such_task")
