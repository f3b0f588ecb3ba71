"""lm-evaluation-harness logs as predictions: k runs of `lm_eval … --log_samples`, one member each.

    ensdiag analyze out/lora__adapter-0 out/lora__adapter-1 out/lora__adapter-2 --task arc_easy
    ensdiag analyze out/ --task mmlu --ood-task my_ood --score acc_norm

What lm-eval 0.4.13 writes per line of `samples_<task>_<date>.jsonl` (lm_eval/evaluator.py and
loggers/evaluation_tracker.py; lm_eval_files.py says where the files are): `doc_id` (restarting
at 0 in every subtask), `doc`, `target` (str() of the answer: an index or a choice's text),
`arguments` ({"gen_args_i": {"arg_0": context, "arg_1": target_delimiter + choice}}, one per
request), `resps` and `filtered_resps` (per request; a log-likelihood request's filtered answer
is `[loglik, is_greedy]`, every number turned into a string), `filter` (one line per document
and filter), `metrics` (the names computed), `doc_hash`, `prompt_hash`, `target_hash`, and the
metrics themselves (`acc`, `acc_norm`, …). A task with `acc_mutual_info` logs 2·C requests: the
C choices after the context, then the same C after an empty context.

How ensdiag reads them (docs/conventions.md, "lm-evaluation-harness logs"):
- a member's score of choice i is its log-likelihood (`--score loglikelihood`), lm-eval's
  acc_norm score loglik / len(choice) in characters (`acc_norm`), or loglik − the unconditional
  loglik (`mutual_info`); softmax over the C choices gives the member's probabilities;
- one filter (`--filter`, default the first in the file); a target of digits is the choice
  index (lm-eval turns a template's digits into an index), otherwise the choice with that text;
- members are joined on (subtask, doc_id) and must agree on doc_hash, prompt_hash and target;
- questions with fewer choices than the most any has are padded with `PAD_LOGIT` (probability
  exactly 0); a group is split `id` (pooled) plus `id/<subtask>` per subtask.
Files are hostile input: lines are bounded in length and number, numbers must match a decimal
pattern and be finite, and the memory the analysis needs is checked while reading.
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import EnsdiagError, unknown
from . import lm_eval_files as files
from .predictions import PAD_LOGIT, check_analysis_size

SCORES = ("loglikelihood", "acc_norm", "mutual_info")
SCORE_TITLES = {"loglikelihood": "log-likelihoods", "acc_norm": "log-likelihood / characters (lm-eval's acc_norm)",
                "mutual_info": "log-likelihood − unconditional log-likelihood (lm-eval's acc_mutual_info)"}
LOGGED = {"loglikelihood": "acc", "acc_norm": "acc_norm", "mutual_info": "acc_mutual_info"}
MAX_LINE_BYTES = 16 * 2**20  # a 25-shot prompt repeated for 5 choices is well under 1 MiB
MAX_LINES = 4_000_000  # documents × filters in one file
MAX_CHOICES = 1024
MAX_SCORE = 1e20  # |log-likelihood| above this is no model's score (and would meet PAD_LOGIT)
NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
HASH = re.compile(r"^[0-9a-f]{1,128}$")


@dataclass(frozen=True)
class LmEvalOptions:
    """The choices `ensdiag analyze` offers for lm-eval logs (None: the only or first one)."""

    task: str | None = None
    ood_task: str | None = None
    filter: str | None = None
    score: str = "loglikelihood"


@dataclass
class Doc:
    """One document of one member, as needed after reading."""

    line: int
    doc_hash: str
    prompt_hash: str | None
    gold: int
    scores: list  # the chosen score per choice
    correct_logged: float | None  # lm-eval's own metric of the chosen score on this line


def first_argmax(values) -> int:
    """The index of the first maximum, as numpy's argmax (and lm-eval) take it."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def looks_like_lm_eval(path: Path) -> bool:
    """A folder (of lm-eval output), or a .jsonl file named samples_… or starting as lm-eval writes."""
    path = Path(path)
    if path.is_dir():
        return True
    if files.SAMPLES.match(path.name):
        return True
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return False
    with open(path, "rb") as handle:
        return handle.read(16).lstrip(b"\xef\xbb\xbf").startswith(b'{"doc_id":')


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Lines:
    """One samples file's lines for one filter: every line bounded, strict UTF-8 JSON objects."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, number, message):
        raise EnsdiagError(f"{self.path}, line {number}: {message}")

    def __iter__(self):
        with open(self.path, "rb") as handle:
            number = 0
            while raw := handle.readline(MAX_LINE_BYTES + 1):
                number += 1
                if number > MAX_LINES:
                    self.fail(number, f"more than {MAX_LINES:,} lines (one per document and filter)")
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    self.fail(number, f"longer than {MAX_LINE_BYTES:,} bytes (one document per line)")
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"), parse_constant=lambda name: math.nan)
                except UnicodeDecodeError as error:
                    self.fail(number, f"not UTF-8 text (byte {error.start + 1} of the line)")
                except RecursionError:
                    self.fail(number, "nests too deeply to be an lm-eval sample")
                except ValueError as error:
                    self.fail(number, f"not JSON ({getattr(error, 'msg', str(error))[:80]})")
                if not isinstance(row, dict):
                    self.fail(number, "not a JSON object (lm-eval writes one object per document and filter)")
                yield number, row


def _number(lines, number, value, what) -> float:
    if isinstance(value, str) and len(value) <= 64 and NUMBER.fullmatch(value):
        value = float(value)
    elif type(value) not in (int, float):
        lines.fail(number, f"{what} {_shown(value)} is not a number")
    if not math.isfinite(value) or abs(value) > MAX_SCORE:
        lines.fail(number, f"{what} {_shown(value)} is not a finite log-likelihood")
    return float(value)


class _Reader:
    """Reads the documents of one samples file (one subtask of one member) for one filter."""

    def __init__(self, path: Path, wanted_filter: str | None, score: str, delimiter: str, labelled: bool):
        self.lines, self.filter, self.score, self.delimiter = _Lines(path), wanted_filter, score, delimiter
        self.labelled = labelled  # OOD questions are unlabelled: their targets are not read
        self.filters: list[str] = []
        self.docs: dict[int, Doc] = {}

    def read(self, budget) -> "_Reader":
        for number, row in self.lines:
            name = row.get("filter")
            if not isinstance(name, str) or not name or len(name) > 128:
                self.lines.fail(number, f'"filter" must name lm-eval\'s filter, got {_shown(name)}')
            if name not in self.filters:
                self.filters.append(name)
            self.filter = self.filter or name  # the first filter, unless --filter names one
            if name == self.filter:
                budget(len(self.docs) + 1, len(self._doc(number, row).scores))
        if not self.filters:
            raise EnsdiagError(f"{self.lines.path} holds no documents (lm-eval writes one line per document and filter)")
        if self.filter not in self.filters:
            raise EnsdiagError(f"{self.lines.path} has no filter {self.filter!r} (it has {', '.join(map(repr, self.filters))})")
        return self

    def _doc(self, number, row) -> Doc:
        fail = self.lines.fail
        doc_id = row.get("doc_id")
        if type(doc_id) is not int or not 0 <= doc_id < 2**63:
            fail(number, f'"doc_id" must be lm-eval\'s document index, got {_shown(doc_id)}')
        if doc_id in self.docs:
            fail(number, f"doc_id {doc_id} repeats line {self.docs[doc_id].line} for filter {self.filter!r}")
        doc_hash, prompt_hash = row.get("doc_hash"), row.get("prompt_hash")
        if not isinstance(doc_hash, str) or not HASH.match(doc_hash):
            fail(number, 'no "doc_hash" of hex digits (lm-eval writes one per line; members are joined on it)')
        if prompt_hash is not None and (not isinstance(prompt_hash, str) or not HASH.match(prompt_hash)):
            fail(number, f'"prompt_hash" must be hex digits, got {_shown(prompt_hash)}')
        contexts, continuations = self._arguments(number, row)
        lls = self._loglikelihoods(number, row, len(contexts))
        unconditional = None
        metrics = row.get("metrics") if isinstance(row.get("metrics"), list) else []
        half = len(contexts) // 2
        if "acc_mutual_info" in metrics and len(contexts) % 2 == 0 and all(
                contexts[half + i] == "" and continuations[half + i] == continuations[i] for i in range(half)):
            contexts, continuations, lls, unconditional = contexts[:half], continuations[:half], lls[:half], lls[half:]
        if len(lls) < 2:
            fail(number, f"{len(lls)} choice{'s' if len(lls) != 1 else ''}; a multiple-choice question needs two or more")
        if len(set(continuations)) == 1 and len(set(contexts)) > 1:
            fail(number, "every choice is in the context and the continuation is shared (a task like winogrande): "
                         "the sample holds no index of the correct context; ensdiag cannot read its answer")
        scores = self._scores(number, lls, unconditional, continuations)
        gold = self._gold(number, row, continuations, lls) if self.labelled else -1
        logged = row.get(LOGGED[self.score])
        logged = float(logged) if type(logged) in (int, float) and logged in (0, 1) else None
        self.docs[doc_id] = Doc(number, doc_hash, prompt_hash, gold, scores, logged)
        return self.docs[doc_id]

    def _arguments(self, number, row) -> tuple[list, list]:
        arguments = row.get("arguments")
        if not isinstance(arguments, dict) or not arguments:
            self.lines.fail(number, 'no "arguments" ({"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...})')
        if len(arguments) > 2 * MAX_CHOICES:
            self.lines.fail(number, f"{len(arguments):,} requests; ensdiag reads at most {MAX_CHOICES:,} choices")
        contexts, continuations = [], []
        for index in range(len(arguments)):
            pair = arguments.get(f"gen_args_{index}")
            if not isinstance(pair, dict) or not isinstance(pair.get("arg_0"), str) or not isinstance(pair.get("arg_1"), str):
                self.lines.fail(number, f'"arguments" lacks gen_args_{index} with a context and a continuation '
                                        "(a log-likelihood request per choice; generation tasks have no choices)")
            contexts.append(pair["arg_0"])
            continuations.append(pair["arg_1"])
        return contexts, continuations

    def _loglikelihoods(self, number, row, count) -> list[float]:
        answers = row.get("filtered_resps")
        if not isinstance(answers, list):
            self.lines.fail(number, 'no "filtered_resps" (one [log-likelihood, is_greedy] per choice)')
        if len(answers) != count:
            self.lines.fail(number, f"{len(answers)} log-likelihoods for {count} choices (a choice is missing)")
        values = []
        for index, answer in enumerate(answers):
            value = answer[0] if isinstance(answer, list) and answer else answer
            values.append(_number(self.lines, number, value, f"choice {index}'s log-likelihood"))
        return values

    def _scores(self, number, lls, unconditional, continuations) -> list[float]:
        if self.score == "loglikelihood":
            return lls
        if self.score == "mutual_info":
            if unconditional is None:
                self.lines.fail(number, "--score mutual_info needs the task's unconditional log-likelihoods "
                                        "(lm-eval logs them for tasks with the metric acc_mutual_info)")
            return [c - u for c, u in zip(lls, unconditional)]
        lengths = [len(text.removeprefix(self.delimiter)) for text in continuations]  # lm-eval: len(choice)
        if 0 in lengths:
            self.lines.fail(number, "an empty choice cannot be length-normalised (--score acc_norm)")
        return [ll / length for ll, length in zip(lls, lengths)]

    def _gold(self, number, row, continuations, lls) -> int:
        """The answer's index: digits are an index (lm-eval's templates turn them into one), other
        text the choice it names; where both readings fit, the one lm-eval's own `acc` agrees with."""
        target = row.get("target")
        if type(target) is int:
            target = str(target)
        if not isinstance(target, str):
            self.lines.fail(number, f'"target" must be the answer (an index or a choice\'s text), got {_shown(target)}')
        if target.startswith("[") and target.endswith("]"):
            self.lines.fail(number, f"target {_shown(target)} names several correct choices: ensdiag needs one per question")
        count = len(continuations)
        candidates = [int(target)] if target.isdigit() and int(target) < count else []
        candidates += [i for i, text in enumerate(continuations) if text == self.delimiter + target and i not in candidates]
        if len(candidates) > 1:
            acc = row.get("acc")
            best = first_argmax(lls)
            agree = [c for c in candidates if acc in (0, 1) and (best == c) == bool(acc)]
            candidates = agree if len(agree) == 1 else candidates
        if len(candidates) != 1:
            what = "is neither a choice index 0.." + str(count - 1) + " nor a choice's text" if not candidates else \
                f"is both choice {candidates[0]}'s index and choice {candidates[1]}'s text"
            self.lines.fail(number, f"target {_shown(target)} {what}")
        return candidates[0]


