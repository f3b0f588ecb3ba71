"""Example-level intervals for every analyzer's headline numbers: the inspection core's pass.

    add_intervals(metrics, predictions, weights)   # after the analyzers ran (core.py)
    metrics["analyzers"]["calibration"]["splits"]["id"]["ece"]["interval"]
    # {"low": 0.024, "high": 0.039, "level": 0.95, "n": 10000, "method": "bootstrap over the examples, …"}

Which numbers: every declared report `Column` whose `example_splits()` names splits (the
default for the columns of the per-split tables and of a named split: plug-ins and new
analyzers get intervals without a line of their own). How: the analyzer's registered
resampler where it has one (vectorised, `analysis/resampled.py`), otherwise the analyzer
itself re-run on each resample of the splits the column reads (the other splits held as
measured), as many resamples as `allowance` seconds permit, at least `MIN_RESAMPLES`, or a
note saying why there is no interval. The draws and the constructions are `bootstrap.py`'s.
"""

import time

import torch

from . import bootstrap as B
from .analysis.registry import SPLIT_TABLES, all_analyzers
from .export import lookup

GENERIC_SECONDS = 30.0  # what re-running one analyzer over its resamples may take, without a budget
MIN_GENERIC = 100  # re-runs below which a generic interval is not given (its 2.5th percentile would rest on 2 draws)
DEFINITION = {"level": B.LEVEL, "resamples": B.RESAMPLES,
              "draws": "test examples resampled with replacement, ID and OOD separately; each split's draws come "
                       "from a generator seeded by its family and size, so analyzers, members and methods measured "
                       "on the same examples share them (paired)",
              "population": "low and high bound what the model would score on new examples like these; "
                            "full_split (where a budget measured a subsample) what the whole split would give",
              "methods": B.METHODS}


def targets(analyzer, result: dict, predictions: dict) -> list[tuple[tuple, tuple]]:
    """[(key path to the metric's value, splits it is a statistic of)] of the analyzer's declared
    example-level columns (and their peer values) that its result holds."""
    found = {}
    for column in analyzer.columns:
        paths = [path for path in (column.path, column.peer) if path is not None]
        splits = ([split for split in SPLIT_TABLES if split in column.tables] or list(SPLIT_TABLES)
                  if "{split}" in "".join(column.path) else [None])  # as export.headline_entries names them
        for split in splits:
            reads = column.example_splits(split)
            if not reads or any(name not in predictions or predictions[name]["logits"].shape[1] == 0 for name in reads):
                continue
            for path in paths:
                key = tuple(part.replace("{split}", split or "") for part in path)
                parent = lookup(result, key[:-1])[0]
                if key[-1] == "value" and isinstance(parent, dict) and parent.get("value") is not None:
                    found[key] = reads  # a number that is not there (JSD of one member) needs no interval
    return list(found.items())


def add_intervals(metrics: dict, predictions: dict, weights=None, *, resamples: int = B.RESAMPLES,
                  allowance: float = GENERIC_SECONDS, full: dict | None = None, only=None) -> dict:
    """Write an "interval" entry into each example-level metric of the predictions analyzers'
    results in `metrics`; returns {analyzer: note} for those without intervals. `full`: {split:
    its size} where the predictions are a subsample of a split (a budget), for `full_split`."""
    from .analysis.registry import without_ood_labels
    predictions = without_ood_labels(predictions)
    analyzers, notes = all_analyzers(), {}
    for name, result in metrics["analyzers"].items():
        analyzer = analyzers.get(name)
        if analyzer is None or analyzer.needs != "predictions" or result.get("status") != "ok" \
                or (only is not None and name not in only):
            continue
        wanted = targets(analyzer, result, predictions)
        if not wanted:
            continue
        found = _vectorised(analyzer, result, predictions, weights, wanted, resamples) if analyzer.resampler else {}
        rest = [(path, reads) for path, reads in wanted if path not in found]
        if rest:
            generic, note = _generic(analyzer, predictions, weights, rest, resamples, allowance)
            found.update(generic)
            if note:
                notes[name] = note
        for path, reads in wanted:
            entry = _entry(result, path, reads, predictions, found.get(path), full or {})
            if entry is not None:
                _metric(result, path)["interval"] = entry
            elif name in notes:
                _metric(result, path)["interval"] = {"low": None, "high": None, "level": B.LEVEL,
                                                     "n": _size(reads, predictions), "note": notes[name]}
    # no timings here: the same predictions give the same metrics.json (a budget records its seconds)
    metrics["intervals"] = {**DEFINITION, "resamples": resamples, **({"skipped": notes} if notes else {})}
    return notes


def _metric(result, path):
    node = result
    for key in path[:-1]:
        node = node[key]
    return node


