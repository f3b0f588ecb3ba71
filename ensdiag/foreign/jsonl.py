"""Multiple-choice predictions as JSON lines (LLM benchmarks): one question per line.

    {"id": "q17", "answer": 2, "scores": [[-4.1, -2.3, -0.7, -3.9], [-3.8, -2.9, -0.4, -4.4]]}
    {"id": "q18", "answer": 0, "scores": [[-0.9, -3.0, -2.2, -5.1], [-1.4, -1.9, -2.5, -4.0]], "split": "shift"}

- "scores": one list per member (members first) of C numbers, one per choice, in the same
  choice order for every member: logits, or each choice's log-likelihood (fine as logits:
  softmax over the C choices gives the member's probabilities); probabilities with
  `--inputs probs`.
- "answer": the index of the correct choice, 0..C−1; required, except on OOD questions, which
  are unlabelled (an answer there is ignored).
- "split": "id" (the default), "val" (temperature scaling is fitted on it), "shift" or "ood";
  OOD questions may also come in a file of their own (`--ood`).
- "id": optional, a string (at most `MAX_ID_CHARS` characters) or an integer; unique within its
  split, since a question read twice would count twice.
Other keys (the question's text, a subject) are ignored. Every question of a file (and of its
`--ood` file) has the same k members and the same C choices: predictions are [k, N, C] arrays.

Read as hostile input: lines are bounded in length and number, must be UTF-8 JSON objects of
finite numbers, and the memory the analysis will need is checked (budget.py) while reading, so
a huge file is refused before it is held. Every refusal is one line naming the file and line.
"""

import json
from array import array
from pathlib import Path

import torch

from ..errors import EnsdiagError, shown
from ..io import text_lines
from ..predictions import with_pooled_shift
from ..text import counted
from .predictions import ROW_SUM_TOLERANCE, as_logits, check_analysis_size

MAX_LINE_BYTES = 2**20  # a question with 4,096 members of 5 choices each fits with room to spare
MAX_LINES = 1_000_000  # far above any benchmark (MMLU has 14,042 questions)
MAX_ID_CHARS = 256
SPLITS = ("id", "val", "shift", "ood")
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # scores are analysed as float32
JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
              type(None): "null"}
MISSING = object()


class _NotFinite(ValueError):
    pass


def _no_constant(name):
    """json's hook for NaN, Infinity and -Infinity, which JSON does not have and scores must not be."""
    raise _NotFinite(name)


class _Split:
    """One split's questions as read: the scores flat in reading order, answers, line numbers."""

    def __init__(self):
        self.scores = array("d")
        self.answers = array("q")
        self.lines = array("q")  # each question's line, for errors found after reading
        self.ids: dict = {}
        self.next_check = 1  # questions at which the memory is checked next (doubling)