def load_lm_eval_predictions(sources, ood=(), options: LmEvalOptions = LmEvalOptions(),
                             about: dict | None = None) -> tuple[dict[str, dict], list[str]]:
    """({split: {"logits", "labels"}}, warnings) from lm-eval logs: each source one member (an
    output folder: one per model folder). `about`, if given, receives the titles of the splits,
    the members' names and model_args, and the lm-eval section kept with the metrics."""
    if options.score not in SCORES:
        raise unknown("--score", options.score, SCORES)
    for name, option in ((options.task, "--task"), (options.ood_task, "--ood-task")):
        if name is not None:
            files.check_task_name(name, option)
    members = [member for source in sources for member in files.members_of(Path(source))]
    chosen = [files.select(member, options.task, "--task") for member in members]
    warnings: list[str] = []
    splits, section = _split(chosen, options, warnings, "id")
    if options.ood_task is not None or ood:
        ood_members = [m for source in ood for m in files.members_of(Path(source))] if ood else members
        if len(ood_members) != len(members):
            raise EnsdiagError(f"--ood gives {len(ood_members)} members, the predictions {len(members)}: one OOD run per member")
        ood_chosen = [files.select(member, options.ood_task, "--ood-task") for member in ood_members]
        ood_splits, ood_section = _split(ood_chosen, options, warnings, "ood")
        splits["ood"] = {"logits": ood_splits["ood"]["logits"], "labels": None}
        section["ood_task"], section["ood_documents"] = ood_section["task"], ood_section["documents"]
    width = max(split["logits"].shape[2] for split in splits.values())
    for split in splits.values():  # one C for every split: pad with choices of probability 0
        split["logits"] = _padded(split["logits"], width)
    if about is not None:
        about.update({"titles": _titles(splits, section), "lm_eval": section, "notes": _notes(section)})
    return splits, warnings