def _size(reads, predictions) -> int:
    return sum(predictions[split]["logits"].shape[1] for split in reads)


def _entry(result, path, reads, predictions, resampled, full) -> dict | None:
    if resampled is None:
        return None
    estimate, values = resampled
    sizes = {split: predictions[split]["logits"].shape[1] for split in reads}
    strata = sizes if len(reads) > 1 else None
    of = None
    if any(split in full for split in reads):  # a subsample: the full split's size (every stratum alike)
        of = sum(full.get(split, size) for split, size in sizes.items())
    if isinstance(values, B.Folded):
        return B.interval(estimate, values, sum(sizes.values()), "ray", of=of, strata=strata)
    value = _metric(result, path).get("value")
    return B.interval(value if isinstance(value, (int, float)) else None, values, sum(sizes.values()), "percentile",
                      of=of, strata=strata)


class _Streams:
    """One draw stream per split (rows in order from `bootstrap.draws`' generator)."""

    def __init__(self, predictions, splits, resamples):
        self.sizes = {split: predictions[split]["logits"].shape[1] for split in splits}
        self.generators = {split: torch.Generator().manual_seed(B.seed_of(split, n)) for split, n in self.sizes.items()}
        self.resamples = resamples

    def next(self, rows: int) -> dict:
        return {split: torch.randint(0, n, (rows, n), generator=self.generators[split]) for split, n in self.sizes.items()}


def _resamples(predictions, splits, wanted: int) -> tuple[int, int]:
    """(resamples, block) for a statistic of these splits: every stratum resampled as often."""
    sizes = [predictions[split]["logits"].shape[1] for split in splits]
    return min(B.resamples_for(n, wanted) for n in sizes), min(B.block_size(n) for n in sizes)


def _vectorised(analyzer, result, predictions, weights, wanted, resamples) -> dict:
    """{path: (estimate, Tensor [R] | Folded)} from the analyzer's resampler."""
    splits = sorted({split for _, reads in wanted for split in reads})
    count, block = _resamples(predictions, splits, resamples)
    resample = analyzer.resampler(predictions, weights, result, {path for path, _ in wanted})
    ones = resample({split: torch.ones(1, predictions[split]["logits"].shape[1], dtype=torch.float64) for split in splits})
    streams, parts = _Streams(predictions, splits, count), {}
    for start in range(0, count, block):
        rows = streams.next(min(block, count - start))
        for path, values in resample({split: B.counts_of(r, streams.sizes[split]) for split, r in rows.items()}).items():
            parts.setdefault(path, []).append(values)
    found = {}
    for path, reads in wanted:
        if path not in parts:
            continue
        pieces = parts[path]
        if isinstance(pieces[0], B.Folded):
            estimate = ones[path]
            folded = B.Folded(estimate.means[0], estimate.mass[0], estimate.combine)
            found[path] = (folded, B.Folded(torch.cat([p.means for p in pieces]), torch.cat([p.mass for p in pieces]),
                                            pieces[0].combine))
        else:
            found[path] = (None, torch.cat(pieces))
    return found


def _generic(analyzer, predictions, weights, wanted, resamples, allowance) -> tuple[dict, str | None]:
    """({path: (None, Tensor [R])}, note): the analyzer re-run on resampled predictions."""
    from .analysis.registry import Skip
    splits = sorted({split for _, reads in wanted for split in reads})
    count, _ = _resamples(predictions, splits, resamples)
    streams = _Streams(predictions, splits, count)
    values = {path: [] for path, _ in wanted}
    began = time.perf_counter()
    for done in range(count):
        rows = {split: r[0] for split, r in streams.next(1).items()}
        resampled = {**predictions, **{split: {"logits": predictions[split]["logits"][:, index],
                                               "labels": None if predictions[split]["labels"] is None
                                               else predictions[split]["labels"][index]}
                                       for split, index in rows.items()}}
        try:
            result = analyzer(resampled, weights)
        except (Skip, ArithmeticError, ValueError, RuntimeError):
            result = {}
        for path, _ in wanted:
            value = lookup(result, path)[0]
            values[path].append(value if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan"))
        spent = time.perf_counter() - began
        if done == 0 and spent * MIN_GENERIC > allowance:
            return {}, (f"no interval: one re-run of {analyzer.name} on resampled examples took {spent:.2g} s, and "
                        f"{MIN_GENERIC} would pass the {allowance:.0f} s allowed")
        if spent * (done + 2) / (done + 1) > allowance and done + 1 >= MIN_GENERIC:
            break  # as many resamples as the allowance permits
    return {path: (None, torch.tensor(found, dtype=torch.float64)) for path, found in values.items()}, None


__all__ = ["DEFINITION", "add_intervals", "targets"]
