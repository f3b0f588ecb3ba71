"""lm-eval's own logs of issue 46's tasks, written by lm-eval 0.4.13 itself on the committed
adapters (tests/fixtures/lm_eval/make_more_fixtures.py; tests/test_lm_eval_llm.py regenerates them
and checks they have not drifted):

- choices that are numbers, with answers read three ways by lm-eval (an integer column: an
  index; a string column: a choice's text; a template's digits: an index), many of them both an
  index and another choice's text: ensdiag reads every line as lm-eval did, so each member's
  accuracy is lm-eval's own `acc` and every ensemble number equals a float64 recomputation from
  the files with json and NumPy, the answer taken from the document itself (never the target);
- the group `ensnum` (acc unweighted, acc_norm weighted by size) and its subgroup `ensnum_more`:
  each group number of each member equals lm-eval's own in results_*.json, the ensemble's equals
  the recomputation aggregated the same way;
- `ensgen` (generate_until): each member's accuracy is lm-eval's exact_match, the vote, oracle,
  disagreement and double fault equal a recomputation from the answers logged;
- the same member twice (folder, samples file, link, hard link) is refused, as is a malformed target.
"""

import json
import os
import re
import shutil
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import softmax

from ensdiag.errors import EnsdiagError
from ensdiag.foreign.lm_eval import LmEvalOptions, load_lm_eval_answers, load_lm_eval_predictions

from .cli import assert_one_line_error, run_cli
from .test_lm_eval import FIXTURES, check, summary

NUMBERS = FIXTURES / "out" / "numbers"
MEMBERS = sorted(NUMBERS.iterdir())
SUBTASKS = ["ensnum_index", "ensnum_text", "ensnum_template"]
GROUPS = {"ensnum": SUBTASKS, "ensnum_more": SUBTASKS[1:]}


def samples(member: Path, task: str) -> Path:
    (path,) = [p for p in member.iterdir() if re.fullmatch(rf"samples_{task}_[^_]+\.jsonl", p.name)]
    return path


def results(member: Path) -> dict:
    (path,) = member.glob("results_*.json")
    return json.loads(path.read_text())


def rows(member: Path, task: str, filter_name=None) -> list[dict]:
    found = [json.loads(line) for line in samples(member, task).read_text().splitlines()]
    filter_name = filter_name or found[0]["filter"]
    return sorted((row for row in found if row["filter"] == filter_name), key=lambda row: row["doc_id"])


def recomputed(members, tasks, score="loglikelihood"):
    """Per member the log-probabilities of each question's choices, and the answers, from the files
    with json and NumPy: the answer is the document's own (the position of its sum among its
    choices), independent of how the target was logged."""
    per_member, answers = [], []
    for member in members:
        scores = []
        for row in (row for task in tasks for row in rows(member, task)):
            lls = np.array([float(resp[0]) for resp in row["filtered_resps"]], dtype=np.float64)
            if score == "acc_norm":
                lls = lls / np.array([len(choice) for choice in row["doc"]["choices"]])
            scores.append(np.log(softmax(lls.astype(np.float32).astype(np.float64))))
            if member == members[0]:
                answers.append(row["doc"]["choices"].index(row["doc"]["answer_text"]))
        per_member.append(scores)
    return per_member, np.array(answers)


def test_the_fixtures_hold_targets_that_are_both_an_index_and_another_choices_text():
    for task in SUBTASKS:
        ambiguous = [row for row in rows(MEMBERS[0], task) if row["target"] in row["doc"]["choices"]
                     and row["doc"]["choices"].index(row["target"]) != int(row["target"])
                     and int(row["target"]) < len(row["doc"]["choices"])]
        assert ambiguous, task  # the case: "target '2' is both choice 2's index and choice 1's text"
    assert results(MEMBERS[0])["configs"]["ensnum_index"]["doc_to_target"] == "answer"
    assert results(MEMBERS[0])["configs"]["ensnum_text"]["doc_to_target"] == "answer_text"
    assert results(MEMBERS[0])["configs"]["ensnum_template"]["doc_to_target"] == "{{answer}}"


