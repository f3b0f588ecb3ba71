"""Multiple-choice predictions (LLM benchmarks): the JSON-lines reader gives the metrics of the
same numbers as arrays, small C (2, 4) goes through every analyzer against independent
references, hostile lines are one-line errors with the line number, `analyze --method` feeds
the full report (tables, verdict, figures), and the README's example runs as written."""

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax
from scipy.stats import entropy
from sklearn.metrics import accuracy_score, average_precision_score, brier_score_loss, log_loss, roc_auc_score

from ensdiag.cli import main
from ensdiag.predictions import save_predictions

from .cli import assert_one_line_error, run_cli, run_recorded
from .documents import blocks, recorded_commands, section

ROOT = Path(__file__).parents[1]


def arrays(k, n, choices, seed, scale=2.0):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, scale, (k, n, choices)).astype(np.float32), rng.integers(0, choices, n))


def write_jsonl(path, splits: dict):
    """splits: {name: (logits [k, N, C], labels | None)}, one question per line (float32 values round-trip exactly)."""
    with open(path, "w") as file:
        for name, (logits, labels) in splits.items():
            for q in range(logits.shape[1]):
                row = {"id": f"{name}-{q}", "scores": logits[:, q].tolist(), "split": name}
                if labels is not None:
                    row["answer"] = int(labels[q])
                file.write(json.dumps(row) + "\n")
    return path


