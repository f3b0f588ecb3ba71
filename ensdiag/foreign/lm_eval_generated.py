"""lm-eval logs of generated answers (`output_type: generate_until`, GSM8K-like tasks): each
member's answer to each question after lm-eval's filters, and lm-eval's own score of it.

    answers, warnings = load_lm_eval_answers(["out/lora__a0", "out/lora__a1"], LmEvalOptions("gsm8k"))  # lm_eval.py
    answers["id"]["ids"]       # [k, N] int64: the same id for the same (normalised) answer to a question
    answers["id"]["correct"]   # [k, N] bool: lm-eval's exact_match of each member's answer

What lm-eval 0.4.13 logs per line (one per document and filter; lm_eval/api/task.py
`process_results`, filters/): `filtered_resps` = [the answer] (the filter's output: a regex's
extraction, "[invalid]" where it found none, the first generation by `take_first`), and
`exact_match`: its score of that answer against the line's `target` after the metric's
normalisation (`regexes_to_ignore`, `ignore_case`, `ignore_punctuation`, `ignore_numbers`, from
the task's `metric_list` in results_*.json). The logged exact_match is each member's
correctness. Where the task's options are known (and the target is one string, not a list or a
choice) ensdiag recomputes it with numpy's string operations in lm-eval's order
(`exact_match_hf_evaluate`) and refuses a line where it differs. Two answers are one answer
when they are equal after that normalisation: a vote counts them together, disagreement does
not count them apart. Members are joined as for multiple choice (lm_eval.py), on doc_id,
doc_hash, prompt_hash and the target; a group's subtasks are read together, as there.
"""

import re
import string
from dataclasses import dataclass

import numpy as np
import torch

from ..budget import require
from ..errors import shown
from .lm_eval_files import task_config
from .lm_eval_lines import Reader

HELD_PER_ANSWER = 1024  # bytes reading holds per answer besides its texts (as for a multiple-choice line)
MAX_ANSWER = 64 * 1024  # characters of one filtered answer (a whole generation without a regex filter: a few KiB)
OPTIONS = ("regexes_to_ignore", "ignore_case", "ignore_punctuation", "ignore_numbers")
DECLARATIONS = ("metric", "aggregation", "higher_is_better")


def is_generated(config: dict, first_row: dict | None) -> bool:
    """A generate_until task: its config says so, or (no config) its first line's request is a
    context and generation arguments rather than a context and a continuation."""
    if isinstance(config, dict) and isinstance(config.get("output_type"), str):
        return config["output_type"] == "generate_until"
    arguments = first_row.get("arguments") if isinstance(first_row, dict) else None
    request = arguments.get("gen_args_0") if isinstance(arguments, dict) else None
    return isinstance(request, dict) and isinstance(request.get("arg_1"), dict)


def exact_match_options(config: dict) -> dict | None:
    """The exact_match options of the task's metric_list, or None where ensdiag cannot recompute
    lm-eval's score (no config, the answer is a choice, options it does not know)."""
    if not isinstance(config, dict) or config.get("doc_to_choice") is not None or config.get("process_results"):
        return None
    entries = [entry for entry in config.get("metric_list") or [] if isinstance(entry, dict)
               and entry.get("metric") == "exact_match"]
    if len(entries) != 1 or set(entries[0]) - set(OPTIONS) - set(DECLARATIONS):
        return None
    options = {key: entries[0][key] for key in OPTIONS if key in entries[0]}
    regexes = options.get("regexes_to_ignore")
    if regexes is not None and (not isinstance(regexes, list) or not all(isinstance(r, str) for r in regexes)):
        return None
    if not all(isinstance(options.get(key, False), bool) for key in OPTIONS[1:]):
        return None
    return options


def normalised(text: str, options: dict) -> str:
    """The text as lm-eval's exact_match compares it (lm_eval/api/metrics.py exact_match_hf_evaluate,
    for one prediction: numpy string arrays, operations in its order)."""
    values = np.asarray([text])
    for pattern in options.get("regexes_to_ignore") or ():
        values = np.array([re.sub(pattern, "", value) for value in values])
    if options.get("ignore_case"):
        values = np.char.lower(values)
    if options.get("ignore_punctuation"):
        values = np.char.translate(values, table=string.punctuation.maketrans("", "", string.punctuation))
    if options.get("ignore_numbers"):
        values = np.char.translate(values, table=string.digits.maketrans("", "", string.digits))
    return str(values[0])


@dataclass
class Answer:
    """One member's answer to one question, as needed after reading."""

    line: int
    doc_hash: str
    prompt_hash: str | None
    target: str
    answer: str  # normalised as lm-eval's exact_match compares (raw where its options are unknown)
    correct: bool

    def joined(self) -> tuple:
        return ("doc_hash", self.doc_hash), ("prompt_hash", self.prompt_hash), ("target", self.target)


