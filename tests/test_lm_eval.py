"""lm-evaluation-harness logs as predictions, on files lm-eval 0.4.13 wrote itself
(tests/fixtures/lm_eval/make_fixtures.py): per-member accuracy equals lm-eval's own `acc` in
its results JSON, and the ensemble's accuracy, NLL, JSD and disagreement equal a float64
recomputation from the sample files written here with json and NumPy (not through ensdiag's
reader); groups, choice-text targets, mixed choice counts, acc_norm, mutual information and
several filters are each read or refused in one line, and every hostile line is one `error:`."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import softmax
from scipy.stats import entropy
from sklearn.metrics import roc_auc_score

from .cli import assert_one_line_error, run_cli, run_recorded
from .documents import blocks, recorded_commands, section

ROOT = Path(__file__).parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "lm_eval"
LORA = FIXTURES / "out" / "lora-r4"
MEMBERS = sorted(LORA.iterdir())
DEEP = FIXTURES / "out" / "deep-ensemble"


def samples(member: Path, task: str) -> Path:
    (path,) = [p for p in member.iterdir() if re.fullmatch(rf"samples_{task}_[^_]+\.jsonl", p.name)]
    return path


def results(member: Path) -> dict:
    (path,) = member.glob("results_*.json")
    return json.loads(path.read_text())


def lines(path: Path, filter_name=None) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    filter_name = filter_name or rows[0]["filter"]
    return sorted((row for row in rows if row["filter"] == filter_name), key=lambda row: row["doc_id"])


def reference(members, tasks, score="loglikelihood", filter_name=None):
    """[k] per-question member log-probabilities over each question's own choices, and answers,
    straight from the sample files: numbers are strings, targets indices or choice texts."""
    per_member, answers = [], []
    for member in members:
        member_rows = [row for task in tasks for row in lines(samples(member, task), filter_name)]
        scores = []
        for row in member_rows:
            requests = [row["arguments"][f"gen_args_{i}"] for i in range(len(row["arguments"]))]
            lls = np.array([float(resp[0]) for resp in row["filtered_resps"]], dtype=np.float64)
            choices = len(lls) // 2 if "acc_mutual_info" in row["metrics"] else len(lls)
            texts = [request["arg_1"][1:] for request in requests[:choices]]  # the target delimiter is " "
            if score == "acc_norm":
                value = lls[:choices] / np.array([len(text) for text in texts])
            elif score == "mutual_info":
                value = lls[:choices] - lls[choices:]
            else:
                value = lls[:choices]
            scores.append(np.log(softmax(value.astype(np.float32).astype(np.float64))))
            if member == members[0]:
                target = row["target"]
                answers.append(int(target) if target.isdigit() else texts.index(target))
        per_member.append(scores)
    return per_member, np.array(answers)


def summary(per_member, answers) -> dict:
    k = len(per_member)
    probs = [np.exp(np.array([member[q] for member in per_member])) for q in range(len(answers))]  # [k, C_q]
    mean = [p.mean(0) for p in probs]
    votes = np.array([[p[i].argmax() for p in probs] for i in range(k)])
    pairs = [(i, j) for i in range(k) for j in range(k) if i != j]
    return {"accuracy": np.mean([m.argmax() == y for m, y in zip(mean, answers)]),
            "nll": np.mean([-np.log(m[y]) for m, y in zip(mean, answers)]),
            "jsd": np.mean([entropy(m) - entropy(p, axis=1).mean() for m, p in zip(mean, probs)]),
            "disagreement": np.mean([(votes[i] != votes[j]).mean() for i, j in pairs]) if k > 1 else None,
            "member_accuracy": [(votes[i] == answers).mean() for i in range(k)], "msp": [m.max() for m in mean]}


def analysed(capsys, *args):
    code, out, err = run_cli(capsys, "analyze", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out), err


def check(metrics, expected, split="id"):
    found = metrics["analyzers"]
    assert found["calibration"]["splits"][split]["accuracy"]["value"] == pytest.approx(expected["accuracy"], abs=1e-12)
    assert found["calibration"]["splits"][split]["nll"]["value"] == pytest.approx(expected["nll"], rel=1e-6)
    assert found["uncertainty"]["splits"][split]["jsd"]["value"] == pytest.approx(expected["jsd"], rel=1e-5, abs=1e-9)
    assert found["disagreement"]["splits"][split]["mean"]["value"] == pytest.approx(expected["disagreement"], abs=1e-12)
    assert found["calibration"]["splits"][split]["member_accuracy"]["value"] == pytest.approx(expected["member_accuracy"])


# ---------------------------------------------------------------- files lm-eval wrote, untouched


def test_three_sample_files_give_lm_evals_acc_and_the_recomputed_ensemble(capsys):
    metrics, err = analysed(capsys, *(samples(member, "ensq") for member in MEMBERS))
    member_accuracy = metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"]
    assert member_accuracy == [results(member)["results"]["ensq"]["acc,none"] for member in MEMBERS]
    check(metrics, summary(*reference(MEMBERS, ["ensq"])))
    assert metrics["num_members"] == 3 and metrics["splits"] == {"id": {"n": 20, "labelled": True}}
    assert metrics["lm_eval"]["task"] == "ensq" and metrics["lm_eval"]["filter"] == "none"
    assert [member["peft"] for member in metrics["lm_eval"]["members"]] == [f"lora-r4/adapter-{i}" for i in range(3)]
    assert "lm-eval: task ensq (20 documents), 3 members" in err and "scores: log-likelihoods" in err


def test_output_folders_and_model_folders_read_as_the_files(capsys):
    files, _ = analysed(capsys, *(samples(member, "ensq") for member in MEMBERS))
    for args in ([LORA, "--task", "ensq"], [*MEMBERS, "--task", "ensq"]):
        metrics, _ = analysed(capsys, *args)
        assert metrics["analyzers"] == files["analyzers"]


def test_a_group_is_pooled_and_reported_per_subtask_with_choice_text_targets(capsys):
    metrics, err = analysed(capsys, LORA, "--task", "ensgroup")
    assert set(metrics["splits"]) == {"id", "id/ensgroup_add", "id/ensgroup_sub"}
    calibration = metrics["analyzers"]["calibration"]["splits"]
    for split, task in (("id", "ensgroup"), ("id/ensgroup_add", "ensgroup_add"), ("id/ensgroup_sub", "ensgroup_sub")):
        assert calibration[split]["member_accuracy"]["value"] == pytest.approx(
            [results(member)["results"][task]["acc,none"] for member in MEMBERS], abs=1e-12), split
    check(metrics, summary(*reference(MEMBERS, ["ensgroup_add", "ensgroup_sub"])))
    check(metrics, summary(*reference(MEMBERS, ["ensgroup_sub"])), "id/ensgroup_sub")  # targets are choice texts
    assert lines(samples(MEMBERS[0], "ensgroup_sub"))[0]["target"].isalpha()
    assert "subtasks ensgroup_add, ensgroup_sub" in err


def test_mixed_choice_counts_are_one_run_padded_with_impossible_choices(capsys):
    metrics, err = analysed(capsys, LORA, "--task", "ensmixed")
    assert metrics["num_classes"] == 5 and "questions have 3, 4, 5 choices" in err
    assert metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"] == pytest.approx(
        [results(member)["results"]["ensmixed"]["acc,none"] for member in MEMBERS], abs=1e-12)
    check(metrics, summary(*reference(MEMBERS, ["ensmixed"])))


@pytest.mark.parametrize("task, score, metric", [("ensq", "acc_norm", "acc_norm"), ("ensmixed", "acc_norm", "acc_norm"),
                                                 ("ensmi", "mutual_info", "acc_mutual_info"), ("ensmi", "loglikelihood", "acc")])
def test_acc_norm_and_mutual_information_scores_match_lm_evals_metrics(task, score, metric, capsys):
    metrics, err = analysed(capsys, LORA, "--task", task, "--score", score)
    assert metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"] == pytest.approx(
        [results(member)["results"][task][f"{metric},none"] for member in MEMBERS], abs=1e-12)
    check(metrics, summary(*reference(MEMBERS, [task], score)))
    assert "warning" not in err  # lm-eval's own per-line metric agrees with every argmax read


def test_one_filter_is_read_the_first_by_default(capsys):
    first, err = analysed(capsys, LORA, "--task", "ensfilters")
    assert first["lm_eval"]["filter"] == "take-first" and "also logged: halved; choose with --filter" in err
    halved, _ = analysed(capsys, LORA, "--task", "ensfilters", "--filter", "halved")
    for metrics, name in ((first, "take-first"), (halved, "halved")):
        check(metrics, summary(*reference(MEMBERS, ["ensfilters"], filter_name=name)))
        assert metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"] == pytest.approx(
            [results(member)["results"]["ensfilters"][f"acc,{name}"] for member in MEMBERS])
    assert halved["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"] != \
        first["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"]
    assert_one_line_error(capsys, "analyze", LORA, "--task", "ensfilters", "--filter", "strict",
                          match="has no filter 'strict' \\(it has 'take-first', 'halved'\\)")


def test_ood_questions_come_from_another_task(capsys):
    metrics, _ = analysed(capsys, LORA, "--task", "ensq", "--ood-task", "ensood")
    assert metrics["splits"]["ood"] == {"n": 8, "labelled": False}
    id_msp = summary(*reference(MEMBERS, ["ensq"]))["msp"]
    ood_msp = summary(*reference(MEMBERS, ["ensood"]))["msp"]
    auroc = roc_auc_score([0] * len(id_msp) + [1] * len(ood_msp), 1 - np.array([*id_msp, *ood_msp]))
    assert metrics["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"] == pytest.approx(auroc, abs=1e-12)
    separate, _ = analysed(capsys, LORA, "--task", "ensq", *(item for m in MEMBERS for item in ("--ood", m)),
                           "--ood-task", "ensood")
    assert separate["analyzers"] == metrics["analyzers"]


def test_method_and_seed_come_from_the_peft_paths(tmp_path, capsys):
    code, _, err = run_cli(capsys, "analyze", LORA, "--task", "ensq", "--out", tmp_path / "runs")
    assert code == 0 and f"saved to {tmp_path / 'runs' / 'lora-r4' / 'seed-0'}" in err, err
    code, _, err = run_cli(capsys, "analyze", DEEP, "--task", "ensq", "--out", tmp_path / "runs", "--seed", "3")
    assert code == 0 and f"saved to {tmp_path / 'runs' / 'deep-ensemble' / 'seed-3'}" in err, err
    meta = json.loads((tmp_path / "runs" / "lora-r4" / "seed-0" / "meta.json").read_text())
    assert meta["splits"]["id"] == "ensq (lm-eval, filter none, log-likelihoods)"
    saved = json.loads((tmp_path / "runs" / "lora-r4" / "seed-0" / "metrics.json").read_text())
    assert saved["lm_eval"]["task"] == "ensq"
    code, _, err = run_cli(capsys, "analyze", LORA, "--task", "ensq", "--out", tmp_path / "metrics.json")
    assert code == 0 and (tmp_path / "metrics.json").is_file()  # a .json --out is the metrics file, as ever


# ---------------------------------------------------------------- weight space beside function space in one run


ADAPTER_DIRS = sorted((FIXTURES / "lora-r4").iterdir())


def test_each_part_of_a_run_is_saved_without_touching_the_other(tmp_path, capsys):
    from ensdiag.runs import saved_parts
    runs, run = tmp_path / "runs", tmp_path / "runs" / "lora-r4" / "seed-0"
    assert run_cli(capsys, "diversity", *ADAPTER_DIRS, "--save", runs, "--method", "lora-r4")[0] == 0
    weight_part = (run / "lora.json").read_bytes()
    assert saved_parts(run) == {"lora"}
    assert run_cli(capsys, "analyze", LORA, "--task", "ensq", "--out", runs)[0] == 0
    assert (run / "lora.json").read_bytes() == weight_part and saved_parts(run) == {"lora", "predictions"}
    function_part = {name: (run / name).read_bytes() for name in ("metrics.json", "meta.json", "predictions.safetensors")}
    assert run_cli(capsys, "diversity", *ADAPTER_DIRS, "--base", FIXTURES / "base", "--save", runs, "--method", "lora-r4",
                   "--overwrite")[0] == 0
    assert all((run / name).read_bytes() == data for name, data in function_part.items())
    assert (run / "lora.json").read_bytes() != weight_part  # saved again (asked): this part replaced, and only it
    code, out, err = run_cli(capsys, "report", runs, "--format", "json", "--no-figures")
    tables = {table["id"]: table for table in json.loads(out)["tables"]}
    cells = tables["llm"]["rows"][0]["cells"]
    lora = json.loads((run / "lora.json").read_text())["lora"]["summary"]
    metrics = json.loads(function_part["metrics.json"])["analyzers"]
    assert cells[0]["mean"] == pytest.approx(lora["delta_cosine"]["mean"])
    assert cells[3]["mean"] == pytest.approx(metrics["disagreement"]["splits"]["id"]["mean"]["value"])
    assert cells[4]["mean"] == pytest.approx(metrics["uncertainty"]["splits"]["id"]["jsd"]["value"])
    assert {"lora", "id", "diversity"} <= set(tables)


def test_an_analysis_saved_over_a_06_lora_run_keeps_its_weight_space(tmp_path, capsys):
    """ensdiag 0.6 kept the LoRA section in metrics.json: it moves to lora.json before the analysis is written."""
    runs, run = tmp_path / "runs", tmp_path / "runs" / "lora-r4" / "seed-0"
    assert run_cli(capsys, "diversity", *ADAPTER_DIRS, "--save", runs, "--method", "lora-r4")[0] == 0
    section = json.loads((run / "lora.json").read_text())["lora"]
    (run / "lora.json").unlink()
    (run / "metrics.json").write_text(json.dumps({"analyzers": {}, "splits": {}, "num_members": 3, "lora": section}))
    (run / "meta.json").write_text(json.dumps({"run": "lora-r4", "method": "lora-r4", "seed": 0, "splits": {},
                                               "source": "ensdiag diversity (LoRA adapters)"}))
    assert run_cli(capsys, "analyze", LORA, "--task", "ensq", "--out", runs)[0] == 0
    record = json.loads((run / "lora.json").read_text())
    assert record["lora"] == section and record["method"] == "lora-r4" and record["source"] == "ensdiag diversity (LoRA adapters)"
    assert json.loads((run / "metrics.json").read_text())["analyzers"]["calibration"]["status"] == "ok"
    code, out, _ = run_cli(capsys, "report", runs, "--format", "json", "--no-figures")
    assert {"llm", "lora"} <= {table["id"] for table in json.loads(out)["tables"]}


# ---------------------------------------------------------------- hostile or mismatched logs: one line each


def copied(tmp_path, task="ensq") -> list[Path]:
    """The three members' samples of `task` (and results), copied to edit."""
    out = []
    for member in MEMBERS:
        folder = tmp_path / member.name
        folder.mkdir(parents=True)
        shutil.copy(samples(member, task), folder)
        shutil.copy(next(member.glob("results_*.json")), folder)
        out.append(folder / samples(member, task).name)
    return out


