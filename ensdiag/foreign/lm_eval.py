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

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import EnsdiagError, unknown
from ..io import distinct_members, identity
from . import lm_eval_files as files
from .lm_eval_lines import LOGGED, SCORE_TITLES, SCORES, Reader, first_argmax
from .predictions import PAD_LOGIT, check_analysis_size


@dataclass(frozen=True)
class LmEvalOptions:
    """The choices `ensdiag analyze` offers for lm-eval logs (None: the only or first one)."""

    task: str | None = None
    ood_task: str | None = None
    filter: str | None = None
    score: str = "loglikelihood"


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
    members = [member for source in distinct_members(sources, "lm-eval run") for member in files.members_of(Path(source))]
    chosen = [files.select(member, options.task, "--task") for member in members]
    _distinct(chosen)
    warnings: list[str] = []
    splits, section = _split(chosen, options, warnings, "id")
    if options.ood_task is not None or ood:
        ood_members = [m for source in distinct_members(ood, "lm-eval run") for m in files.members_of(Path(source))] \
            if ood else members
        if len(ood_members) != len(members):
            raise EnsdiagError(f"--ood gives {len(ood_members)} run(s), the predictions {len(members)} members: one OOD run "
                               "per member, in the same order")
        ood_chosen = [files.select(member, options.ood_task, "--ood-task") for member in ood_members]
        _distinct(ood_chosen)
        ood_splits, ood_section = _split(ood_chosen, options, warnings, "ood")
        splits["ood"] = {"logits": ood_splits["ood"]["logits"], "labels": None}
        section["ood_task"], section["ood_documents"] = ood_section["task"], ood_section["documents"]
    width = max(split["logits"].shape[2] for split in splits.values())
    for name, split in splits.items():  # one C for every split: pad with choices of probability 0
        k, n, _ = split["logits"].shape  # an OOD task of many 2-choice questions padded to the ID's C: checked first
        check_analysis_size(k, n, width, f"{name} ({n:,} documents padded to {width:,} choices)")
        split["logits"] = _padded(split["logits"], width)
    if about is not None:
        about.update({"titles": _titles(splits, section), "lm_eval": section, "notes": _notes(section)})
    return splits, warnings


def _distinct(chosen):
    """No samples file read for two members (a model folder and a samples file in it, an output folder and one of
    its model folders, a link to either): one member's log would count twice."""
    readers = {}
    for selection in chosen:
        for path in selection.files.values():
            other = readers.setdefault(identity(path), selection)
            if other is not selection:
                raise EnsdiagError(f"{other.member.name} and {selection.member.name} are one member: both read {path}; "
                                   "give each lm-eval run once")


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
        for subtask, path in selection.files.items():
            delimiter = files.task_config(selection.results, subtask).get("target_delimiter", " ")  # lm-eval's default
            reader = Reader(path, filter_name, options.score, delimiter if isinstance(delimiter, str) else " ",
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
