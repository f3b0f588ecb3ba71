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
- one filter (`--filter`, default the first in the file); each target read as lm-eval read it
  (an index or a choice's text, by the task's `doc_to_target`: lm_eval_targets.py) and every
  per-line metric lm-eval logged recomputed from it: a line that disagrees is refused;
- members are joined on (subtask, doc_id) and must agree on doc_hash, prompt_hash and target;
  the same samples file as two members (a link, a hard link) is refused;
- questions with fewer choices than the most any has are padded with `PAD_LOGIT` (probability
  exactly 0); a group is split `id` (pooled) plus `id/<subtask>` per subtask, and its groups'
  numbers are aggregated as lm-eval aggregates them (lm_eval_groups.py, `section["groups"]`);
- a generate_until task's answers are read by `load_lm_eval_answers` (lm_eval_generated.py).
Files are hostile input: lines are bounded in length and number, numbers must match a decimal
pattern and be finite, and the memory reading and the analysis need is checked while reading.
Where the files are large (`PARALLEL_BYTES`) and the machine has the cores, they are read in
forked worker processes (ensdiag/forked.py), the first in this one (it names the filter the
others are read for); the numbers and any refusal are those of reading them in turn.
"""

import json
from dataclasses import dataclass
from functools import partial
from itertools import combinations
from pathlib import Path

import torch

from .. import forked
from ..budget import require
from ..errors import EnsdiagError, unknown
from ..io import distinct_members, identity, text_lines
from ..stats.generated import DEFINITIONS, question_quantities
from ..text import counted
from . import lm_eval_files as files
from . import lm_eval_groups as groups
from .lm_eval_generated import is_generated, load_generated
from .lm_eval_lines import LOGGED, MAX_LINE_BYTES, MAX_LINES, SCORE_TITLES, SCORES, Reader
from .lm_eval_targets import target_rule
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
    if path.is_dir() or files.SAMPLES.match(path.name):
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
    members, chosen = _chosen(sources, options)
    if _generated(chosen[0]):
        raise EnsdiagError(f"{chosen[0].member.name}: task {chosen[0].task!r} is generate_until (generated answers, no "
                           "choices to score): read it with load_lm_eval_answers")
    warnings: list[str] = []
    splits, section = _split(chosen, options, warnings, "id")
    if options.ood_task is not None or ood:
        ood_members = [m for source in distinct_members(ood, "lm-eval run") for m in files.members_of(Path(source))] \
            if ood else members
        if len(ood_members) != len(members):
            raise EnsdiagError(f"--ood gives {len(ood_members)} run(s), the predictions {len(members)} members: one OOD run "
                               "per member, in the same order")
        ood_chosen = [files.select(member, options.ood_task, "--ood-task") for member in ood_members]
        _distinct(ood_chosen, "OOD ")
        ood_splits, ood_section = _split(ood_chosen, options, warnings, "ood")
        splits["ood"] = {"logits": ood_splits["ood"]["logits"], "labels": None}
        section["ood_task"], section["ood_documents"] = ood_section["task"], ood_section["documents"]
    width = max(split["logits"].shape[2] for split in splits.values())
    for name, split in splits.items():  # one C for every split: pad with choices of probability 0
        k, n, c = split["logits"].shape  # an OOD task of many 2-choice questions padded to the ID's C: checked first
        check_analysis_size(k, n, width, f"{name} ({n:,} documents padded to {width:,} choices)")
        if c < width:
            split["logits"] = torch.nn.functional.pad(split["logits"], (0, width - c), value=PAD_LOGIT)
    if about is not None:
        about.update({"titles": _titles(splits, section), "lm_eval": section, "notes": _notes(section)})
    return splits, warnings


def _chosen(sources, options: LmEvalOptions) -> tuple[list, list]:
    """(members, each member's selection of the task): the options checked, each run given once."""
    if options.score not in SCORES:
        raise unknown("--score", options.score, SCORES)
    for name, option in ((options.task, "--task"), (options.ood_task, "--ood-task")):
        if name is not None:
            files.check_task_name(name, option)
    members = [member for source in distinct_members(sources, "lm-eval run") for member in files.members_of(Path(source))]
    chosen = [files.select(member, options.task, "--task") for member in members]
    _distinct(chosen, "")
    return members, chosen


def _generated(selection) -> bool:
    """Whether the selected task is lm-eval's generate_until (its config, else its first line)."""
    subtask, path = next(iter(selection.files.items()))
    config = files.task_config(selection.results, subtask)
    if isinstance(config.get("output_type"), str):
        return is_generated(config, None)
    for _, text in text_lines(path, "lm-eval sample file", MAX_LINES, MAX_LINE_BYTES, "one document and filter per line"):
        try:  # the first line that is not blank
            return is_generated({}, json.loads(text))
        except (ValueError, RecursionError):
            return False  # the reader says what is wrong with the line
    return False


def lm_eval_answers_task(sources, options: LmEvalOptions = LmEvalOptions()) -> bool:
    """Whether the lm-eval logs given hold generated answers (a generate_until task)."""
    distinct_members(sources, "lm-eval run")  # a run given twice: that, before what its first task is
    return _generated(_chosen(sources[:1], options)[1][0])


def load_lm_eval_answers(sources, options: LmEvalOptions = LmEvalOptions(),
                         about: dict | None = None) -> tuple[dict[str, dict], list[str]]:
    """({split: {"ids", "correct"}}, warnings) of a generate_until task's logs, each source one
    member (lm_eval_generated.py); `about` receives the lm-eval section and the notes."""
    if options.score != "loglikelihood":  # a score of the choices' log-likelihoods
        raise EnsdiagError(f"--score {options.score} scores the choices of multiple-choice questions; a generate_until "
                           "task's answers are scored by lm-eval's exact_match")
    if options.ood_task is not None:
        raise EnsdiagError("--ood-task: generated answers have no probabilities to tell OOD questions by")
    _, chosen = _chosen(sources, options)
    splits, section, read, order = load_generated(chosen, options.filter, _read_members)
    section["members"] = [_member(selection, section["filter"], "exact_match") for selection in chosen]
    warnings: list[str] = []
    if not section["exact_match_checked"]:
        warnings.append(f"task {section['task']}: lm-eval's exact_match options are not all known (no results_*.json, an "
                        "answer that is a choice, or options ensdiag does not know): each line's logged exact_match "
                        "is taken as it is, and answers are compared as logged")
    if (tree := groups.group_tree(chosen[0].results, chosen[0].task)):
        section["groups"] = _group_section(chosen, tree, order, question_quantities(**splits["id"]), DEFINITIONS,
                                           "exact_match", section["filter"], warnings)
    if about is not None:
        about.update({"lm_eval": section, "notes": _notes(section)})
    return splits, warnings


def run_name_of(section: dict, seed: int | None) -> tuple[str, int]:
    """The (method, seed) a run is saved under when `analyze --out DIR` names no --method."""
    found = files.run_name(section)
    if found is None:
        raise EnsdiagError("name the run with --method (and --seed): the members' model paths in their results_*.json "
                           "(peft=, else pretrained=) name no common folder to take it from")
    return found[0], found[1] if seed is None else seed


def _distinct(chosen, what: str):
    """Every member reads its own samples files: the same file read for two members (given twice, a
    model folder and a samples file in it, an output folder and one of its model folders, a link or a
    hard link to either) is one member twice (an "ensemble" of one model, with JSD 0), and is refused."""
    readers = {}
    for selection in chosen:
        for path in selection.files.values():
            other = readers.setdefault(identity(path), selection)
            if other is not selection:
                raise EnsdiagError(f"{what}members {other.member.name} and {selection.member.name} are one member: both "
                                   f"read {path}; give each member once")


def _notes(section) -> list[str]:
    """What was read, as `analyze` prints it: the task, the members, the filter, how answers were scored."""
    members = section["members"]
    names = ", ".join(member["name"] for member in members[:4]) + (f" and {len(members) - 4} more" if len(members) > 4 else "")
    others = [name for name in section["filters"] if name != section["filter"]]
    also = f" (also logged: {', '.join(others)}; choose with --filter)" if others else ""
    subtasks = f", subtasks {', '.join(section['subtasks'])}" if len(section["subtasks"]) > 1 else ""
    generated = section.get("output_type") == "generate_until"
    scored = "each answer scored by lm-eval's exact_match" if generated else f"scores: {section['score_definition']}"
    lines = [f"lm-eval: task {section['task']} ({'generate_until, ' if generated else ''}{section['documents']} documents"
             f"{subtasks}), {counted(len(members), 'member')}: {names}; filter {section['filter']}{also}; {scored}"]
    if len(section.get("choices", ())) > 1:
        lines.append(f"questions have {', '.join(map(str, section['choices']))} choices: every question is padded to "
                     f"{section['choices'][-1]} with choices of probability 0 (docs/conventions.md)")
    if "ood_task" in section:
        lines.append(f"lm-eval: OOD questions from task {section['ood_task']} ({section['ood_documents']} documents)")
    return lines


def _split(chosen, options, warnings, split) -> tuple[dict, dict]:
    """{split (pooled), split/<subtask> for groups} and the section describing where it came from."""
    first, k = chosen[0], len(chosen)

    def make_reader(selection, subtask, path, wanted):
        config = files.task_config(selection.results, subtask)
        delimiter = config.get("target_delimiter", " ")  # lm-eval's default
        return Reader(path, wanted, options.score, delimiter if isinstance(delimiter, str) else " ",
                      labelled=split != "ood", rule=target_rule(config))

    read, order, filter_name = _read_members(chosen, options.filter, make_reader, partial(_budget, k))
    width = max(len(read[0, subtask].docs[doc_id].scores) for subtask, doc_id in order)
    check_analysis_size(k, len(order), width, f"{first.member.name}: {first.task}")
    logits = torch.empty((k, len(order), width), dtype=torch.float32)
    for member in range(k):  # one conversion per member: questions with fewer choices padded first
        docs = [read[member, subtask].docs[doc_id].scores for subtask, doc_id in order]
        logits[member] = torch.tensor([s if len(s) == width else s + [PAD_LOGIT] * (width - len(s)) for s in docs],
                                      dtype=torch.float64).reshape(len(order), width)
    labels = torch.tensor([read[0, subtask].docs[doc_id].gold for subtask, doc_id in order], dtype=torch.int64)
    custom = sorted({subtask for selection in chosen for subtask in selection.files
                     if target_rule(files.task_config(selection.results, subtask)).custom_metrics})
    if custom and split != "ood":
        warnings.append(f"{', '.join(custom[:4])}{' and more' if len(custom) > 4 else ''}: the task scores its lines with "
                        "its own process_results; its logged per-line metrics were not checked against the answers read")
    splits = {split: {"logits": logits, "labels": labels if split != "ood" else None}}
    if len(first.files) > 1:
        spans = {subtask: (start, stop) for subtask, start, stop in groups.positions(order)}  # (together in order)
        for subtask in first.files:
            start, stop = spans.get(subtask, (0, 0))
            splits[f"{split}/{subtask}"] = {"logits": logits[:, start:stop].clone(), "labels": labels[start:stop].clone()}
    choices = sorted({len(read[0, s].docs[d].scores) for s, d in order})
    section = {"task": first.task, "subtasks": list(first.files), "filter": filter_name,
               "filters": read[0, next(iter(first.files))].filters, "score": options.score,
               "score_definition": SCORE_TITLES[options.score], "choices": choices, "documents": len(order),
               "members": [_member(selection, filter_name) for selection in chosen]}
    # members whose scores are equal on every question: the same run copied, most likely
    same = next(((i, j) for i, j in combinations(range(k), 2) if torch.equal(logits[i], logits[j])), None)
    if same is not None:
        names = section["members"][same[0]]["name"], section["members"][same[1]]["name"]
        warnings.append(f"members {names[0]} and {names[1]} give the same scores on every question: the same "
                        "run copied? (an ensemble of one model has no diversity)")
    if split != "ood" and (tree := groups.group_tree(first.results, first.task)):
        section["groups"] = _group_section(chosen, tree, order, groups.choice_quantities(logits, labels),
                                           groups.CHOICE_DEFINITIONS, LOGGED[options.score], filter_name, warnings)
    return splits, section


def _read_members(chosen, filter_name, make_reader, budget) -> tuple[dict, list, str]:
    """({(member, subtask): reader}, [(subtask, doc_id)] in order, the filter read): every
    member's samples files of the task read for one filter (`--filter`, else the first file's
    first), and joined: the same documents, prompts and answers for every member."""
    first = chosen[0]
    for other in chosen[1:]:
        if other.task != first.task:
            raise EnsdiagError(f"{other.member.name} is a run of {other.task!r}, {first.member.name} of {first.task!r}: "
                               "every member must be scored on the same task")
        if set(other.files) != set(first.files):  # one group, other subtasks: name one that only one of them has
            extra = min(set(other.files) ^ set(first.files))
            has, lacks = (other, first) if extra in other.files else (first, other)
            raise EnsdiagError(f"group {first.task!r}: {has.member.name}'s run has subtask {extra!r}, "
                               f"{lacks.member.name}'s does not: every member must be scored on the same subtasks")
    files = [(index, subtask, path, selection) for index, selection in enumerate(chosen)
             for subtask, path in selection.files.items()]
    index, subtask, path, selection = files[0]
    reader = make_reader(selection, subtask, path, filter_name)
    read = {(index, subtask): reader.read(partial(budget, where=path))}
    filter_name = reader.filter  # the first file's first filter, for every other file
    rest = files[1:]
    tasks = [partial(make_reader(selection, subtask, path, filter_name).read, partial(budget, where=path))
             for index, subtask, path, selection in rest]
    processes = forked.workers(len(tasks), MAX_READERS) if sum(path.stat().st_size for *_, path, _ in rest) >= \
        PARALLEL_BYTES else 1
    for (index, subtask, *_), (ok, found) in zip(rest, forked.run(tasks, processes, stop=True)):
        if not ok:  # the first file in order that could not be read, as reading them in turn would have said
            raise found
        read[index, subtask] = found
    order = [(subtask, doc_id) for subtask in first.files for doc_id in sorted(read[0, subtask].docs)]
    _join(chosen, read, order)
    return read, order, filter_name


def _group_section(chosen, tree, order, per_question, definitions, metric_name, filter_name, warnings) -> dict:
    """The group's and its subgroups' numbers as lm-eval aggregates them (lm_eval_groups.py); a
    member whose aggregated score is not lm-eval's own group number is a warning."""
    weighting = groups.group_weighting(chosen, tree, metric_name, filter_name)
    found = groups.aggregates(per_question, groups.positions(order), tree, weighting, definitions)
    for group, entry in found["groups"].items():
        ours = entry["member_accuracy"]["value"]
        theirs = entry["lm_eval"]
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if b is not None and abs(a - b) > 1e-9]
        if differ:
            warnings.append(f"group {group}: member {chosen[differ[0]].member.name}'s aggregated {metric_name} "
                            f"{ours[differ[0]]:.6f} is not lm-eval's {theirs[differ[0]]:.6f}")
    return {"metric": f"{metric_name},{filter_name}", **found}