def edit(path: Path, line: int, change):
    rows = path.read_text().splitlines()
    rows[line] = change(rows[line])
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("change, match", [
    (lambda text: re.sub(r'"filtered_resps": \[\["', '"filtered_resps": [["x', text),
     r"line 1: choice 0's log-likelihood 'x-.*' is not a number"),
    (lambda text: re.sub(r'"filtered_resps": \[\["[^"]*"', '"filtered_resps": [["-1_000"', text),
     r"line 1: choice 0's log-likelihood '-1_000' is not a number"),
    (lambda text: re.sub(r'"filtered_resps": \[\["[^"]*", "[^"]*"\], ', '"filtered_resps": [', text),
     "line 1: 3 log-likelihoods for 4 choices \\(a choice is missing\\)"),
    (lambda text: re.sub(r'"filtered_resps": \[\["[^"]*"', '"filtered_resps": [["nan"', text),
     "line 1: choice 0's log-likelihood 'nan' is not a number"),
    (lambda text: re.sub(r'"filtered_resps": \[\["[^"]*"', '"filtered_resps": [[NaN', text),
     "line 1: choice 0's log-likelihood nan is not a finite log-likelihood"),
    (lambda text: re.sub(r'"filtered_resps": \[\["[^"]*"', '"filtered_resps": [["-1e300"', text),
     "line 1: .* is not a finite log-likelihood"),
    (lambda text: re.sub(r'"target": "\d"', '"target": "seventy"', text),
     "line 1: target 'seventy' is no choice's text \\(the choices are 'twelve', 'eight', 'one', 'sixteen'\\)"),
    (lambda text: re.sub(r'"target": "\d"', '"target": "\u00b2"', text), "line 1: target '²' is digits lm-eval cannot have logged"),
    (lambda text: re.sub(r'"target": "\d"', '"target": "007"', text), "line 1: target '007' is digits lm-eval cannot"),
    (lambda text: re.sub(r'"target": "\d"', '"target": "' + "9" * 5000 + '"', text),
     "line 1: target '9+[.]{3} is choice index 9{12}…, but the question has 4 choices"),
    (lambda text: re.sub(r'"target": "\d"', '"target": "4"', text), "line 1: target '4' is choice index 4, but the "
                                                                       "question has 4 choices"),
    (lambda text: re.sub(r'"target": "\d"', '"target": "[0, 2]"', text), "line 1: target .* names several correct choices"),
    (lambda text: text[:50], "line 1: not JSON"),
    (lambda text: "[1, 2]", "line 1: not a JSON object"),
    (lambda text: text.replace('"doc_hash": "', '"doc_hash": "zz'), 'line 1: no "doc_hash" of hex digits'),
    (lambda text: re.sub(r'"arg_1": " \w+"', '"arg_1": " same"', text).replace('"arg_0": "', '"arg_0": "x', 1),
     "line 1: every choice is in the context .* winogrande"),
    (lambda text: text.replace('"doc_id": 0', '"doc_id": 1'), "line 2: doc_id 1 repeats line 1"),
    (lambda text: text.replace('"filter": "none"', '"filter": 7'), 'line 1: "filter" must name'),
])
def test_hostile_lines_are_one_line_errors_naming_the_line(change, match, tmp_path, capsys):
    paths = copied(tmp_path)
    edit(paths[1], 0, change)
    assert_one_line_error(capsys, "analyze", *paths, match=re.escape(str(paths[1])) + ", " + match)