def run_name_of(section: dict, seed: int | None) -> tuple[str, int]:
    """The (method, seed) a run is saved under when `analyze --out DIR` names no --method."""
    found = files.run_name(section)
    if found is None:
        raise EnsdiagError("name the run with --method (and --seed): the members' model paths in their results_*.json "
                           "(peft=, else pretrained=) name no common folder to take it from")
    return found[0], found[1] if seed is None else seed


def _notes(section) -> list[str]:
    members = section["members"]
    names = ", ".join(member["name"] for member in members[:4]) + (f" and {len(members) - 4} more" if len(members) > 4 else "")
    others = [name for name in section["filters"] if name != section["filter"]]
    also = f" (also logged: {', '.join(others)}; choose with --filter)" if others else ""
    subtasks = f", subtasks {', '.join(section['subtasks'])}" if len(section["subtasks"]) > 1 else ""
    lines = [f"lm-eval: task {section['task']} ({section['documents']} documents{subtasks}), {len(members)} member{'s' if len(members) != 1 else ''}: "
             f"{names}; filter {section['filter']}{also}; scores: {section['score_definition']}"]
    if len(section["choices"]) > 1:
        lines.append(f"questions have {', '.join(map(str, section['choices']))} choices: every question is padded to "
                     f"{section['choices'][-1]} with choices of probability 0 (docs/conventions.md)")
    if "ood_task" in section:
        lines.append(f"lm-eval: OOD questions from task {section['ood_task']} ({section['ood_documents']} documents)")
    return lines


