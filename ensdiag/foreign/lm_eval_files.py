"""Where lm-evaluation-harness put its logs, and which of them make one member (torch-free).

`lm_eval … --output_path OUT --log_samples` (0.4.13, lm_eval/loggers/evaluation_tracker.py)
writes into `OUT/<model>/`, `<model>` being the `peft=` (else `pretrained=`) path with `/` and
other unsafe characters replaced by `__`:

    results_<date>.json               model_args, per-task metrics, each task's config, group_subtasks
    samples_<task>_<date>.jsonl       one line per document and filter (read by lm_eval.py)

with one `<date>` per run; a group task writes one samples file per subtask. A path given to
ensdiag is one member: a samples file, a model folder (`OUT/<model>/`), or an output folder
`OUT/` whose model folders are the members, one each (k runs with one `--output_path`). A model
folder may hold runs of several tasks (`--task` picks one) but only one run of the task picked.
"""

import json
import os
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path, PurePosixPath

from ..errors import EnsdiagError
from ..io import regular_file
from ..runs import METHOD_NAME

SAMPLES = re.compile(r"^samples_(?P<task>.+)_(?P<date>[^_]+)\.jsonl$")  # lm-eval splits the date at the last "_"
RESULTS = re.compile(r"^results_(?P<date>[^_]+)\.json$")
TASK_NAME = re.compile(r"^[\w.+-]{1,128}$")
MAX_ENTRIES = 100_000  # files looked at in one folder
MAX_RESULTS_BYTES = 64 * 2**20  # MMLU's results, with 57 task configs, are about 1 MiB
MAX_GROUP_DEPTH = 8
MAX_MEMBERS = 4096  # as foreign/predictions.py: the k×k matrices of every pair stay small


@dataclass
class Member:
    """One member's logs: {task: {date: samples file}} and {date: results file}."""

    name: str
    folder: Path
    samples: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    given_file: Path | None = None  # a samples file named on the command line


def members_of(path: Path) -> list[Member]:
    """The members a path stands for (one, or one per model folder of an output folder)."""
    path = Path(path)
    if path.is_file():
        match = SAMPLES.match(path.name)
        if not match:
            return [Member(str(path), path.parent, {path.stem: {"": path}}, {}, path)]
        member = _scan(path.parent, str(path))
        member.samples = {match["task"]: {match["date"]: path}}
        member.given_file = path
        return [member]
    member = _scan(path, str(path))
    if member.samples:
        return [member]
    folders = [entry for entry in _entries(path) if entry.is_dir()]
    if len(folders) > MAX_MEMBERS:
        raise EnsdiagError(f"{path} holds {len(folders):,} folders: more model folders than ensdiag takes members "
                           f"({MAX_MEMBERS:,})")
    folders = [folder for folder in folders if any(SAMPLES.match(p.name) for p in _entries(folder))]
    if not folders:
        raise EnsdiagError(f"{path} holds no lm-eval sample files (samples_<task>_<date>.jsonl, written by "
                           "`lm_eval … --output_path DIR --log_samples`), neither in it nor in its model folders")
    return [_scan(folder, str(folder)) for folder in sorted(folders)]


def _entries(folder: Path) -> list[Path]:
    try:
        entries = list(islice(folder.iterdir(), MAX_ENTRIES + 1))
    except OSError as error:
        raise EnsdiagError(f"{folder} cannot be listed ({error.strerror or type(error).__name__})") from None
    if len(entries) > MAX_ENTRIES:
        raise EnsdiagError(f"{folder} holds more than {MAX_ENTRIES:,} entries: not an lm-eval output folder")
    return entries


def _scan(folder: Path, name: str) -> Member:
    """The logs in one model folder; an entry named like one that is no regular file (a FIFO, a device, a
    folder, a broken link) is refused by name rather than passed over, which left a folder of no task."""
    member = Member(name, folder)
    for entry in _entries(folder):
        if match := SAMPLES.match(entry.name):
            member.samples.setdefault(match["task"], {})[match["date"]] = regular_file(entry, "lm-eval sample file")
        elif match := RESULTS.match(entry.name):
            member.results[match["date"]] = regular_file(entry, "lm-eval results file")
    return member


def read_results(path: Path | None) -> dict:
    """A results_<date>.json as a dict ({} without one), bounded and checked like user input."""
    if path is None:
        return {}
    size = path.stat().st_size
    if size > MAX_RESULTS_BYTES:
        raise EnsdiagError(f"{path} is {size:,} bytes; an lm-eval results file is far smaller (at most "
                           f"{MAX_RESULTS_BYTES:,} read)")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"), parse_constant=lambda name: None)
    except (ValueError, RecursionError, OSError) as error:
        raise EnsdiagError(f"{path} is not readable JSON ({type(error).__name__}): not lm-eval's results file") from None
    if not isinstance(data, dict):
        raise EnsdiagError(f"{path} is not lm-eval's results file (a JSON object with results and configs)")
    return data


def group_subtasks(results: dict, task: str, depth: int = 0) -> list[str] | None:
    """The (leaf) subtasks of a group, from results' `group_subtasks`; None if `task` is no group."""
    groups = results.get("group_subtasks")
    if not isinstance(groups, dict) or not isinstance(groups.get(task), list) or not groups[task]:
        return None
    if depth > MAX_GROUP_DEPTH:
        raise EnsdiagError(f"group {task!r} nests groups more than {MAX_GROUP_DEPTH} deep")
    leaves = []
    for sub in groups[task]:
        if not isinstance(sub, str):
            raise EnsdiagError(f"the group_subtasks of {task!r} name {type(sub).__name__}s, not tasks")
        leaves += group_subtasks(results, sub, depth + 1) or [sub]
    return leaves