class _Reader:
    """Reads one file's questions into splits; `shape` (k, C, line) is shared with an --ood file."""

    def __init__(self, path: Path, default_split: str, allowed: tuple, shape=None):
        self.path, self.default_split, self.allowed, self.shape = path, default_split, allowed, shape
        self.splits: dict[str, _Split] = {}

    def fail(self, number, message):
        raise EnsdiagError(f"{self.path}, line {number}: {message}")

    def read(self):
        for number, text in text_lines(self.path, "predictions file", MAX_LINES, MAX_LINE_BYTES, "one question per line"):
            self._question(number, self._parse(number, text))
        if not self.splits:
            raise EnsdiagError(f"{self.path} holds no questions (one JSON object per line: "
                               '{"answer": 2, "scores": [[member 0\'s C scores], ...]})')
        return self

    def _parse(self, number, text) -> dict:
        try:
            row = json.loads(text, parse_constant=_no_constant)
        except _NotFinite as constant:
            self.fail(number, f"{constant} is not a finite number (scores and answers must be)")
        except RecursionError:
            self.fail(number, "nests arrays too deeply to be a question")
        except ValueError as error:  # JSONDecodeError, or an integer of thousands of digits
            where = f" at column {error.colno}" if hasattr(error, "colno") else ""
            self.fail(number, f"not JSON ({getattr(error, 'msg', str(error))[:80]}{where})")
        if not isinstance(row, dict):
            self.fail(number, f"{JSON_TYPES.get(type(row), 'a value')}, not an object like "
                              '{"answer": 2, "scores": [[...], ...]}')
        return row

    def _question(self, number, row):
        name = row.get("split", self.default_split)
        if not isinstance(name, str) or name not in self.allowed:
            self.fail(number, f'"split" must be {" or ".join(self.allowed)}, got {shown(name)}')
        split = self.splits.setdefault(name, _Split())
        scores = self._scores(number, row)
        answer, choices = -1, len(scores[0])  # OOD is unlabelled
        if name != "ood":
            answer = row.get("answer", MISSING)
            if answer is MISSING:
                self.fail(number, f'no "answer" (the index of the correct choice, 0..{choices - 1}; only OOD questions '
                                  "go without)")
            if type(answer) is not int or not 0 <= answer < choices:
                self.fail(number, f'"answer" must be a choice index 0..{choices - 1}, got {shown(answer)}')
        question = row.get("id")
        if question is not None:
            if type(question) is str:
                if len(question) > MAX_ID_CHARS:
                    self.fail(number, f'"id" is longer than {MAX_ID_CHARS} characters')
            elif type(question) is not int or not -2**63 <= question < 2**63:
                self.fail(number, f'"id" must be a string or a 64-bit integer, got {shown(question)}')
            if question in split.ids:
                self.fail(number, f"id {shown(question)} repeats line {split.ids[question]} (a question counted twice)")
            split.ids[question] = number
        for member in scores:
            split.scores.extend(member)
        split.answers.append(answer)
        split.lines.append(number)
        if len(split.lines) >= split.next_check:  # doubling: the scores held never exceed what the check allowed
            check_analysis_size(len(scores), len(split.lines), len(scores[0]), f"{self.path}, line {number}")
            split.next_check *= 2

    def _scores(self, number, row) -> list:
        scores = row.get("scores", MISSING)
        if scores is MISSING:
            self.fail(number, 'no "scores" (one list of choice scores per member: [[member 0\'s], [member 1\'s], ...])')
        if not isinstance(scores, list) or not scores or not all(isinstance(member, list) for member in scores):
            self.fail(number, '"scores" must be a non-empty list of lists, one per member: [[member 0\'s C scores], ...]')
        choices = len(scores[0])
        for index, member in enumerate(scores):
            if len(member) != choices:
                self.fail(number, f"member {index} has {len(member)} scores, member 0 has {choices} (ragged members)")
            for value in member:
                if type(value) not in (int, float):
                    self.fail(number, f"member {index}: {shown(value)} is not a number")
                if not -FLOAT32_MAX <= value <= FLOAT32_MAX:
                    self.fail(number, f"member {index}: {shown(value)} is not a finite float32 score")
        if choices < 2:
            self.fail(number, f"{counted(choices, 'choice')}; a question needs at least two")
        members = len(scores)
        if self.shape is None:
            self.shape = (members, choices, number, self.path)
            return scores
        first_members, first_choices, first_line, first_file = self.shape
        first = f"line {first_line}" if first_file == self.path else f"{first_file}, line {first_line}"
        if members != first_members:
            self.fail(number, f"{counted(members, 'member')}, {first} has {first_members} (every question needs every member's scores)")
        if choices != first_choices:
            self.fail(number, f"{choices} choices, {first} has {first_choices}: ensdiag needs one number of choices "
                              f"per file (write the questions with {choices} choices to a file of their own)")
        return scores


def _as_predictions(reader: _Reader, inputs: str, warnings: list) -> dict[str, dict]:
    """{split: {"logits" [k, N, C] float32, "labels" [N] | None}} of a read file."""
    members, choices = reader.shape[:2]
    result = {}
    for name, split in reader.splits.items():
        n = len(split.lines)
        check_analysis_size(members, n, choices, f"{reader.path}: {name} ({n:,} questions)")  # between doublings too
        scores = torch.frombuffer(split.scores, dtype=torch.float64).view(n, members, choices)
        scores = scores.transpose(0, 1).float().contiguous()  # members first, as every predictions array
        where = f"{reader.path}: {name}"
        if inputs == "probs":  # rows as `as_logits` requires them, but the refusal names the first bad line
            bad = (scores < 0).any(-1) | ((scores.double().sum(-1) - 1).abs() > ROW_SUM_TOLERANCE)  # [k, N]
            if bad.any():
                question = int(bad.any(0).nonzero()[0])
                member = int(bad[:, question].nonzero()[0])
                raise EnsdiagError(f"{reader.path}, line {split.lines[question]}: member {member}'s scores are not "
                                   f"probabilities (they must be non-negative and sum to 1 ±{ROW_SUM_TOLERANCE:g}); "
                                   "for logits or log-likelihoods pass --inputs logits")
        labels = None if name == "ood" else torch.frombuffer(split.answers, dtype=torch.int64).clone()
        result[name] = {"logits": as_logits(scores, inputs, where, warnings), "labels": labels}
    return result


def load_jsonl_predictions(source, ood=None, inputs: str = "logits") -> tuple[dict[str, dict], list[str]]:
    """({split: {"logits", "labels"}}, warnings) from a JSON-lines file of multiple-choice scores
    and, optionally, a second one of OOD questions."""
    main = _Reader(Path(source), "id", SPLITS).read()
    if "id" not in main.splits:
        raise EnsdiagError(f'{source} has no in-distribution questions (lines with "split": "id", or no "split")')
    readers = [main]
    if ood is not None:
        if "ood" in main.splits:
            raise EnsdiagError(f'{source} has "split": "ood" questions and --ood gives more: keep them in one place')
        readers.append(_Reader(Path(ood), "ood", ("ood",), main.shape).read())
    warnings: list[str] = []
    splits = {name: split for reader in readers for name, split in _as_predictions(reader, inputs, warnings).items()}
    return with_pooled_shift(splits), warnings