class AnswerReader(Reader):
    """The answers of one samples file (one subtask of one member) for one filter."""

    def __init__(self, path, wanted_filter: str | None, options: dict | None):
        super().__init__(path, wanted_filter, "loglikelihood", " ", labelled=True)
        self.options = options  # exact_match's, or None: the logged score is taken as it is

    @staticmethod
    def _size(doc) -> int:  # bytes held per answer: its texts (up to 4 bytes a character) and its objects
        return 4 * (len(doc.answer) + len(doc.target)) + HELD_PER_ANSWER

    def _doc(self, number, row) -> Answer:
        fail = self.fail
        doc_id, doc_hash, prompt_hash = self._identity(number, row)
        answers = row.get("filtered_resps")
        if not isinstance(answers, list) or len(answers) != 1:
            fail(number, f'"filtered_resps" must hold the one filtered answer of a generation request, got {shown(answers)}')
        answer = answers[0]
        if isinstance(answer, list):
            fail(number, f"the filtered answer is a list of {len(answer)} generations: ensdiag reads one answer per "
                         "question (a filter that ends in take_first, as lm-eval's default)")
        if not isinstance(answer, str) or len(answer) > MAX_ANSWER:
            fail(number, f"the filtered answer must be text of at most {MAX_ANSWER:,} characters, got {shown(answer)}")
        target = row.get("target")
        if not isinstance(target, str) or len(target) > MAX_ANSWER:
            fail(number, f'"target" must be the reference answer\'s text, got {shown(target)}')
        score = row.get("exact_match")
        if type(score) not in (int, float) or score not in (0, 1):
            fail(number, f'"exact_match" must be lm-eval\'s score of the answer, 0 or 1, got {shown(score)} (ensdiag '
                         "reads generated answers scored by exact_match)")
        if self.options is not None and not (target.startswith("[") and target.endswith("]")):
            expected = float(normalised(answer, self.options) == normalised(target, self.options))
            if expected != score:
                fail(number, f"lm-eval logs exact_match {score:g}, but answer {shown(answer)} against target "
                             f"{shown(target)} gives {expected:g} with the task's options: the line was not scored as it reads")
        self.docs[doc_id] = Answer(number, doc_hash, prompt_hash, target,
                                   normalised(answer, self.options) if self.options is not None else answer, bool(score))
        return self.docs[doc_id]


def load_generated(chosen, filter_name: str | None, read_members) -> tuple[dict, dict, dict, list]:
    """({split: {"ids": [k, N], "correct": [k, N]}}, section, readers, [(subtask, doc_id)] in
    order): the members' answers, joined. `read_members(chosen, filter, make_reader, budget)` is
    lm_eval.py's reading and joining (the same as for multiple choice)."""
    held = [0]  # bytes held by every answer read so far, all members

    def budget(n, size, where):
        held[0] += size
        if n & (n - 1) == 0:  # at each file's powers of two: what is held never exceeds what was checked
            require(2 * held[0], f"{where}: reading {n:,} answers")

    def make_reader(selection, subtask, path, wanted):
        return AnswerReader(path, wanted, exact_match_options(task_config(selection.results, subtask)))

    read, order, filter_name = read_members(chosen, filter_name, make_reader, budget)
    k = len(chosen)
    ids = torch.empty(k, len(order), dtype=torch.int64)
    correct = torch.empty(k, len(order), dtype=torch.bool)
    for position, (subtask, doc_id) in enumerate(order):
        seen = {}
        for member in range(k):
            doc = read[member, subtask].docs[doc_id]
            ids[member, position] = seen.setdefault(doc.answer, len(seen))
            correct[member, position] = doc.correct
    splits = {"id": {"ids": ids, "correct": correct}}
    subtasks = list(chosen[0].files)
    if len(subtasks) > 1:
        for subtask in subtasks:
            where = torch.tensor([s == subtask for s, _ in order])
            splits[f"id/{subtask}"] = {"ids": ids[:, where], "correct": correct[:, where]}
    options = [exact_match_options(task_config(chosen[0].results, subtask)) for subtask in subtasks]
    section = {"task": chosen[0].task, "subtasks": subtasks, "filter": filter_name,
               "filters": read[0, subtasks[0]].filters, "output_type": "generate_until", "documents": len(order),
               "exact_match_checked": all(option is not None for option in options),
               "normalisation": options[0] if len(set(map(repr, options))) == 1 else "per subtask"}
    return splits, section, read, order
