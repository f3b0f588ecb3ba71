"""lm-eval's own reading of a multiple-choice line: which choice its `target` names, and lm-eval's
per-line metrics recomputed from it (torch-free; lm_eval_lines.py calls both for every line).

lm-evaluation-harness 0.4.13 (lm_eval/api/task.py: `doc_to_target`, `process_results`) takes a
document's answer from the task's `doc_to_target` and logs `str()` of it as the line's `target`,
so the index 2 and a choice whose text is "2" are logged alike. Its reading, which ensdiag follows,
with the task's config from `results_*.json` and the document logged on the line (`doc`):

- `doc_to_target` an integer: that index, for every document;
- the name of one of the document's columns: the column's value: an integer is an index, a
  string the first choice with that text (`choices.index`);
- any other string is a template; its text (the logged target) is an index when it is digits
  (lm-eval reads them with `ast.literal_eval`: ASCII digits, no leading zero), several correct
  choices when it is a list "[…]", otherwise the first choice with that text;
- a Python function (`!function`, logged as its source) or no config at all (a samples file
  without its results file): the type of its value is not in the log, so both readings are
  tried and the one lm-eval's own logged metrics agree with is taken; where both or neither
  agree the line is refused.

`check_logged` then recomputes each per-line metric lm-eval logged (`acc`, `acc_norm`,
`acc_bytes`, `acc_mutual_info`, `exact_match`) from the logged log-likelihoods and that answer,
as `process_results` computes it (numpy's argmax: the first maximum); a line whose logged metric
differs is refused, naming it. Tasks with their own `process_results` log metrics of their own
making: theirs are not checked (the reading above still applies).
"""

import ast
import re
from dataclasses import dataclass

from ..errors import shown

CHECKED = ("acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match")
INDEX = re.compile(r"0+|[1-9][0-9]{0,8}", re.ASCII)  # what str() of an int index looks like (≤ 9 digits)
FUNCTION = re.compile(r"^\s*(def |async def |lambda\b|<function |<bound method |functools\.partial)")
MAX_LITERAL = 10_000  # characters of a "[…]" target given to ast.literal_eval, as lm-eval does


class TargetError(ValueError):
    """Why a line's target is not a choice lm-eval scored against (the reader adds file and line)."""


@dataclass(frozen=True)
class TargetRule:
    """How the task's config says lm-eval got each document's answer."""

    kind: str  # "index" (one for every document), "text" (a column name or a template), "function", "unknown"
    value: object = None  # the index, or the column name / template
    custom_metrics: bool = False  # the task has its own process_results: its logged metrics are its own

    def describe(self) -> str:
        return {"index": f"doc_to_target {self.value!r} (an index)", "text": f"doc_to_target {str(self.value)[:40]!r}",
                "function": "doc_to_target a Python function", "unknown": "no task config (results_*.json)"}[self.kind]


def target_rule(config: dict | None) -> TargetRule:
    """The task's `doc_to_target` as logged in results_*.json's `configs` ({} or None: unknown)."""
    if not isinstance(config, dict) or "doc_to_target" not in config or config.get("use_prompt"):
        return TargetRule("unknown")
    custom = config.get("process_results") is not None
    rule = config["doc_to_target"]
    if type(rule) is int:
        return TargetRule("index", rule, custom)
    if isinstance(rule, str) and not FUNCTION.match(rule):
        return TargetRule("text", rule, custom)
    return TargetRule("function", None, custom)


@dataclass
class Choices:
    """One line's choices as lm-eval scored them."""

    texts: list  # each choice's text (the continuation without the target delimiter)
    lls: list  # each choice's log-likelihood (after the line's filter)
    answers: list  # the filtered answers as logged, [log-likelihood, is_greedy] per choice
    unconditional: list | None  # acc_mutual_info's log-likelihoods without the context

    def greedy(self, index: int) -> bool | None:
        """is_greedy of choice `index` (lm-eval writes "True"/"False"), None where not logged."""
        answer = self.answers[index]
        flag = answer[1] if isinstance(answer, list) and len(answer) > 1 else None
        return {"True": True, "False": False, True: True, False: False}.get(flag) if isinstance(flag, (str, bool)) else None


def gold_of(rule: TargetRule, row: dict, choices: Choices) -> tuple[int, str]:
    """(the index of the choice lm-eval scored as correct, how it was read); TargetError if none."""
    target = row.get("target")
    if type(target) is int:  # not lm-eval's (it logs a string), but unambiguous
        target = str(target)
    if not isinstance(target, str):
        raise TargetError(f'"target" must be the answer (an index or a choice\'s text), got {shown(target)}')
    count = len(choices.texts)
    if rule.kind == "index":
        return _index(rule.value, count, target), "the task's index"
    doc = row.get("doc")
    if rule.kind == "text" and isinstance(doc, dict) and rule.value in doc:
        return _from_column(rule.value, doc[rule.value], target, choices.texts)
    if rule.kind == "text":
        return _from_template(target, choices.texts)
    return _either(rule, row, target, choices)


def _index(value: int, count: int, target: str) -> int:
    if not 0 <= value < count:
        raise TargetError(f"target {shown(target)} is choice index {value}, but the question has {count} choices "
                          "(lm-eval scored it 0 for every model)")
    return value