def test_a_group_of_numeric_choices_is_read_as_lm_eval_scored_it(capsys):
    code, out, err = run_cli(capsys, "analyze", NUMBERS, "--task", "ensnum", "--format", "json")
    assert code == 0, err
    metrics = json.loads(out)
    calibration = metrics["analyzers"]["calibration"]["splits"]
    for task in SUBTASKS:  # each member's accuracy is lm-eval's own acc, per subtask
        assert calibration[f"id/{task}"]["member_accuracy"]["value"] == pytest.approx(
            [results(member)["results"][task]["acc,none"] for member in MEMBERS], abs=1e-12), task
        check(metrics, summary(*recomputed(MEMBERS, [task])), f"id/{task}")
    check(metrics, summary(*recomputed(MEMBERS, SUBTASKS)))  # the pooled questions
    assert "warning" not in err
    assert "lm-eval groups" in run_cli(capsys, "analyze", NUMBERS, "--task", "ensnum")[1]


@pytest.mark.parametrize("score, metric", [("loglikelihood", "acc"), ("acc_norm", "acc_norm")])
def test_each_group_number_is_lm_evals_and_the_ensembles_is_aggregated_alike(score, metric):
    about = {}
    load_lm_eval_predictions([NUMBERS], (), LmEvalOptions("ensnum", score=score), about)
    section = about["lm_eval"]["groups"]
    assert section["metric"] == f"{metric},none"
    per_task = {task: summary(*recomputed(MEMBERS, [task], score)) for task in SUBTASKS}
    sizes = {task: len(rows(MEMBERS[0], task)) for task in SUBTASKS}
    # the group YAMLs: ensnum aggregates acc unweighted and acc_norm by size; ensnum_more acc by size
    by_size = {("ensnum", "acc"): False, ("ensnum", "acc_norm"): True, ("ensnum_more", "acc"): True}
    for group, leaves in GROUPS.items():
        entry = section["groups"][group]
        assert entry["leaves"] == leaves and entry["n"] == sum(sizes[t] for t in leaves)
        logged = [results(member)["results"][group].get(f"{metric},none") for member in MEMBERS]
        if logged[0] is None:  # ensnum_more aggregates acc only: no acc_norm of its own
            assert entry["by_size"] and "logs no acc_norm,none" in entry["why"]
        else:
            assert entry["by_size"] == by_size[group, metric]
            assert entry["member_accuracy"]["value"] == pytest.approx(logged, abs=1e-12)  # lm-eval's group numbers
        weights = np.array([sizes[t] if entry["by_size"] else 1 for t in leaves], dtype=np.float64)
        for key in ("accuracy", "nll", "jsd", "disagreement"):
            expected = np.dot(weights, [per_task[t][key] for t in leaves]) / weights.sum()
            assert entry[key]["value"] == pytest.approx(expected, rel=1e-6, abs=1e-12), (group, key)
            interval = entry[key]["interval"]
            assert interval["low"] <= entry[key]["value"] <= interval["high"]
            assert interval["strata"] == {t: sizes[t] for t in leaves}
    for task in SUBTASKS:
        assert section["subtasks"][task]["accuracy"]["value"] == pytest.approx(per_task[task]["accuracy"], abs=1e-12)


def test_generated_answers_give_lm_evals_exact_match_and_the_recomputed_vote(capsys):
    for filter_name in ("strict-match", "flexible-extract"):
        splits, warnings = load_lm_eval_answers([NUMBERS], LmEvalOptions("ensgen", filter=filter_name))
        assert not warnings
        code, out, err = run_cli(capsys, "analyze", NUMBERS, "--task", "ensgen", "--filter", filter_name, "--format", "json")
        assert code == 0, err
        found = json.loads(out)["generated"]["id"]
        assert found["member_accuracy"]["value"] == pytest.approx(
            [results(member)["results"]["ensgen"][f"exact_match,{filter_name}"] for member in MEMBERS], abs=1e-12)
        # the recomputation: answers compared as the task's exact_match does (case, "#### ", a final ".")
        answers = [[row["filtered_resps"][0].lower() for row in rows(member, "ensgen", filter_name)] for member in MEMBERS]
        right = [[bool(row["exact_match"]) for row in rows(member, "ensgen", filter_name)] for member in MEMBERS]
        votes, oracle, differ, both = [], [], [], []
        for q in range(len(answers[0])):
            given = Counter(a[q] for a in answers)
            top = max(given.values())
            tied = [answer for answer, count in given.items() if count == top]
            correct_of = {answers[i][q]: right[i][q] for i in range(len(MEMBERS))}
            votes.append(np.mean([correct_of[answer] for answer in tied]))
            oracle.append(any(r[q] for r in right))
            differ.append(np.mean([answers[i][q] != answers[j][q] for i, j in combinations(range(3), 2)]))
            both.append(np.mean([not right[i][q] and not right[j][q] for i, j in combinations(range(3), 2)]))
        for key, expected in (("vote_accuracy", votes), ("oracle_accuracy", oracle), ("disagreement", differ),
                              ("double_fault", both), ("mean_member_accuracy", np.mean(right, 0))):
            assert found[key]["value"] == pytest.approx(np.mean(expected), abs=1e-12), key
            assert found[key]["interval"]["low"] <= found[key]["value"] <= found[key]["interval"]["high"]
    assert any(row["exact_match"] and row["filtered_resps"][0] != row["target"].split("#### ")[1]
               for member in MEMBERS for row in rows(member, "ensgen"))  # lm-eval's normalisation did the matching