def numeric_choices(row: dict, texts, target, lls, acc) -> str:
    """A line of `row`'s layout whose choices are the texts given (numbers, as in arithmetic tasks)."""
    row = {**row, "target": target, "acc": acc, "metrics": ["acc"]}
    row.pop("acc_norm", None)
    row["arguments"] = {f"gen_args_{i}": {"arg_0": "q", "arg_1": f" {text}"} for i, text in enumerate(texts)}
    row["filtered_resps"] = [[str(value), "False"] for value in lls]
    return json.dumps(row)


def test_without_the_task_config_lm_evals_logged_acc_tells_an_index_from_a_choice_text(tmp_path, capsys):
    """'2' is choice 2's index and choice 0's text. A samples file alone (no results_*.json: no
    doc_to_target) holds no type: lm-eval's own `acc` of the line tells which it scored against;
    where it cannot tell, the line is refused."""
    for acc, expected in ((1.0, 0), (0.0, 2)):  # every member picks choice 0 ("2")
        paths = copied(tmp_path / str(acc))
        for path in paths:
            next(path.parent.glob("results_*.json")).unlink()
            edit(path, 0, lambda text: numeric_choices(json.loads(text), ["2", "5", "7", "9"], "2",
                                                       [-0.5, -3.0, -4.0, -5.0], acc))
        metrics, _ = analysed(capsys, *paths)
        scores, labels = reference(MEMBERS, ["ensq"])
        member_correct = metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"][0] * 20
        others = sum(np.argmax(s) == y for s, y in zip(scores[0][1:], labels[1:]))
        assert member_correct == pytest.approx(others + (expected == 0))
    paths = copied(tmp_path / "unknown")
    next(paths[0].parent.glob("results_*.json")).unlink()
    edit(paths[0], 0, lambda text: numeric_choices(json.loads(text), ["2", "5", "7", "9"], "2", [-5.0, -0.5, -4.0, -6.0], 0.0))
    assert_one_line_error(capsys, "analyze", *paths, match="line 1: target '2' is both choice 2's index and choice 0's "
                                                           "text \\(no task config .*\\), and its logged metrics agree with both")