def _text(target: str, texts: list) -> int:
    if target not in texts:
        raise TargetError(f"target {shown(target)} is no choice's text (the choices are "
                          f"{', '.join(map(shown, texts[:6]))}{', …' if len(texts) > 6 else ''}); lm-eval scored it 0 "
                          "for every model")
    return texts.index(target)  # the first choice with that text, as lm-eval's choices.index


def _from_column(name: str, value, target: str, texts: list) -> tuple[int, str]:
    if str(value) != target:
        raise TargetError(f"target {shown(target)} is not str() of the document's column {name!r} "
                          f"({shown(value)}): not a line lm-eval wrote")
    if isinstance(value, bool) or isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return _index(int(value), len(texts), target), f"column {name!r}, an integer: an index"
    if isinstance(value, str):
        return _text(value, texts), f"column {name!r}, a string: a choice's text"
    if isinstance(value, list):
        raise TargetError(f"target {shown(target)} (column {name!r}) names several correct choices: ensdiag needs one "
                          "per question")
    raise TargetError(f"the document's column {name!r} holds {shown(value)}, no answer lm-eval scores a choice against")


def _from_template(target: str, texts: list) -> tuple[int, str]:
    if target.isdigit():  # lm-eval: str.isdigit(), then ast.literal_eval
        if not INDEX.fullmatch(target):
            if target.isascii() and target.isdigit() and target[0] != "0":  # a valid literal, over 9 digits
                raise TargetError(f"target {shown(target)} is choice index {target[:12]}{'…' if len(target) > 12 else ''}, "
                                  f"but the question has {len(texts)} choices (lm-eval scored it 0 for every model)")
            raise TargetError(f"target {shown(target)} is digits lm-eval cannot have logged: it reads a template's "
                              "digits with ast.literal_eval, which takes ASCII digits without a leading zero")
        return _index(int(target), len(texts), target), "template digits: an index"
    if len(target) >= 2 and target[0] == "[" and target[-1] == "]" and len(target) <= MAX_LITERAL:
        try:
            several = isinstance(ast.literal_eval(target), list)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            several = False  # lm-eval keeps the text
        if several:
            raise TargetError(f"target {shown(target)} names several correct choices: ensdiag needs one per question")
    return _text(target, texts), "template text: a choice's text"


def _either(rule: TargetRule, row: dict, target: str, choices: Choices) -> tuple[int, str]:
    """Both readings, kept where lm-eval's own logged metrics agree with them."""
    texts = choices.texts
    candidates = [int(target)] if INDEX.fullmatch(target) and int(target) < len(texts) else []
    if target in texts and texts.index(target) not in candidates:
        candidates.append(texts.index(target))
    if not candidates:
        raise TargetError(f"target {shown(target)} is neither a choice index 0..{len(texts) - 1} nor a choice's text")
    if len(candidates) == 1:
        return candidates[0], "an index" if INDEX.fullmatch(target) and candidates[0] == int(target) else "a choice's text"
    agree = [c for c in candidates if not rule.custom_metrics and disagreement(row, c, choices) is None]
    if len(agree) == 1:
        return agree[0], "lm-eval's logged metrics"
    why = "and its logged metrics agree with both" if len(agree) == 2 else \
        "and its logged metrics agree with neither" if not rule.custom_metrics and any(m in row for m in CHECKED) else \
        "and no metric logged on the line tells which"
    hint = "; keep lm-eval's results_*.json beside the samples file: its task config says how lm-eval read targets" \
        if rule.kind == "unknown" else ""
    raise TargetError(f"target {shown(target)} is both choice {candidates[0]}'s index and choice {candidates[1]}'s "
                      f"text ({rule.describe()}), {why}{hint}")


def _argmax(values) -> int:
    return values.index(max(values))  # the first maximum, as numpy's argmax (the values are finite)


def recomputed(metric: str, gold: int, choices: Choices):
    """lm-eval's per-line `metric` for the answer `gold` (process_results), or None where the
    line lacks what it needs (a zero-length choice for acc_norm, no unconditional log-likelihoods)."""
    lls, texts = choices.lls, choices.texts
    if metric == "acc":
        return float(_argmax(lls) == gold)
    if metric in ("acc_norm", "acc_bytes"):
        lengths = [float(len(t) if metric == "acc_norm" else len(t.encode("utf-8"))) for t in texts]
        return None if 0 in lengths else float(_argmax([ll / n for ll, n in zip(lls, lengths)]) == gold)
    if metric == "acc_mutual_info":
        if choices.unconditional is None:
            return None
        return float(_argmax([c - u for c, u in zip(lls, choices.unconditional)]) == gold)
    if metric == "exact_match":
        greedy = choices.greedy(gold)
        return None if greedy is None else float(greedy)
    raise KeyError(metric)


def disagreement(row: dict, gold: int, choices: Choices) -> str | None:
    """The first lm-eval metric logged on the line whose value `gold` does not give, as a phrase;
    None when every logged one agrees."""
    for metric in CHECKED:
        logged = row.get(metric)
        if logged is None:
            continue
        if type(logged) not in (int, float) or logged not in (0, 1):
            return f"logs {metric} {shown(logged)}, not 0 or 1"
        found = recomputed(metric, gold, choices)
        if found is not None and found != logged:
            return f"logs {metric} {logged:g}, but choice {gold} as the answer gives {found:g}"
    return None