@dataclass
class Selection:
    """What one member contributes to a split: its task, the samples file of each (sub)task, its
    results file and what that says."""

    member: Member
    task: str
    files: dict  # subtask -> samples file
    results_path: Path | None
    results: dict


def select(member: Member, task: str | None, option: str) -> Selection:
    """The member's run of `task` (a task or a group), or of the one task its logs hold."""
    if member.given_file is not None:
        (found,) = member.samples
        if task is not None and task != found:
            raise EnsdiagError(f"{member.name} is a samples file of task {found!r}, not {task!r} ({option})")
        date = next(iter(member.samples[found]))
        results_path = member.results.get(date)
        return Selection(member, found, {found: member.given_file}, results_path, read_results(results_path))
    every_results = {date: read_results(path) for date, path in sorted(member.results.items())}
    if task is None:
        task = _only_task(member, every_results, option)
    subtasks = [task] if task in member.samples else None
    for results in every_results.values():
        subtasks = subtasks or group_subtasks(results, task)
    if subtasks is None:
        raise EnsdiagError(f"{member.name} has no samples of task {task!r} (it holds {_listed(member.samples)}; "
                           f"{option} names a task or a group)")
    missing = [sub for sub in subtasks if sub not in member.samples]
    if missing:
        raise EnsdiagError(f"{member.name}: group {task!r} has no samples of its subtask {missing[0]!r}")
    dates = {date for sub in subtasks for date in member.samples[sub]}
    if len(dates) > 1:
        raise EnsdiagError(f"{member.name} holds {len(dates)} runs of {task!r} ({', '.join(sorted(dates)[:4])}): "
                           "pass the samples file of the run you mean, or keep one run per model folder")
    (date,) = dates
    return Selection(member, task, {sub: member.samples[sub][date] for sub in subtasks}, member.results.get(date),
                     every_results.get(date, {}))


def _only_task(member: Member, every_results: dict, option: str) -> str:
    if len(member.samples) == 1:
        return next(iter(member.samples))
    groups = set()
    for results in every_results.values():  # every samples file of one group
        named = results.get("group_subtasks") if isinstance(results.get("group_subtasks"), dict) else {}
        for group in named:
            if isinstance(group, str) and group_subtasks(results, group):
                if set(group_subtasks(results, group)) == set(member.samples):
                    return group
                groups.add(group)
    also = f"; groups {_listed(groups)}" if groups else ""
    raise EnsdiagError(f"{member.name} holds several tasks ({_listed(member.samples)}{also}): choose one with {option} NAME")


def _listed(tasks) -> str:
    names = sorted(tasks)
    return ", ".join(repr(name) for name in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def check_task_name(name: str, what: str):
    if not TASK_NAME.match(name):
        raise EnsdiagError(f"{what}: task name {name[:40]!r} must be 1-128 letters, digits, '_', '.', '+' or '-'")


def model_args(results: dict) -> dict:
    """lm-eval's `config.model_args` as a dict (the command line writes a string `k=v,k=v`, the
    Python API a string or a dict); {} when absent or not of either kind."""
    args = results.get("config", {}).get("model_args") if isinstance(results.get("config"), dict) else None
    if isinstance(args, dict):
        return {str(key): value for key, value in args.items() if isinstance(value, (str, int, float, bool))}
    if isinstance(args, str):
        return dict(part.split("=", 1) for part in args.split(",") if "=" in part)
    return {}


def task_config(results: dict, task: str) -> dict:
    configs = results.get("configs")
    config = configs.get(task) if isinstance(configs, dict) else None
    return config if isinstance(config, dict) else {}


def logged_metric(results: dict, task: str, metric: str, filter_name: str):
    """lm-eval's own aggregate of `metric` for the task and filter (e.g. "acc,none"), or None."""
    entry = results.get("results", {}).get(task) if isinstance(results.get("results"), dict) else None
    value = entry.get(f"{metric},{filter_name}") if isinstance(entry, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


SEED_PART = re.compile(r"^(?P<method>.*?)[-_.]?seed[-_]?(?P<seed>[0-9]{1,9})$", re.IGNORECASE | re.ASCII)


def run_name(section: dict) -> tuple[str, int] | None:
    """(method, seed) of a run saved without --method: the folder that holds every member's model
    (the `peft=` path, else `pretrained=`, from results_*.json), its `seed-N` part (or a trailing
    `-seedN`) the seed, else seed 0; None when the members' paths name no common folder."""
    paths = [member.get("peft") or member.get("pretrained") for member in section.get("members", [])]
    if not paths or not all(isinstance(path, str) and path for path in paths):
        return None
    common = list(os.path.commonprefix([PurePosixPath(path.replace("\\", "/")).parts[:-1] for path in paths]))
    seed = 0
    while common:
        match = SEED_PART.match(common[-1])
        if match and not match["method"]:
            seed = int(match["seed"])
            common.pop()
            continue
        method = common[-1]
        if match:
            method, seed = match["method"], int(match["seed"])
        return (method, seed) if METHOD_NAME.match(method) and seed < 2**31 else None
    return None