def test_with_the_task_config_the_target_is_read_as_lm_eval_reads_it_and_its_acc_must_agree(tmp_path, capsys):
    """ensq's doc_to_target is the template "{{answer}}": lm-eval turns its digits into an index, whatever
    the choices' texts; a line whose logged acc says otherwise was not scored as it reads: refused."""
    paths = copied(tmp_path)
    for path in paths:
        edit(path, 0, lambda text: numeric_choices(json.loads(text), ["2", "5", "7", "9"], "2", [-0.5, -3.0, -4.0, -5.0], 0.0))
    metrics, _ = analysed(capsys, *paths)
    scores, labels = reference(MEMBERS, ["ensq"])
    assert labels[0] != 2  # the original line's answer differs: the edited line is read, as index 2 (a miss)
    correct = [sum(np.argmax(q) == y for q, y in zip(member[1:], labels[1:])) for member in scores]
    assert np.array(metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"]) * 20 == \
        pytest.approx(correct)
    edit(paths[1], 0, lambda text: text.replace('"acc": 0.0', '"acc": 1.0'))
    assert_one_line_error(capsys, "analyze", *paths, match=re.escape(str(paths[1])) + ", line 1: lm-eval logs acc 1, "
                          "but choice 2 as the answer gives 0 \\(target '2' read as template digits: an index\\)")


def test_a_line_whose_logged_metric_contradicts_its_scores_is_refused(tmp_path, capsys):
    paths = copied(tmp_path)
    first = json.loads(paths[1].read_text().splitlines()[3])
    edit(paths[1], 3, lambda text: text.replace(f'"acc_norm": {first["acc_norm"]}', f'"acc_norm": {1.0 - first["acc_norm"]}'))
    assert_one_line_error(capsys, "analyze", *paths, match=re.escape(str(paths[1])) + f", line 4: lm-eval logs acc_norm "
                          f"{1 - first['acc_norm']:g}, but choice {first['target']} as the answer gives {first['acc_norm']:g}")


def test_a_byte_order_mark_crlf_and_blank_lines_read_alike(tmp_path, capsys):
    paths = copied(tmp_path)
    reference_metrics, _ = analysed(capsys, *paths)
    paths[2].write_bytes(b"\xef\xbb\xbf" + paths[2].read_text().replace("\n", "\r\n\r\n").encode())
    metrics, _ = analysed(capsys, *paths)
    assert metrics["analyzers"] == reference_metrics["analyzers"]


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)
FIELDS = ["doc_id", "target", "arguments", "filtered_resps", "filter", "doc_hash", "prompt_hash", "metrics", "acc"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 19), st.sampled_from(FIELDS), JSON_VALUES | st.binary(max_size=12)),
                min_size=1, max_size=3))