def copies(tmp_path, task, members=MEMBERS) -> list[Path]:
    """The members' model folders with the samples of `task` and the results, copied to edit."""
    out = []
    for member in members:
        folder = tmp_path / member.name
        folder.mkdir(parents=True, exist_ok=True)
        for path in [*(p for p in member.iterdir() if p.name.startswith(f"samples_{task}_")), *member.glob("results_*")]:
            shutil.copy(path, folder)
        out.append(folder)
    return out


def test_the_same_member_twice_is_refused_however_it_is_given(tmp_path, capsys):
    file = samples(MEMBERS[0], "ensnum_index")
    (tmp_path / "link").symlink_to(MEMBERS[0], target_is_directory=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    copy = Path(shutil.copy(file, tmp_path / "a"))
    os.link(copy, tmp_path / "b" / file.name)  # a hard link: another name of the same file (on one file system)
    for members in ([MEMBERS[0], MEMBERS[1], MEMBERS[0]], [file, samples(MEMBERS[1], "ensnum_index"), file],
                    [MEMBERS[0], tmp_path / "link"], [copy, tmp_path / "b" / file.name]):
        # the paths themselves (given twice, a link) or the samples files they lead to (a hard link)
        with pytest.raises(EnsdiagError, match="are one member: both read .*samples_ensnum_index_.*; give each member once"
                           "|(is given twice|are the same file or folder \\(after links\\)): one lm-eval run would count as "
                           "two members"):
            load_lm_eval_predictions(members, (), LmEvalOptions("ensnum_index"))
    assert_one_line_error(capsys, "analyze", MEMBERS[0], tmp_path / "link", "--task", "ensgen", match="are one member|are the same file or folder")
    folders = copies(tmp_path / "copied", "ensnum_index", MEMBERS[:1])  # a copy is another file: read, with a warning
    _, warnings = load_lm_eval_predictions([MEMBERS[0], *folders], (), LmEvalOptions("ensnum_index"))
    assert any("give the same scores on every question: the same run copied?" in w for w in warnings)


def edit(path: Path, line: int, change):
    lines = path.read_text().splitlines()
    lines[line] = json.dumps(change(json.loads(lines[line])))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("task, change, match", [
    ("ensnum_index", lambda row: {**row, "target": "²"}, "target '²' is not str\\(\\) of the document's column 'answer'"),
    ("ensnum_index", lambda row: {**row, "doc": {**row["doc"], "answer": 9}, "target": "9"},
     "target '9' is choice index 9, but the question has 4 choices"),
    ("ensnum_text", lambda row: {**row, "doc": {**row["doc"], "answer_text": "99"}, "target": "99"},
     "target '99' is no choice's text"),
    ("ensnum_template", lambda row: {**row, "target": "1" * 5000}, "target .1+[.]{3} is choice index 1{12}…, but the question has"),
    ("ensnum_template", lambda row: {**row, "target": "٣"}, "target '٣' is digits lm-eval cannot have logged"),
    ("ensnum_template", lambda row: {**row, "acc": 1.0 - row["acc"]}, "lm-eval logs acc"),
    ("ensgen", lambda row: {**row, "exact_match": 1 - row["exact_match"]}, "lm-eval logs exact_match"),
    ("ensgen", lambda row: {**row, "filtered_resps": [["a", "b"]]}, "the filtered answer is a list of 2 generations"),
    ("ensgen", lambda row: {**row, "exact_match": "yes"}, '"exact_match" must be lm-eval\'s score of the answer'),
])
def test_a_malformed_line_exits_2_naming_it(task, change, match, tmp_path, capsys):
    folders = copies(tmp_path, task)
    edit(samples(folders[1], task), 2, change)
    code, _, err = run_cli(capsys, "analyze", *folders, "--task", task)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert re.match("error: " + re.escape(str(samples(folders[1], task))) + ", line 3: " + match, err), err


def test_a_memory_budget_is_checked_before_the_documents_are_held(monkeypatch):
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "40K")  # about 10 documents of 3 members
    with pytest.raises(EnsdiagError, match="documents read.*more than the memory budget of 40.0 KiB|reading .* documents "
                                           "of 3 members needs about .* more than the memory budget"):
        load_lm_eval_predictions([NUMBERS], (), LmEvalOptions("ensnum"))
    with pytest.raises(EnsdiagError, match="more than the memory budget"):
        load_lm_eval_answers([NUMBERS], LmEvalOptions("ensgen"))
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "100M")
    load_lm_eval_predictions([NUMBERS], (), LmEvalOptions("ensnum"))