def _split(chosen, options, warnings, split) -> tuple[dict, dict]:
    """{split (pooled), split/<subtask> for groups} and the section describing where it came from."""
    first = chosen[0]
    for other in chosen[1:]:
        if other.task != first.task or list(other.files) != list(first.files):
            raise EnsdiagError(f"{other.member.name} is a run of {other.task!r}, {first.member.name} of {first.task!r}: "
                               "every member must be scored on the same task")
    k, read = len(chosen), {}
    filter_name = options.filter
    for index, selection in enumerate(chosen):
        delimiter = files.task_config(selection.results, next(iter(selection.files))).get("target_delimiter", " ")
        for subtask, path in selection.files.items():
            delimiter = files.task_config(selection.results, subtask).get("target_delimiter", delimiter)
            reader = _Reader(path, filter_name, options.score, delimiter if isinstance(delimiter, str) else " ",
                             labelled=split != "ood")
            read[index, subtask] = reader.read(lambda n, c, where=path: _budget(k, n, c, where))
            filter_name = reader.filter  # the first file's first filter, for every other file
    order = [(subtask, doc_id) for subtask in first.files for doc_id in sorted(read[0, subtask].docs)]
    _join(chosen, read, order)
    if split != "ood":
        _check_logged(chosen, read, order, options.score, warnings)
    width = max(len(read[0, subtask].docs[doc_id].scores) for subtask, doc_id in order)
    check_analysis_size(k, len(order), width, f"{first.member.name}: {first.task}")
    logits = torch.full((k, len(order), width), PAD_LOGIT, dtype=torch.float32)
    for member in range(k):
        for position, (subtask, doc_id) in enumerate(order):
            scores = read[member, subtask].docs[doc_id].scores
            logits[member, position, :len(scores)] = torch.tensor(scores, dtype=torch.float64)
    labels = torch.tensor([read[0, subtask].docs[doc_id].gold for subtask, doc_id in order], dtype=torch.int64)
    splits = {split: {"logits": logits, "labels": labels if split != "ood" else None}}
    if len(first.files) > 1:
        for subtask in first.files:
            where = torch.tensor([s == subtask for s, _ in order])
            splits[f"{split}/{subtask}"] = {"logits": logits[:, where], "labels": labels[where]}
    choices = sorted({len(read[0, s].docs[d].scores) for s, d in order})
    section = {"task": first.task, "subtasks": list(first.files), "filter": filter_name,
               "filters": read[0, next(iter(first.files))].filters, "score": options.score,
               "score_definition": SCORE_TITLES[options.score], "choices": choices, "documents": len(order),
               "members": [_member(selection, filter_name) for selection in chosen]}
    return splits, section