def test_random_damage_gives_metrics_or_one_line_naming_the_file(tmp_path_factory, damage):
    """Any field of any line replaced by any JSON value (or a line by raw bytes): ensdiag reads it or
    refuses it with one EnsdiagError naming the file, never another exception."""
    from ensdiag.errors import EnsdiagError
    from ensdiag.foreign.lm_eval import load_lm_eval_predictions
    paths = copied(tmp_path_factory.mktemp("damaged"))
    rows = paths[1].read_text().splitlines()
    for line, field, value in damage:
        if isinstance(value, bytes):
            rows[line] = value.decode("latin-1")
        else:
            try:
                row = json.loads(rows[line])
            except ValueError:  # a line an earlier step replaced by bytes
                row = {}
            rows[line] = json.dumps({**(row if isinstance(row, dict) else {}), field: value})
    paths[1].write_text("\n".join(rows) + "\n", encoding="latin-1")
    try:
        predictions, _ = load_lm_eval_predictions(paths)
    except EnsdiagError as error:
        assert str(error).startswith(str(paths[1])) and "\n" not in str(error), error
    else:
        assert predictions["id"]["logits"].shape[0] == 3


def test_members_of_other_documents_are_refused_naming_the_first_that_differs(tmp_path, capsys):
    paths = copied(tmp_path)
    edit(paths[2], 4, lambda text: re.sub(r'"doc_hash": "\w+"', '"doc_hash": "abc123"', text))
    assert_one_line_error(capsys, "analyze", *paths, match="line 5: doc_id 4 of 'ensq' differs from .* in its doc_hash")
    paths = copied(tmp_path / "prompt")
    edit(paths[1], 2, lambda text: re.sub(r'"prompt_hash": "\w+"', '"prompt_hash": "abc123"', text))
    assert_one_line_error(capsys, "analyze", *paths, match="line 3: doc_id 2 of 'ensq' differs .* in its prompt_hash")
    paths = copied(tmp_path / "limit")  # one member run with --limit: a document only the others have
    paths[1].write_text("".join(paths[1].read_text().splitlines(keepends=True)[:12]))
    assert_one_line_error(capsys, "analyze", *paths, match="doc_id 12 of 'ensq' .* is missing \\(a different --limit\\?\\)")
    assert_one_line_error(capsys, "analyze", paths[1], paths[0], paths[2],
                          match="doc_id 12 of 'ensq' is not in .* \\(20 documents against 12: a different --limit\\?\\)")