@pytest.mark.slow
def test_the_scale_bench_runs_and_its_record_renders(tmp_path):
    """benchmarks/lm_eval_scale.py on 2 of MMLU's subjects: a record with every step, rendered as docs render it."""
    import importlib.util
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("lm_eval_scale", root / "benchmarks" / "lm_eval_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--subjects", "2", "--rounds", "1", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("lm-eval-scale-cpu-*.json")
    record = json.loads(path.read_text())
    assert record["settings"]["questions"] == 235 and record["settings"]["lines"] == 5 * 235
    assert set(record["seconds"]) >= {"parse", "read", "analyzers", "intervals"}
    assert record["mmlu_accuracy"]["members"] == pytest.approx(record["mmlu_accuracy"]["members_lm_eval"], abs=1e-12)
    spec = importlib.util.spec_from_file_location("docs_tables", root / "benchmarks" / "docs_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    assert "| + the core's intervals" in "\n".join(tables.lm_eval_scale(record))


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["ensnum_index", "ensnum_text", "ensnum_template", "ensgen"]), st.integers(0, 4),
       st.sampled_from(["target", "doc", "answer", "answer_text", "filtered_resps", "exact_match", "acc", "acc_norm"]),
       JSON_VALUES)
def test_any_damaged_field_gives_numbers_or_one_line_naming_the_file(tmp_path_factory, task, line, field, value):
    """The fields lm-eval's reading uses (the target, the document and its columns, the answers and the
    logged metrics) replaced by any JSON value: read, or one EnsdiagError naming the file."""
    folders = copies(tmp_path_factory.mktemp("damaged"), task)
    path = samples(folders[1], task)

    def damage(row):
        if field in ("answer", "answer_text"):
            return {**row, "doc": {**row["doc"], field: value}}
        return {**row, field: value}
    edit(path, line, damage)
    try:
        if task == "ensgen":
            load_lm_eval_answers(folders, LmEvalOptions(task))
        else:
            load_lm_eval_predictions(folders, (), LmEvalOptions(task))
    except EnsdiagError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error), error


