"""Several run folders as one report (`ensdiag report A B …`), each read by load.py's checked readers.

    data = load_folders(["runs/monday", "runs/tuesday"])   # load_runs' layout, merged

Methods and seeds are merged: a method found in several folders with different seeds is one
method with all those seeds (more seeds of the same thing). A method with the same seed in
two folders is two different runs: that method is then kept apart by folder, as
`<method>@<folder>` (labelled "Deep Ensemble (tuesday)"), in every folder that has it, so two
dates or projects of the same grid stand side by side. Methods of one folder only keep their
names. The verdict compares each method with the single model and the Deep Ensemble: when those
two are kept apart by folder, it is computed within each folder (`data["groups"]`).

Only like is pooled with like: folders measured on different data or under different protocols
(preset, dataset, the test, shift and OOD sets, the training settings) never share a row. Every
method is then kept apart by folder, the verdict is computed within each folder, and the report
says why (`experiment["notes"]`); split titles that differ are shown joined, each with its folder.
"""

import json
from pathlib import Path

from ..errors import EnsdiagError
from .load import load_runs


def folder_tags(folders: list[Path]) -> list[str]:
    """A short distinct name per folder: its own name, or as many trailing parts as tell them apart."""
    parts = [folder.resolve().parts for folder in folders]
    for depth in range(1, max(len(p) for p in parts) + 1):
        tags = ["/".join(p[-depth:]) for p in parts]
        if len(set(tags)) == len(tags):
            return tags
    raise EnsdiagError(f"{folders[0]} is named twice: give each run folder once")


def load_folders(run_dirs) -> dict:
    """load_runs of one folder, or the merge of several (see the module's docstring): {"experiment",
    "runs", "groups": [{merged name: name in its folder}, …] (one per folder, several folders only)}."""
    folders = [Path(folder) for folder in run_dirs]
    if len(folders) == 1:
        return load_runs(folders[0])
    tags = folder_tags(folders)
    loaded = [load_runs(folder) for folder in folders]
    holders = {}  # method -> seed -> folders with a finished run of it
    for index, data in enumerate(loaded):
        for method, seeds in data["runs"].items():
            for seed, run in seeds.items():
                holders.setdefault(method, {}).setdefault(seed, []).extend([index] if run is not None else [])
    apart = {method for method, seeds in holders.items() if any(len(found) > 1 for found in seeds.values())}
    kinds = [_kind(data["experiment"]) for data in loaded]
    notes = []
    if len(set(kinds)) > 1:  # other data or another protocol: side by side, never averaged
        apart = set(holders)
        notes.append("These folders were measured on different data or under different protocols ("
                     + "; ".join(f"{tag}: {_describe(kind)}" for tag, kind in zip(tags, kinds))
                     + "): each method is kept apart by folder, never averaged across them, and the verdict is "
                       "formed within each folder.")
    runs, groups = {}, [{} for _ in folders]
    for index, data in enumerate(loaded):
        for method, seeds in data["runs"].items():
            name = f"{method}@{tags[index]}" if method in apart else method
            groups[index][name] = method
            merged = runs.setdefault(name, {})
            for seed, run in seeds.items():
                if run is not None or seed not in merged:  # a finished run wins over an unfinished one elsewhere
                    merged[seed] = run
    experiments = [data["experiment"] for data in loaded]
    presets = list(dict.fromkeys(experiment["config"]["preset"] for experiment in experiments))
    seeds = list(dict.fromkeys(seed for method in runs.values() for seed in method))
    config = {"preset": " + ".join(presets), "methods": list(runs), "seeds": seeds}
    return {"experiment": {"config": config, "splits": _titles(experiments, tags), "skipped": _skipped(experiments),
                           "notes": notes},
            "runs": runs, "groups": groups if apart & {"single", "deep-ensemble"} or notes else None}


PROTOCOL_FREE = ("methods", "seeds", "method_options", "device", "download", "quiet", "track_diversity", "data_dir")


def _kind(experiment: dict) -> str:
    """What a folder's numbers are measurements of: its preset and dataset, its test, shift and OOD
    sets, and the training settings (not which methods or seeds ran), as one comparable string."""
    config = experiment.get("config", {}) if isinstance(experiment.get("config"), dict) else {}
    protocol = {key: value for key, value in config.items() if key not in PROTOCOL_FREE}
    splits = experiment.get("splits", {}) if isinstance(experiment.get("splits"), dict) else {}
    return json.dumps({"protocol": protocol, "data": {split: splits.get(split) for split in ("id", "shift", "ood")}},
                      sort_keys=True, default=str)


def _describe(kind: str) -> str:
    found = json.loads(kind)
    protocol, data = found["protocol"], found["data"]
    return ", ".join([f"preset {protocol.get('preset')}", *(f"{split} {title}" for split, title in data.items() if title)])


def _titles(experiments, tags) -> dict:
    titles = {}
    for split in dict.fromkeys(split for experiment in experiments for split in experiment.get("splits", {})):
        found = {tag: experiment["splits"][split] for experiment, tag in zip(experiments, tags)
                 if split in experiment.get("splits", {})}
        distinct = set(found.values())
        titles[split] = next(iter(distinct)) if len(distinct) == 1 else \
            " | ".join(f"{title} ({tag})" for tag, title in found.items())
    return titles


def _skipped(experiments) -> dict:
    """The splits every folder skipped (a split one folder has is reported)."""
    first = experiments[0].get("skipped", {})
    return {split: reason for split, reason in first.items()
            if all(split in experiment.get("skipped", {}) for experiment in experiments)}