PARALLEL_BYTES = 32 * 2**20  # below this, forking the readers costs more than it saves
MAX_READERS = 8
HELD_PER_DOCUMENT = 1024  # bytes reading holds per document and member besides its scores (measured: about 610)


def _budget(k, n, c, where):
    if n & (n - 1) == 0:  # at every power of two: what is held never exceeds what was checked
        check_analysis_size(k, 2 * n, max(c, 2), f"{where} ({n:,} documents read)")
        require(k * 2 * n * (HELD_PER_DOCUMENT + 8 * max(c, 2)), f"{where}: reading {n:,} documents of {k} members")


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
            if doc is not None and doc.joined() == ref.joined():
                continue  # the common case, compared at once; a difference is named below
            where = f"{selection.files[subtask]}"
            if doc is None:
                raise EnsdiagError(f"{where}: doc_id {doc_id} of {subtask!r} ({first}, line {ref.line}) is missing "
                                   "(a different --limit?)")
            for (what, mine), (_, theirs) in zip(doc.joined(), ref.joined()):
                if mine != theirs:
                    raise EnsdiagError(f"{where}, line {doc.line}: doc_id {doc_id} of {subtask!r} differs from {first}'s "
                                       f"(line {ref.line}) in its {what}: another document, prompt or task version")


def _member(selection, filter_name, metric_name="acc") -> dict:
    args = files.model_args(selection.results)
    entry = {"name": selection.member.name, "samples": [str(path) for path in selection.files.values()],
             "results": None if selection.results_path is None else str(selection.results_path)}
    entry.update({key: str(args[key]) for key in ("pretrained", "peft", "delta") if key in args})
    acc = files.logged_metric(selection.results, selection.task, metric_name, filter_name)
    if acc is not None:
        entry[f"lm_eval_{metric_name}"] = acc
    return entry


def _titles(splits, section) -> dict:
    about = f"lm-eval, filter {section['filter']}, {section['score_definition']}"
    titles = {name: f"{section['task']} ({about})" for name in splits if name == "id"}
    titles.update({name: f"{name.split('/', 1)[1]} ({about})" for name in splits if name.startswith("id/")})
    if "ood" in splits:
        titles["ood"] = f"{section['ood_task']} ({about})"
    return titles