def _budget(k, n, c, where):
    if n & (n - 1) == 0:  # at every power of two: what is held never exceeds what was checked
        check_analysis_size(k, 2 * n, max(c, 2), f"{where} ({n:,} documents read)")


def _join(chosen, read, order):
    """Every member has every document of member 0, of the same document, prompt and answer."""
    first = chosen[0].member.name
    for index, selection in enumerate(chosen[1:], 1):
        for subtask in selection.files:
            mine, theirs = read[0, subtask].docs, read[index, subtask].docs
            extra = sorted(set(theirs) - set(mine))
            if extra:
                doc = theirs[extra[0]]
                raise EnsdiagError(f"{selection.files[subtask]}, line {doc.line}: doc_id {extra[0]} of {subtask!r} is not "
                                   f"in {first} ({len(theirs)} documents against {len(mine)}: a different --limit?)")
        for subtask, doc_id in order:
            doc, ref = read[index, subtask].docs.get(doc_id), read[0, subtask].docs[doc_id]
            where = f"{selection.files[subtask]}"
            if doc is None:
                raise EnsdiagError(f"{where}: doc_id {doc_id} of {subtask!r} ({first}, line {ref.line}) is missing "
                                   "(a different --limit?)")
            for what, mine, theirs in (("doc_hash", doc.doc_hash, ref.doc_hash), ("prompt_hash", doc.prompt_hash, ref.prompt_hash),
                                       ("answer", doc.gold, ref.gold), ("number of choices", len(doc.scores), len(ref.scores))):
                if mine != theirs:
                    raise EnsdiagError(f"{where}, line {doc.line}: doc_id {doc_id} of {subtask!r} differs from {first}'s "
                                       f"(line {ref.line}) in its {what}: another document, prompt or task version")


def _check_logged(chosen, read, order, score, warnings):
    """lm-eval's own per-line metric against the argmax of the scores read (ties: the first)."""
    for index, selection in enumerate(chosen):
        docs = [(doc_id, read[index, subtask].docs[doc_id]) for subtask, doc_id in order]
        differ = [doc_id for doc_id, doc in docs if doc.correct_logged is not None
                  and (first_argmax(doc.scores) == doc.gold) != bool(doc.correct_logged)]
        if differ:
            warnings.append(f"{selection.member.name}: lm-eval's own {LOGGED[score]} differs from the argmax of the "
                            f"{SCORE_TITLES[score]} read on {len(differ)} document(s) (first: doc_id {differ[0]}); "
                            "the task may score its choices in its own way")


def _member(selection, filter_name) -> dict:
    args = files.model_args(selection.results)
    entry = {"name": selection.member.name, "samples": [str(path) for path in selection.files.values()],
             "results": None if selection.results_path is None else str(selection.results_path)}
    entry.update({key: str(args[key]) for key in ("pretrained", "peft", "delta") if key in args})
    acc = files.logged_metric(selection.results, selection.task, "acc", filter_name)
    if acc is not None:
        entry["lm_eval_acc"] = acc
    return entry


def _padded(logits: torch.Tensor, width: int) -> torch.Tensor:
    if logits.shape[2] == width:
        return logits
    pad = torch.full((*logits.shape[:2], width - logits.shape[2]), PAD_LOGIT, dtype=logits.dtype)
    return torch.cat([logits, pad], dim=2)


def _titles(splits, section) -> dict:
    about = f"lm-eval, filter {section['filter']}, {section['score_definition']}"
    titles = {name: f"{section['task']} ({about})" for name in splits if name == "id"}
    titles.update({name: f"{name.split('/', 1)[1]} ({about})" for name in splits if name.startswith("id/")})
    if "ood" in splits:
        titles["ood"] = f"{section['ood_task']} ({about})"
    return titles