def metrics_of(capsys, *args):
    code, out, err = run_cli(capsys, "analyze", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------- the same numbers as arrays


def test_jsonl_gives_exactly_the_metrics_of_the_same_npy(tmp_path, capsys):
    (logits, labels), (ood, _) = arrays(3, 40, 4, 0), arrays(3, 25, 4, 1)
    np.save(tmp_path / "logits.npy", logits)
    np.save(tmp_path / "labels.npy", labels)
    np.save(tmp_path / "ood.npy", ood)
    from_npy = metrics_of(capsys, tmp_path / "logits.npy", "--labels", tmp_path / "labels.npy", "--ood", tmp_path / "ood.npy")
    one_file = write_jsonl(tmp_path / "mc.jsonl", {"id": (logits, labels), "ood": (ood, None)})
    assert metrics_of(capsys, one_file) == from_npy
    write_jsonl(tmp_path / "id.jsonl", {"id": (logits, labels)})
    (tmp_path / "id.jsonl").write_text((tmp_path / "id.jsonl").read_text().replace(', "split": "id"', ""))  # the default
    write_jsonl(tmp_path / "ood.jsonl", {"ood": (ood, labels[:25])})  # OOD answers are ignored
    assert metrics_of(capsys, tmp_path / "id.jsonl", "--ood", tmp_path / "ood.jsonl") == from_npy
    probs = softmax(logits.astype(np.float64), -1).astype(np.float32)
    np.save(tmp_path / "probs.npy", probs)
    write_jsonl(tmp_path / "probs.jsonl", {"id": (probs, labels)})
    assert metrics_of(capsys, tmp_path / "probs.jsonl", "--inputs", "probs") == \
        metrics_of(capsys, tmp_path / "probs.npy", "--labels", tmp_path / "labels.npy", "--inputs", "probs")


def test_a_byte_order_mark_crlf_blank_lines_and_unknown_keys_are_fine(tmp_path, capsys):
    logits, labels = arrays(2, 6, 3, 2)
    reference = metrics_of(capsys, write_jsonl(tmp_path / "plain.jsonl", {"id": (logits, labels)}))
    lines = (tmp_path / "plain.jsonl").read_text().splitlines()
    lines = [line[:-1] + ', "question": "Which?", "subject": "law"}' for line in lines]
    (tmp_path / "messy.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n\r\n".join(lines).encode() + b"\r\n")
    assert metrics_of(capsys, tmp_path / "messy.jsonl") == reference


# ---------------------------------------------------------------- small C through every analyzer


def dense_ece(confidence, correct, bins=15):
    """Σ_b |B_b|/N |acc_b − conf_b|, bin b = (b/B, (b+1)/B] (the first closed), by a loop."""
    edges = [b / bins for b in range(bins + 1)]
    which = [next(b for b in range(bins) if c <= edges[b + 1] or b == bins - 1) for c in confidence]
    total = 0.0
    for b in range(bins):
        members = [i for i in range(len(confidence)) if which[i] == b]
        if members:
            total += abs(np.mean(correct[members]) - np.mean(confidence[members])) * len(members) / len(confidence)
    return total


def references(logits, labels):
    """What every analyzer should report on one labelled split, from NumPy, SciPy and scikit-learn."""
    z = logits.astype(np.float64)
    p = softmax(z, -1)
    mean = p.mean(0)
    choices = z.shape[2]
    confidence, predicted = mean.max(1), mean.argmax(1)
    correct = (predicted == labels).astype(float)
    members = z.argmax(-1)
    pairs = [(i, j) for i in range(len(z)) for j in range(len(z)) if i != j]
    geometric = softmax(log_softmax(z, -1).mean(0), -1)  # q̄ ∝ exp(mean_i log p_i)
    order = np.argsort(-confidence, kind="stable")
    return {
        "accuracy": accuracy_score(labels, predicted),
        "nll": log_loss(labels, mean, labels=list(range(choices))),
        "brier": brier_score_loss(labels, mean, labels=list(range(choices)), scale_by_half=False),
        "ece": dense_ece(confidence, correct),
        "ece_classwise": np.mean([dense_ece(mean[:, c], (labels == c).astype(float)) for c in range(choices)]),
        "entropy": entropy(mean, axis=1).mean(),
        "jsd": (entropy(mean, axis=1) - entropy(p, axis=2).mean(0)).mean(),
        "disagreement": np.mean([(members[i] != members[j]).mean() for i, j in pairs]),
        "kl_diversity": np.mean([entropy(geometric, p[i], axis=1) for i in range(len(z))]),
        "brier_spread": ((p - mean) ** 2).sum(-1).mean(),
        "aurc": np.mean(np.cumsum(1 - correct[order]) / np.arange(1, len(labels) + 1)),
        "member_accuracy": [(members[i] == labels).mean() for i in range(len(z))],
    }


def check_against_references(analyzers, split, expected):
    value = lambda analyzer, key: analyzers[analyzer]["splits"][split][key]["value"]  # noqa: E731
    for key in ("accuracy", "nll", "brier", "ece", "member_accuracy"):
        assert value("calibration", key) == pytest.approx(expected[key], abs=1e-9), key
    assert value("calibration", "ece_classwise") == pytest.approx(expected["ece_classwise"], abs=1e-9)
    assert value("uncertainty", "entropy") == pytest.approx(expected["entropy"], abs=1e-9)
    assert value("uncertainty", "jsd") == pytest.approx(expected["jsd"], abs=1e-9)
    assert value("disagreement", "mean") == pytest.approx(expected["disagreement"], abs=1e-12)
    assert value("ensemble-gain", "kl_diversity") == pytest.approx(expected["kl_diversity"], abs=1e-9)
    assert value("ensemble-gain", "brier_spread") == pytest.approx(expected["brier_spread"], abs=1e-9)
    assert value("selective", "aurc") == pytest.approx(expected["aurc"], abs=1e-9)


@pytest.mark.parametrize("with_ood", [True, False], ids=["with-ood", "ood-free"])
@pytest.mark.parametrize("choices", [2, 4])
def test_small_c_goes_through_every_analyzer_in_every_format(choices, with_ood, tmp_path, capsys):
    (logits, labels), (val, val_labels) = arrays(3, 80, choices, choices), arrays(3, 50, choices, 10 + choices, scale=4)
    splits = {"id": (logits, labels), "val": (val, val_labels)}
    if with_ood:
        splits["ood"] = (arrays(3, 40, choices, 20 + choices, scale=0.7)[0], None)
    metrics = metrics_of(capsys, write_jsonl(tmp_path / "mc.jsonl", splits))
    save_predictions({name: {"logits": torch.from_numpy(z), "labels": None if y is None else torch.from_numpy(y)}
                      for name, (z, y) in splits.items()}, tmp_path / "p.safetensors")
    np.savez(tmp_path / "p.npz", **{f"{name}/{kind}": array for name, (z, y) in splits.items()
                                    for kind, array in (("logits", z), ("labels", y)) if array is not None})
    assert metrics_of(capsys, tmp_path / "p.safetensors") == metrics == metrics_of(capsys, tmp_path / "p.npz")
    analyzers = metrics["analyzers"]
    skipped = {name for name, result in analyzers.items() if result["status"] != "ok"}
    assert skipped == {"weight-similarity"} | (set() if with_ood else {"ood"})  # needs weights; needs OOD
    assert metrics["num_classes"] == choices
    check_against_references(analyzers, "id", references(logits, labels))
    # temperature scaling, fitted on the val questions: the T that minimises their NLL of softmax(log p̄ / T)
    log_mean = np.log(softmax(val.astype(np.float64), -1).mean(0))
    nll = lambda t: log_loss(val_labels, softmax(log_mean / t, -1), labels=list(range(choices)))  # noqa: E731
    best = minimize_scalar(nll, bounds=(0.02, 50), method="bounded", options={"xatol": 1e-10}).x
    assert analyzers["temperature"]["temperature_pooled"]["value"] == pytest.approx(best, rel=1e-4)
    if with_ood:
        score = lambda z: 1 - softmax(z.astype(np.float64), -1).mean(0).max(1)  # noqa: E731
        scores = np.r_[score(logits), score(splits["ood"][0])]
        is_ood = np.r_[np.zeros(80), np.ones(40)]
        msp = analyzers["ood"]["scores"]["msp"]
        assert msp["auroc"]["value"] == pytest.approx(roc_auc_score(is_ood, scores), abs=1e-12)
        assert msp["aupr_out"]["value"] == pytest.approx(average_precision_score(is_ood, scores), abs=1e-12)


# ---------------------------------------------------------------- hostile lines

GOOD = '{"answer": 0, "scores": [[1, 2], [2, 1]]}'
DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = {
    "not UTF-8": (GOOD.encode() + b'\n{"id": "\xff"}\n', r"bad\.jsonl, line 2: not UTF-8 text"),
    "not JSON": (GOOD + '\n\n{"answer": 0,\n', r"line 3: not JSON \(.* at column"),
    "an array": ("[1, 2]", r"line 1: an array, not an object"),
    "a number": ("3", r"line 1: a number, not an object"),
    "NaN": ('{"answer": 0, "scores": [[NaN, 1]]}', r"line 1: NaN is not a finite number"),
    "-Infinity": ('{"answer": 0, "scores": [[1, -Infinity]]}', r"line 1: -Infinity is not a finite number"),
    "overflowing float": ('{"answer": 0, "scores": [[1e400, 1]]}', r"member 0: inf is not a finite float32 score"),
    "beyond float32": ('{"answer": 0, "scores": [[1, 2], [1e39, 1]]}', r"member 1: 1e\+39 is not a finite float32"),
    "a text score": ('{"answer": 0, "scores": [["1", 2]]}', r"member 0: '1' is not a number"),
    "a boolean score": ('{"answer": 0, "scores": [[true, 2]]}', r"member 0: True is not a number"),
    "ragged members": ('{"answer": 0, "scores": [[1, 2], [1]]}', r"member 1 has 1 scores, member 0 has 2 \(ragged"),
    "C differs": (GOOD + '\n{"answer": 0, "scores": [[1, 2, 3], [2, 1, 0]]}',
                  r"line 2: 3 choices, line 1 has 2: ensdiag needs one number of choices per file"),
    "k differs": (GOOD + '\n{"answer": 0, "scores": [[1, 2]]}', r"line 2: 1 member, line 1 has 2"),
    "one choice": ('{"answer": 0, "scores": [[1], [2]]}', r"line 1: 1 choice; a question needs at least two"),
    "no scores": ('{"answer": 0}', r'line 1: no "scores"'),
    "flat scores": ('{"answer": 0, "scores": [1, 2]}', r'"scores" must be a non-empty list of lists'),
    "empty scores": ('{"answer": 0, "scores": []}', r'"scores" must be a non-empty list of lists'),
    "no answer": (GOOD + '\n{"scores": [[1, 2], [2, 1]]}', r'line 2: no "answer" \(the index of the correct choice, 0\.\.1'),
    "answer out of range": ('{"answer": 2, "scores": [[1, 2]]}', r'"answer" must be a choice index 0\.\.1, got 2'),
    "negative answer": ('{"answer": -1, "scores": [[1, 2]]}', r'got -1'),
    "answer as a float": ('{"answer": 1.0, "scores": [[1, 2]]}', r'got 1\.0'),
    "answer as a letter": ('{"answer": "B", "scores": [[1, 2]]}', r"got 'B'"),
    "answer as a boolean": ('{"answer": true, "scores": [[1, 2]]}', r"got True"),
    "repeated id": ('{"id": "q1", ' + GOOD[1:] + '\n\n{"id": "q1", ' + GOOD[1:], r"line 3: id 'q1' repeats line 1"),
    "unknown split": ('{"split": "test", ' + GOOD[1:], r'"split" must be id or val or shift or ood, got \'test\''),
    "empty file": ("", r"holds no questions"),
    "blank lines": ("\n \n\t\n", r"holds no questions"),
    "only OOD": ('{"split": "ood", "scores": [[1, 2]]}', r"no in-distribution questions"),
    "deep nesting": ('{"scores": ' + DEEP + "}", r"line 1: nests arrays too deeply"),
    "a 5,000-digit integer": ('{"answer": ' + "1" * 5000 + "}", r"line 1: not JSON"),
    "long id": ('{"id": "' + "x" * 300 + '", ' + GOOD[1:], r'"id" is longer than 256 characters'),
    "float id": ('{"id": 1.5, ' + GOOD[1:], r'"id" must be a string or a 64-bit integer, got 1\.5'),
}


@pytest.mark.parametrize("content,match", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_lines_are_one_line_errors_with_the_line_number(content, match, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert_one_line_error(capsys, "analyze", path, match=match)


def test_control_characters_of_an_id_are_shown_escaped(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(('{"id": "\\u001b[31mred", ' + GOOD[1:] + "\n") * 2)
    line = assert_one_line_error(capsys, "analyze", path, match=r"line 2: id '\\x1b\[31mred' repeats line 1")
    assert "\x1b" not in line


def test_lines_and_files_are_bounded(tmp_path, capsys, monkeypatch):
    from ensdiag import checks
    from ensdiag.foreign import jsonl
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(GOOD for _ in range(12)))
    monkeypatch.setattr(jsonl, "MAX_LINES", 10)
    assert_one_line_error(capsys, "analyze", path, match=r"line 11: more than 10 lines")
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", len(GOOD) - 1)
    assert_one_line_error(capsys, "analyze", path, match=rf"line 1: longer than {len(GOOD) - 1} bytes")
    monkeypatch.undo()
    monkeypatch.setattr(checks, "MAX_MEMBERS", 1)
    assert_one_line_error(capsys, "analyze", path, match=r"line 1: 2 members; ensdiag compares every pair and takes at most 1")
    monkeypatch.undo()
    write_jsonl(path, {"id": arrays(3, 30, 4, 0)})
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "2K")  # 28 bytes per score: 8 questions of 12 scores are too many
    assert_one_line_error(capsys, "analyze", path, match=r"line 8: analysing \[k=3, N=8, C=4\] predictions needs about "
                                                         r".* more than the memory budget of 2\.0 KiB")
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "8K")  # the doublings pass (16 questions), the whole file does not
    assert_one_line_error(capsys, "analyze", path, match=r"big\.jsonl: id \(30 questions\): analysing \[k=3, N=30, C=4\]")


def test_probabilities_that_are_not_are_refused_at_their_line(tmp_path, capsys):
    path = tmp_path / "probs.jsonl"
    path.write_text('{"answer": 0, "scores": [[0.5, 0.5], [0.9, 0.1]]}\n{"answer": 1, "scores": [[0.5, 0.5], [-1.2, -0.4]]}\n')
    assert_one_line_error(capsys, "analyze", path, "--inputs", "probs",
                          match=r"line 2: member 1's scores are not probabilities .* pass --inputs logits")
    assert metrics_of(capsys, path)["num_classes"] == 2  # as logits they are fine


@pytest.mark.parametrize("extra,match", [
    (["--labels", "labels.npy"], r"a \.jsonl file holds every member's scores"),
    (["--ood", "ood.npy"], r"a \.jsonl file holds every member's scores"),
    (["--ood", "ood.jsonl", "--ood", "ood.jsonl"], r"a \.jsonl file holds every member's scores"),
    (["--ood", "id-split.jsonl"], r"id-split\.jsonl, line 1: \"split\" must be ood, got 'id'"),
    (["--ood", "three.jsonl"], r"three\.jsonl, line 1: 3 choices, .*main\.jsonl, line 1 has 2"),
    (["--method", "single"], r"--method saves the analysis as a run of a folder: give that folder with --out"),
    (["--seed", "1"], r"--seed names the run --method saves"),
    (["--out", "runs", "--method", "../up"], r"method name '\.\./up' must be"),
    (["--out", "runs", "--method", "single", "--seed", "-1"], r"seed must be an integer in 0"),
])
def test_options_that_do_not_fit_a_jsonl_file(extra, match, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("main.jsonl").write_text(GOOD + "\n")
    Path("id-split.jsonl").write_text('{"split": "id", ' + GOOD[1:])
    Path("three.jsonl").write_text('{"scores": [[1, 2, 3], [3, 2, 1]]}')
    Path("ood.jsonl").write_text('{"scores": [[1, 2], [3, 2]]}')
    np.save("labels.npy", np.zeros(1, dtype=np.int64))
    np.save("ood.npy", np.zeros((2, 1, 2), dtype=np.float32))
    assert_one_line_error(capsys, "analyze", "main.jsonl", *extra, match=match)
    assert not Path("runs").exists()


def test_ood_questions_come_from_the_file_or_from_ood_not_both(tmp_path, capsys):
    path, ood = tmp_path / "with-ood.jsonl", tmp_path / "ood.jsonl"
    path.write_text(GOOD + '\n{"split": "ood", "scores": [[1, 2], [3, 2]]}\n')
    ood.write_text('{"scores": [[1, 2], [3, 2]]}')
    assert_one_line_error(capsys, "analyze", path, "--ood", ood, match="keep them in one place")


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-1e40, 1e40) | st.text(max_size=3),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=12)
QUESTIONS = st.dictionaries(st.sampled_from(["id", "answer", "scores", "split"]), JSON_VALUES, max_size=4)
SCORES = st.floats(-3.4e38, 3.4e38) | st.integers(-5, 5) | st.sampled_from([0.0, 1.0, 0.5, 1e-45, 3.4e38])


