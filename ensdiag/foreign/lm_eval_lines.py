"""One lm-eval samples file, read line by line for one filter (lm_eval.py joins the members).

Every line is bounded and checked like user input: a JSON object of at most `MAX_LINE_BYTES`
(a longer line is refused after reading that much of it), numbers that match a decimal pattern
(lm-eval writes them as strings) and are finite, requests and answers that fit together; a
refusal is one line naming the file and the line. docs/conventions.md, "lm-evaluation-harness
logs", says what is read and how.
"""

import json
import math
import re
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsdiagError, shown
from ..io import text_lines
from ..text import counted
from .lm_eval_targets import Choices, TargetError, TargetRule, disagreement, gold_of

SCORES = ("loglikelihood", "acc_norm", "mutual_info")
SCORE_TITLES = {"loglikelihood": "log-likelihoods", "acc_norm": "log-likelihood / characters (lm-eval's acc_norm)",
                "mutual_info": "log-likelihood − unconditional log-likelihood (lm-eval's acc_mutual_info)"}
LOGGED = {"loglikelihood": "acc", "acc_norm": "acc_norm", "mutual_info": "acc_mutual_info"}
MAX_LINE_BYTES = 16 * 2**20  # a 25-shot prompt repeated for 5 choices is well under 1 MiB
MAX_LINES = 4_000_000  # documents × filters in one file
MAX_CHOICES = 1024
MAX_SCORE = 1e20  # |log-likelihood| above this is no model's score (and would meet PAD_LOGIT)
_DECIMAL = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
NUMBER = re.compile(_DECIMAL, re.ASCII)
NUMBERS = re.compile(rf"{_DECIMAL}(?:,{_DECIMAL})*", re.ASCII)  # a line's log-likelihoods joined by commas
HASH = re.compile(r"^[0-9a-f]{1,128}$")
DECODER = json.JSONDecoder(parse_constant=lambda name: math.nan)  # one decoder for every line (NaN: refused later)
REQUESTS = [f"gen_args_{index}" for index in range(2 * MAX_CHOICES)]


@dataclass
class Doc:
    """One document of one member, as needed after reading."""

    line: int
    doc_hash: str
    prompt_hash: str | None
    gold: int
    scores: list  # the chosen score per choice

    def joined(self) -> tuple:
        """What every member's line of the document must agree on."""
        return (("doc_hash", self.doc_hash), ("prompt_hash", self.prompt_hash), ("answer", self.gold),
                ("number of choices", len(self.scores)))


def _decimal(value, fullmatch=NUMBER.fullmatch):
    """A log-likelihood as lm-eval writes it (a decimal string) as a float within ±MAX_SCORE, else None."""
    if type(value) is str and len(value) <= 64 and fullmatch(value):
        value = float(value)
    elif type(value) is not float and type(value) is not int:
        return None
    return float(value) if -MAX_SCORE <= value <= MAX_SCORE else None  # False for NaN and ±inf