def test_a_groups_weighting_is_read_back_from_lm_evals_own_numbers():
    """Subtasks a (1 question, acc 1) and b (3 questions, acc 0): lm-eval's group acc is 0.25 by size,
    0.5 unweighted; the logged number says which; aggregate() computes either by hand."""
    from types import SimpleNamespace

    import torch

    from ensdiag.foreign.lm_eval_groups import aggregate, group_tree, group_weighting, positions

    def member(group_value, sizes=(1, 3)):
        results = {"group_subtasks": {"g": ["a", "b"]},
                   "results": {"a": {"sample_len": sizes[0], "acc,none": 1.0}, "b": {"sample_len": sizes[1], "acc,none": 0.0},
                               "g": {} if group_value is None else {"acc,none": group_value}}}
        return SimpleNamespace(results=results)
    tree = group_tree(member(0.5).results, "g")
    assert tree == {"g": ["a", "b"]}
    assert group_weighting([member(0.25)] * 2, tree, "acc", "none")["g"]["by_size"] is True
    assert group_weighting([member(0.5)] * 2, tree, "acc", "none")["g"]["by_size"] is False
    assert "logs no acc,none" in group_weighting([member(None)], tree, "acc", "none")["g"]["why"]
    assert "both weightings" in group_weighting([member(0.5, (2, 2))], tree, "acc", "none")["g"]["why"]
    with pytest.raises(EnsdiagError, match="neither the size-weighted nor the unweighted"):
        group_weighting([member(0.25), member(0.5)], tree, "acc", "none")
    means, sizes = torch.tensor([[1.0, 2.0], [0.0, 4.0]], dtype=torch.float64), torch.tensor([1, 3])
    assert aggregate(means, sizes, True).tolist() == [0.25, 3.5] and aggregate(means, sizes, False).tolist() == [0.5, 3.0]
    assert positions([("a", 0), ("a", 1), ("b", 0)]) == [("a", 0, 2), ("b", 2, 3)]


@pytest.mark.skipif(os.name != "posix" or not hasattr(os, "sched_getaffinity"), reason="readers are forked on Linux only")
def test_files_read_by_forked_readers_give_the_numbers_and_the_refusal_of_reading_in_turn(tmp_path, monkeypatch):
    """Large logs are read in forked processes (lm_eval.PARALLEL_BYTES): the same tensors and group numbers
    as reading the files in turn, and a damaged line in a file a worker read is refused as it would be."""
    import torch

    from ensdiag import forked
    from ensdiag.foreign import lm_eval

    def loaded(folders):
        about = {}
        splits, warnings = load_lm_eval_predictions(folders, (), LmEvalOptions("ensnum"), about)
        return splits, (about, warnings)

    monkeypatch.setattr(forked, "workers", lambda tasks, most=4: 1)
    in_turn, about_in_turn = loaded([NUMBERS])
    monkeypatch.setattr(lm_eval, "PARALLEL_BYTES", 0)
    ran = []
    real_run = forked.run
    monkeypatch.setattr(forked, "run", lambda tasks, processes, **options: ran.append(processes) or real_run(tasks, processes, **options))
    monkeypatch.setattr(forked, "workers", lambda tasks, most=4: 2)
    there, about_there = loaded([NUMBERS])
    assert ran == [2]
    assert there.keys() == in_turn.keys() and about_there == about_in_turn
    for split in there:
        assert torch.equal(there[split]["logits"], in_turn[split]["logits"])
        assert torch.equal(there[split]["labels"], in_turn[split]["labels"])
    folders = copies(tmp_path, "ensnum_index")
    for folder in folders:  # the whole group: every subtask's file beside the damaged one
        for task in SUBTASKS[1:]:
            shutil.copy(samples(NUMBERS / folder.name, task), folder)
    edit(samples(folders[2], "ensnum_text"), 4, lambda row: {**row, "target": "99"})
    edit(samples(folders[1], "ensnum_template"), 2, lambda row: {**row, "acc": 1.0 - row["acc"]})
    with pytest.raises(EnsdiagError, match=re.escape(str(samples(folders[1], "ensnum_template"))) + ", line 3: lm-eval logs acc"):
        loaded(folders)  # member 1's file comes before member 2's: the refusal reading in turn gives first


def test_a_reader_comes_back_from_a_forked_worker_with_every_document_as_read():
    """A forked reader's result travels pickled (packed: flat lists, joined hashes): every document
    comes back equal, a missing prompt hash and an empty reader included."""
    import pickle

    from ensdiag.foreign.lm_eval_lines import Doc, Reader

    reader = Reader(samples(MEMBERS[0], SUBTASKS[0]), None,
                    "loglikelihood", " ", True).read(lambda *_: None)
    back = pickle.loads(pickle.dumps(reader))
    assert back.docs == reader.docs and back.filter == reader.filter and back.filters == reader.filters
    assert len(back.docs) > 3 and back.path == reader.path
    reader.docs[10**6] = Doc(7, "ab12", None, -1, [0.5, -1.0])
    assert pickle.loads(pickle.dumps(reader)).docs == reader.docs
    reader.docs.clear()
    assert pickle.loads(pickle.dumps(reader)).docs == {}