@st.composite
def questions_of_one_shape(draw):
    """Well-formed lines of one k and C with extreme scores, answers and splits: they must analyse."""
    k, choices = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    member = st.lists(SCORES, min_size=choices, max_size=choices)
    question = st.fixed_dictionaries({"scores": st.lists(member, min_size=k, max_size=k),
                                      "answer": st.integers(0, choices - 1),
                                      "split": st.sampled_from(["id", "val", "shift", "ood"])})
    return [{**draw(question), "split": "id"}, *draw(st.lists(question, max_size=4))]


def invoke(path, *args) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["analyze", str(path), "--format", "json", *map(str, args)])
            code = 0
        except SystemExit as done:
            code = done.code
    return code, err.getvalue()


def write_lines(path, lines):
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines))
    return path


@SETTINGS
@given(st.lists(QUESTIONS | st.binary(max_size=40), min_size=1, max_size=4), st.booleans())
def test_random_lines_give_metrics_or_one_line_naming_the_file(tmp_path, lines, probs):
    path = write_lines(tmp_path / "random.jsonl", lines)
    code, err = invoke(path, *(["--inputs", "probs"] if probs else []))
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 2:
        errors = [line for line in err.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith(f"error: {path}"), err


@SETTINGS
@given(questions_of_one_shape())
def test_well_formed_questions_analyse_however_extreme_their_scores(tmp_path, lines):
    code, err = invoke(write_lines(tmp_path / "questions.jsonl", lines))
    assert code == 0, err


# ---------------------------------------------------------------- into the report


def simulated(method, seed, questions=120, ood=60, choices=2):
    """[k, N, C] scores: a single fine-tune, independent fine-tunes, or adapters sharing one base's errors."""
    rng = np.random.default_rng([seed, ["single", "deep-ensemble", "lora"].index(method)])
    answers = np.random.default_rng(7).integers(0, choices, questions)
    signal = np.zeros((questions + ood, choices))
    signal[np.arange(questions), answers] = 2.5
    k = 1 if method == "single" else 4
    shared, own = (1.4, 0.3) if method == "lora" else (0.0, 1.4)
    scores = signal + rng.normal(0, shared, signal.shape) + rng.normal(0, own, (k, *signal.shape))
    return scores.astype(np.float32), answers


@pytest.mark.parametrize("with_ood", [True, False], ids=["with-ood", "ood-free"])
def test_analyze_with_method_and_seed_feeds_the_full_report(with_ood, tmp_path, capsys):
    seeds = (0, 1, 2) if with_ood else (0,)
    for method in ("single", "deep-ensemble", "lora"):
        for seed in seeds:
            scores, answers = simulated(method, seed)
            splits = {"id": (scores[:, :120], answers)} | ({"ood": (scores[:, 120:], None)} if with_ood else {})
            path = write_jsonl(tmp_path / f"{method}-{seed}.jsonl", splits)
            code, _, err = run_cli(capsys, "analyze", path, "--out", tmp_path / "runs", "--method", method, "--seed", seed)
            assert code == 0 and f"saved to {tmp_path / 'runs' / method / f'seed-{seed}'}" in err, err
    experiment = json.loads((tmp_path / "runs" / "experiment.json").read_text())
    assert experiment["kind"] == "diagnosis" and experiment["config"]["seeds"] == list(seeds)
    meta = json.loads((tmp_path / "runs" / "lora" / "seed-0" / "meta.json").read_text())
    assert meta["source"] == "ensdiag analyze lora-0.jsonl"
    code, out, err = run_cli(capsys, "report", tmp_path / "runs", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    tables = [table["id"] for table in report["tables"]]
    assert tables[0] == "verdict" and {"id", "diversity", "members", "gain", "calibration"} <= set(tables)
    assert ("ood" in tables) is with_ood and "shift" not in tables  # a split no run has is left out, said so
    assert set(report["skipped_splits"]) == ({"shift"} if with_ood else {"shift", "ood"})
    verdict = report["verdict"]["lora"]
    assert verdict["seeds"] == len(seeds) and ("auroc" in verdict) is with_ood
    # led by its effective size where the Deep Ensemble's curve gives one, else by its name
    assert verdict["diversity"]["value"] < 0.25 and re.match(r"lora( \(k = 4\) ≡ a Deep Ensemble of |: )", verdict["answer"])
    figures = {figure["name"] for figure in report["figures"]}
    assert {"diversity", "reliability", "risk-coverage"} <= figures and ("ood-scores" in figures) is with_ood
    assert all((tmp_path / "runs" / figure["png"]).is_file() for figure in report["figures"])
    assert "Verdict" in (tmp_path / "runs" / "report.md").read_text()


# ---------------------------------------------------------------- the documented example (docs/llm.md)


def test_the_documented_example_runs_as_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    commands = recorded_commands("docs/llm.md", "Multiple-choice predictions", tmp_path)
    assert [command[:2] for command in commands[:3]] == [["ensdiag", "analyze"], ["python", "examples/multiple_choice_scores.py"],
                                                         ["ensdiag", "analyze"]]
    assert len(commands) == 2 + 9 + 1 and commands[-1][:2] == ["ensdiag", "report"]
    printed = ""
    for command in commands:
        printed += run_recorded(capsys, command, ROOT)
    for block in blocks(section("docs/llm.md", "Multiple-choice predictions"), "text"):  # the output the page shows
        for line in block.strip().splitlines():
            assert line in printed, line
    assert "like a single model — 0.08× [" in printed  # the diversity term the page quotes after the verdict
    assert (tmp_path / "runs" / "mc" / "figures" / "reliability.png").is_file()