def test_a_200_mb_line_is_refused_before_it_is_read(tmp_path, capsys):
    paths = copied(tmp_path)
    with open(paths[0], "r+b") as handle:  # sparse: 200 MB without a newline, almost nothing on disk
        handle.truncate(0)
        handle.write(b'{"doc_id": 0, "doc": "')
        handle.truncate(200 * 2**20)
    assert_one_line_error(capsys, "analyze", *paths, match="line 1: longer than 16,777,216 bytes")


@pytest.mark.parametrize("args, match", [
    ([LORA], "holds several tasks \\('ensfilters', 'ensgroup_add', 'ensgroup_sub', 'ensmi', 'ensmixed', 'ensood', "
             "'ensq'; groups 'ensgroup'\\): choose one with --task NAME"),
    ([LORA, "--task", "arc"], "has no samples of task 'arc'"),
    ([LORA, "--task", "a b"], "--task: task name 'a b' must be"),
    ([LORA, "--task", "ensq", "--score", "mutual_info"], "--score mutual_info needs the task's unconditional"),
    ([LORA, "--task", "ensq", "--score", "probability"], "unknown --score 'probability'"),
    ([LORA, "--task", "ensq", "--labels", FIXTURES / "versions.json"], "drop --labels and --inputs"),
    ([LORA, "--task", "ensq", "--ood", MEMBERS[0], "--ood-task", "ensood"], "--ood gives 1 run\\(s\\), the predictions 3 members"),
    ([FIXTURES / "out", "--task", "ensq"], "holds no lm-eval sample files"),
    ([samples(MEMBERS[0], "ensq"), samples(MEMBERS[1], "ensmixed")], "is a run of 'ensmixed', .* of 'ensq'"),
    ([samples(MEMBERS[0], "ensq"), "--task", "ensmi"], "is a samples file of task 'ensq', not 'ensmi'"),
    ([FIXTURES / "tasks" / "ensq.json", "--task", "ensq"], "--task, --ood-task, --filter and --score are for lm-eval"),
])
def test_options_that_do_not_fit_are_one_line_errors(args, match, capsys):
    assert_one_line_error(capsys, "analyze", *args, match=match)