class Reader:
    """Reads the documents of one samples file (one subtask of one member) for one filter."""

    def __init__(self, path: Path, wanted_filter: str | None, score: str, delimiter: str, labelled: bool,
                 rule: TargetRule = TargetRule("unknown")):
        self.path, self.filter, self.score, self.delimiter = path, wanted_filter, score, delimiter
        self.labelled = labelled  # OOD questions are unlabelled: their targets are not read
        self.rule = rule  # how lm-eval got each answer (lm_eval_targets.py)
        self.filters: list[str] = []
        self.docs: dict[int, Doc] = {}

    def fail(self, number, message):
        raise EnsdiagError(f"{self.path}, line {number}: {message}")

    def _rows(self):
        """(number, object) of the file's lines: every line bounded, strict UTF-8 JSON objects."""
        for number, text in text_lines(self.path, "lm-eval sample file", MAX_LINES, MAX_LINE_BYTES,
                                       "one document and filter per line"):
            try:
                row = DECODER.decode(text)
            except RecursionError:
                self.fail(number, "nests too deeply to be an lm-eval sample")
            except ValueError as error:
                self.fail(number, f"not JSON ({getattr(error, 'msg', str(error))[:80]})")
            if not isinstance(row, dict):
                self.fail(number, "not a JSON object (lm-eval writes one object per document and filter)")
            yield number, row

    def read(self, budget) -> "Reader":
        for number, row in self._rows():
            name = row.get("filter")
            if not isinstance(name, str) or not name or len(name) > 128:
                self.fail(number, f'"filter" must name lm-eval\'s filter, got {shown(name)}')
            if name not in self.filters:
                self.filters.append(name)
            self.filter = self.filter or name  # the first filter, unless --filter names one
            if name == self.filter:
                budget(len(self.docs) + 1, self._size(self._doc(number, row)))
        if not self.filters:
            raise EnsdiagError(f"{self.path} holds no documents (lm-eval writes one line per document and filter)")
        if self.filter not in self.filters:
            raise EnsdiagError(f"{self.path} has no filter {self.filter!r} (it has {', '.join(map(repr, self.filters))})")
        return self

    def __getstate__(self) -> dict:
        """Packed for the trip back from a forked reader (forked.py): the documents as a few flat lists
        and two joined strings of hex hashes, not an object each (a third of the wall time, unpacked)."""
        state, docs = dict(self.__dict__), self.docs.values()
        state["docs"] = (list(self.docs), [doc.line for doc in docs], ",".join(doc.doc_hash for doc in docs),
                         ",".join(doc.prompt_hash or "" for doc in docs), [doc.gold for doc in docs],
                         [doc.scores for doc in docs])
        return state

    def __setstate__(self, state: dict) -> None:
        ids, lines, doc_hashes, prompt_hashes, golds, scores = state["docs"]
        hashes = zip(doc_hashes.split(","), prompt_hashes.split(",")) if ids else ()  # (a hash is never empty)
        self.__dict__.update(state, docs={doc_id: Doc(line, doc_hash, prompt_hash or None, gold, doc_scores)
                                          for doc_id, line, (doc_hash, prompt_hash), gold, doc_scores
                                          in zip(ids, lines, hashes, golds, scores)})

    @staticmethod
    def _size(doc) -> int:
        return len(doc.scores)  # choices: what the analysis holds per document and member

    def _identity(self, number, row) -> tuple[int, str, str | None]:
        """(doc_id, doc_hash, prompt_hash) of a line, checked: members are joined on them."""
        fail = self.fail
        doc_id = row.get("doc_id")
        if type(doc_id) is not int or not 0 <= doc_id < 2**63:
            fail(number, f'"doc_id" must be lm-eval\'s document index, got {shown(doc_id)}')
        if doc_id in self.docs:
            fail(number, f"doc_id {doc_id} repeats line {self.docs[doc_id].line} for filter {self.filter!r}")
        doc_hash, prompt_hash = row.get("doc_hash"), row.get("prompt_hash")
        if not isinstance(doc_hash, str) or not HASH.match(doc_hash):
            fail(number, 'no "doc_hash" of hex digits (lm-eval writes one per line; members are joined on it)')
        if prompt_hash is not None and (not isinstance(prompt_hash, str) or not HASH.match(prompt_hash)):
            fail(number, f'"prompt_hash" must be hex digits, got {shown(prompt_hash)}')
        return doc_id, doc_hash, prompt_hash

    def _doc(self, number, row) -> Doc:
        fail = self.fail
        doc_id, doc_hash, prompt_hash = self._identity(number, row)
        contexts, continuations = self._arguments(number, row)
        lls = self._loglikelihoods(number, row, len(contexts))
        unconditional = None
        metrics = row.get("metrics") if isinstance(row.get("metrics"), list) else []
        half = len(contexts) // 2
        if "acc_mutual_info" in metrics and len(contexts) % 2 == 0 and all(
                contexts[half + i] == "" and continuations[half + i] == continuations[i] for i in range(half)):
            contexts, continuations, lls, unconditional = contexts[:half], continuations[:half], lls[:half], lls[half:]
        if not 2 <= len(lls) <= MAX_CHOICES:
            fail(number, f"{counted(len(lls), 'choice')}; a multiple-choice question has 2 to "
                         f"{MAX_CHOICES:,}")
        if len(set(continuations)) == 1 and len(set(contexts)) > 1:
            fail(number, "every choice is in the context and the continuation is shared (a task like winogrande): "
                         "the sample holds no index of the correct context; ensdiag cannot read its answer")
        scores = self._scores(number, lls, unconditional, continuations)
        gold = self._gold(number, row, continuations, lls, unconditional) if self.labelled else -1
        self.docs[doc_id] = Doc(number, doc_hash, prompt_hash, gold, scores)
        return self.docs[doc_id]

    def _arguments(self, number, row) -> tuple[list, list]:
        arguments = row.get("arguments")
        if not isinstance(arguments, dict) or not arguments:
            self.fail(number, 'no "arguments" ({"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...})')
        if len(arguments) > 2 * MAX_CHOICES:  # mutual information: two requests per choice
            self.fail(number, f"{len(arguments):,} requests; ensdiag reads at most {MAX_CHOICES:,} choices")
        with suppress(TypeError, KeyError):  # a well-formed line in one pass; any other request by request below
            pairs = [arguments.get(key) for key in REQUESTS[:len(arguments)]]
            contexts, continuations = [pair["arg_0"] for pair in pairs], [pair["arg_1"] for pair in pairs]
            if set(map(type, contexts)) == set(map(type, continuations)) == {str}:
                return contexts, continuations
        contexts, continuations = [], []
        for index, key in enumerate(REQUESTS[:len(arguments)]):
            pair = arguments.get(key)
            if type(pair) is not dict or type(pair.get("arg_0")) is not str or type(pair.get("arg_1")) is not str:
                self.fail(number, f'"arguments" lacks gen_args_{index} with a context and a continuation '
                                        "(a log-likelihood request per choice; generation tasks have no choices)")
            contexts.append(pair["arg_0"])
            continuations.append(pair["arg_1"])
        return contexts, continuations

    def _loglikelihoods(self, number, row, count) -> list[float]:
        answers = row.get("filtered_resps")
        if not isinstance(answers, list):
            self.fail(number, 'no "filtered_resps" (one [log-likelihood, is_greedy] per choice)')
        if len(answers) != count:
            self.fail(number, f"{len(answers)} log-likelihoods for {count} choices (a choice is missing)")
        with suppress(TypeError, KeyError, IndexError):  # a well-formed line, parsed and bounded at once:
            values = [answer[0] for answer in answers]  # [decimal string, is_greedy] per choice
            if set(map(type, values)) == {str} and NUMBERS.fullmatch(joined := ",".join(values)) \
                    and len(joined) <= 65 * len(values):
                floats = list(map(float, values))
                if -MAX_SCORE <= min(floats) and max(floats) <= MAX_SCORE:
                    return floats
        values = [_decimal(answer[0] if type(answer) is list and answer else answer) for answer in answers]
        if None in values:  # say which, and why
            index = values.index(None)
            value = answers[index][0] if type(answers[index]) is list and answers[index] else answers[index]
            numeric = type(value) in (int, float) or type(value) is str and len(value) <= 64 and NUMBER.fullmatch(value)
            self.fail(number, f"choice {index}'s log-likelihood {shown(value)} is "
                                    f"{'not a finite log-likelihood' if numeric else 'not a number'}")
        return values

    def _gold(self, number, row, continuations, lls, unconditional) -> int:
        """The answer as lm-eval read it (lm_eval_targets.py), refused where lm-eval's own per-line
        metrics say otherwise."""
        texts = [text[len(self.delimiter):] if text.startswith(self.delimiter) else text for text in continuations]
        choices = Choices(texts, lls, row["filtered_resps"][:len(texts)], unconditional)
        try:
            gold, how = gold_of(self.rule, row, choices)
        except TargetError as error:
            self.fail(number, str(error))
        if not self.rule.custom_metrics and (differs := disagreement(row, gold, choices)) is not None:
            self.fail(number, f"lm-eval {differs} (target {shown(row.get('target'))} read as {how}): "
                                    "the line was not scored as it reads")
        return gold

    def _scores(self, number, lls, unconditional, continuations) -> list[float]:
        if self.score == "loglikelihood":
            return lls
        if self.score == "mutual_info":
            if unconditional is None:
                self.fail(number, "--score mutual_info needs the task's unconditional log-likelihoods "
                                        "(lm-eval logs them for tasks with the metric acc_mutual_info)")
            return [c - u for c, u in zip(lls, unconditional)]
        lengths = [len(text.removeprefix(self.delimiter)) for text in continuations]  # lm-eval: len(choice)
        if 0 in lengths:
            self.fail(number, "an empty choice cannot be length-normalised (--score acc_norm)")
        return [ll / length for ll, length in zip(lls, lengths)]