def test_two_runs_of_a_task_in_one_folder_and_a_damaged_results_file(tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(MEMBERS[0], folder)
    original = samples(folder, "ensq")
    shutil.copy(original, folder / "samples_ensq_2027-01-01T00-00-00.000000.jsonl")
    assert_one_line_error(capsys, "analyze", folder, MEMBERS[1], "--task", "ensq", match="holds 2 runs of 'ensq'")
    (folder / "samples_ensq_2027-01-01T00-00-00.000000.jsonl").unlink()
    next(folder.glob("results_*.json")).write_text("{not json")
    assert_one_line_error(capsys, "analyze", folder, MEMBERS[1], "--task", "ensq", match="is not readable JSON")


def test_a_method_that_the_paths_do_not_name_must_be_given(tmp_path, capsys):
    paths = copied(tmp_path)
    for path in paths:
        results_file = next(path.parent.glob("results_*.json"))
        data = json.loads(results_file.read_text())
        data["config"]["model_args"] = f"pretrained=model-{path.parent.name}"
        results_file.write_text(json.dumps(data))
    assert_one_line_error(capsys, "analyze", *paths, "--out", tmp_path / "runs", match="name the run with --method")
    code, _, err = run_cli(capsys, "analyze", *paths, "--out", tmp_path / "runs", "--method", "adapters")
    assert code == 0 and "saved to" in err


# ---------------------------------------------------------------- the documented commands (docs/llm.md)


@pytest.mark.llm  # with the extra, its `evaluate` runs lm-eval
def test_the_documented_lm_eval_commands_run(tmp_path, capsys, monkeypatch):
    import importlib.util
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()  # the commands name the repository's fixtures, relative to its root
    (tmp_path / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    commands = recorded_commands("docs/llm.md", "Scores from lm-evaluation-harness", tmp_path)
    assert [command[1] for command in commands] == ["analyze", "diversity", "report", "analyze", "analyze", "report",
                                                    "analyze", "analyze", "evaluate"]
    assert sum("adapter-" in part for part in commands[1]) == 3  # the glob
    shown = [block.strip().splitlines() for block in blocks(section("docs/llm.md", "Scores from lm-evaluation-harness"), "text")]
    outputs = [run_recorded(capsys, command, ROOT) for command in commands[:-1]]
    assert all(line in outputs[2] for line in shown[0]) and all(line in outputs[5] for line in shown[1])
    group_row, generated_row = shown[2]  # the group's row and the generated answers' row
    assert group_row in outputs[6] and generated_row in outputs[7]
    assert (tmp_path / "runs" / "llm" / "lora-r4" / "seed-0" / "lora.json").is_file()
    assert "## Verdict" in outputs[5] and "## Accuracy per subtask" not in outputs[5]
    if importlib.util.find_spec("lm_eval") is None:  # without the extra: one line saying how to get it
        assert_one_line_error(capsys, *commands[-1][1:], match=r"pip install 'ensdiag\[llm\]'")
    else:
        run_recorded(capsys, commands[-1], ROOT)
        assert {p.name for p in (tmp_path / "runs" / "llm-evaluate" / "lora-r4" / "seed-0").iterdir()} >= {
            "lm-eval", "metrics.json", "predictions.safetensors", "meta.json", "lora.json"}


def test_the_documented_limits_are_the_readers():
    from ensdiag.foreign import lm_eval_files, lm_eval_lines
    from ensdiag.foreign.predictions import PAD_LOGIT
    text = " ".join((ROOT / "docs" / "conventions.md").read_text().split())
    assert f"At most {lm_eval_lines.MAX_LINES:,} lines of at most {lm_eval_lines.MAX_LINE_BYTES // 2**20} MiB" in text
    assert f"at most {lm_eval_lines.MAX_CHOICES:,} choices" in text
    assert f"a results file of at most {lm_eval_files.MAX_RESULTS_BYTES // 2**20} MiB" in text
    assert lm_eval_lines.MAX_SCORE == 1e20 and "|s| ≤ 10²⁰" in text
    assert PAD_LOGIT == -1e30 and "`PAD_LOGIT` = −10³⁰" in text
    page = " ".join((ROOT / "docs" / "llm.md").read_text().split())
    assert f"a line over {lm_eval_lines.MAX_LINE_BYTES // 2**20} MiB" in page


def test_members_whose_group_has_other_subtasks_are_refused_naming_the_subtask(tmp_path, capsys):
    folders = []
    for member in MEMBERS[:2]:
        folders.append(Path(shutil.copytree(member, tmp_path / member.name)))
    (path,) = folders[1].glob("results_*.json")
    data = json.loads(path.read_text())
    data["group_subtasks"] = {"ensgroup": ["ensgroup_add"]}  # this member's group lacks a subtask
    path.write_text(json.dumps(data))
    assert_one_line_error(capsys, "analyze", *folders, "--task", "ensgroup",
                          match=f"group 'ensgroup': .*{folders[0].name}'s run has subtask 'ensgroup_sub', "
                                f".*{folders[1].name}'s does not")


def test_one_member_is_one_member(capsys):
    code, out, err = run_cli(capsys, "analyze", FIXTURES / "out" / "numbers" / "lora-r4__adapter-0", "--task", "ensgen")
    text = " ".join((out + err).split())
    assert code == 0 and "1 member:" in text and "the generated answers of 1 member" in text
    assert not re.search(r"\b1 members\b", text)
