"""Example-level intervals for every analyzer's headline numbers: the inspection core's pass.

    add_intervals(metrics, predictions, weights)   # after the analyzers ran (inspection.py)
    metrics["analyzers"]["calibration"]["splits"]["id"]["ece"]["interval"]
    # {"low": 0.024, "high": 0.039, "level": 0.95, "n": 10000, "method": "bootstrap over the examples, …"}

Which numbers: every declared report `Column` whose `example_splits()` names splits (the
default for the columns of the per-split tables and of a named split: plug-ins and new
analyzers get intervals without a line of their own). How: the analyzer's registered
resampler where it has one (vectorised, `stats/resampled.py`), otherwise the analyzer
itself re-run on each resample of the splits the column reads (the other splits held as
measured), as many resamples as `allowance` seconds permit, at least `MIN_RESAMPLES`, or a
note saying why there is no interval. The draws are `bootstrap.py`'s, the constructions `constructions.py`'s.
"""

import time

import torch

from ..analysis.registry import all_analyzers, without_ood_labels
from ..budget import over_budget
from ..errors import Skip
from ..layout import SPLIT_TABLES, lookup
from ..stats import bootstrap as B
from ..stats import constructions as CI
from ..stats.resampled import Refused

WORDS = "a 95 % confidence interval for the value on the population the test examples were drawn from"
GENERIC_SECONDS = 30.0  # what re-running one analyzer over its resamples may take, without a budget
MIN_GENERIC = 100  # re-runs below which a generic interval is not given (its 2.5th percentile would rest on 2 draws)
DEFINITION = {"level": CI.LEVEL, "resamples": B.RESAMPLES,
              "draws": "test examples resampled with replacement, ID and OOD separately; each split's draws come "
                       "from a generator seeded by its family and size, so analyzers, members and methods measured "
                       "on the same examples share them (paired)",
              "population": f"low and high: {WORDS} (not a prediction of another test set's value, which varies "
                            "more); full_split (where a budget measured a subsample): the same for the whole split; "
                            "[0, …] on an unsigned calibration error: the data are consistent with no error, and the "
                            "signed error (over-confidence) says in which direction the model may be miscalibrated",
              "methods": CI.METHODS}


def targets(analyzer, result: dict, predictions: dict, detail: bool = False) -> list[tuple[tuple, tuple]]:
    """[(key path to the metric's value, splits it is a statistic of)] of the analyzer's declared
    example-level columns that its result holds: the headline columns (`Column.headline`), and with
    `detail` every other column and the peer conventions' values too."""
    found = {}
    for column in analyzer.columns:
        if not (detail or column.headline):
            continue
        paths = [path for path in (column.path, column.peer if detail else None) if path is not None]
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
                  allowance: float = GENERIC_SECONDS, full: dict | None = None, only=None, detail: bool = False,
                  draws: B.Draws | None = None) -> dict:
    """Write an "interval" entry into each headline example-level metric of the predictions
    analyzers' results in `metrics` (`detail`: into every declared one); returns {analyzer: note}
    for those without intervals. `full`: {split: its size} where the predictions are a subsample
    of a split (a budget), for `full_split`. `draws`: the shared counts, where the caller keeps them."""
    predictions = without_ood_labels(predictions)
    analyzers, notes, draws = all_analyzers(), {}, draws or B.Draws()
    for name, result in metrics["analyzers"].items():
        analyzer = analyzers.get(name)
        if analyzer is None or analyzer.needs != "predictions" or result.get("status") != "ok" \
                or (only is not None and name not in only):
            continue
        wanted = targets(analyzer, result, predictions, detail)
        if not wanted:
            continue
        found, note = column_resamples(analyzer, result, predictions, weights, wanted, draws, resamples=resamples,
                                       allowance=allowance, full=full)
        if note:
            notes[name] = note
        for path, (entry, _) in found.items():
            lookup(result, path[:-1])[0]["interval"] = entry
    # no timings here: the same predictions give the same metrics.json (a budget records its seconds)
    metrics["intervals"] = interval_summary(resamples, detail, notes)
    return notes


def interval_summary(resamples: int, detail: bool, notes: dict) -> dict:
    """metrics.json's "intervals": how they were made, and {analyzer: note} of those without."""
    return {**DEFINITION, "resamples": resamples, "columns": "every declared column" if detail else
            "the headline tables' columns (per-split tables, diversity, gain); --detail for the rest",
            **({"skipped": notes} if notes else {})}


def column_resamples(analyzer, result: dict, predictions: dict, weights, wanted, draws: B.Draws, *,
                     resamples: int = B.RESAMPLES, allowance: float = GENERIC_SECONDS, full: dict | None = None):
    """({path: (its interval entry, (estimate, resamples) or None)}, note or None) for the wanted
    [(path, splits read)] of one analyzer's result: its resampler on the shared draws where it has one,
    else the analyzer re-run on resamples (the note says why there is no interval where that is too
    slow). What `add_intervals` writes, and what the coverage suite (benchmarks/interval_coverage.py) checks."""
    found = _vectorised(analyzer, result, predictions, weights, wanted, resamples, draws) if analyzer.resampler else {}
    rest = [(path, reads) for path, reads in wanted if path not in found]
    generic, note = _generic(analyzer, predictions, weights, rest, resamples, allowance) if rest else ({}, None)
    found.update(generic)
    entries = {}
    for path, reads in wanted:
        refused = found[path] if isinstance(found.get(path), str) else None  # memory, or no construction covers
        kind = next((column.interval for column in analyzer.columns if column.reads(path)), "percentile")
        entry = None if refused else _entry(result, path, reads, predictions, found.get(path), full or {}, kind)
        if entry is not None:
            entries[path] = (entry, found[path])
        elif refused or note:  # the reason instead
            n = sum(predictions[split]["logits"].shape[1] for split in reads)
            entries[path] = ({"low": None, "high": None, "level": CI.LEVEL, "n": n, "note": refused or note}, None)
    return entries, note


def _entry(result, path, reads, predictions, resampled, full, kind: str = "percentile") -> dict | None:
    if resampled is None:
        return None
    estimate, values = resampled
    sizes = {split: predictions[split]["logits"].shape[1] for split in reads}
    strata = sizes if len(reads) > 1 else None
    of = None
    if any(split in full for split in reads):  # a subsample: the full split's size (every stratum alike)
        of = sum(full.get(split, size) for split, size in sizes.items())
    kind, _, of_split = kind.partition(":")  # "binomial:ood": a fraction of the ood split's examples
    if of_split and of_split not in sizes:
        raise ValueError(f"the interval {kind}:{of_split} of {'/'.join(path)} names a split it does not read {reads}")
    if isinstance(values, CI.Folded):
        entry = CI.interval(estimate, values, sum(sizes.values()), "upper" if kind == "upper" else "ray", of=of,
                           strata=strata)
    else:
        value = lookup(result, path[:-1])[0].get("value")
        entry = CI.interval(value if isinstance(value, (int, float)) else None, values, sum(sizes.values()), kind,
                           of=of, strata=strata, trials=sizes.get(of_split))
    clustered = {split: clusters for split in reads if (clusters := getattr(predictions[split], "clusters", None))}
    if clustered:
        entry["method"] += "; " + ", ".join(f"{split}: {count:,} inputs resampled, each with all its "
                                            f"{sizes[split] // count} versions" for split, count in clustered.items())
    return entry


def _indices(split, name: str, count: int):
    """Each of `count` resamples' example indices, in order from the split's draws (`bootstrap.blocks`);
    where the examples are blocks of the same inputs (Examples.clusters), each input with all its blocks."""
    n = split["logits"].shape[1]
    inputs = getattr(split, "clusters", None) or n
    blocks = torch.arange(n // inputs).repeat_interleave(inputs) * inputs
    for _, drawn in B.blocks(name, inputs, count):
        for row in drawn:
            yield row.repeat(n // inputs) + blocks


def _resamples(predictions, wanted: list, resamples: int) -> tuple[list, int, int]:
    """(the splits the wanted paths read, resamples, block): every stratum resampled as often."""
    splits = sorted({split for _, reads in wanted for split in reads})
    sizes = [predictions[split]["logits"].shape[1] for split in splits]
    return splits, min(B.resamples_for(n, resamples) for n in sizes), min(B.block_size(n) for n in sizes)


def _vectorised(analyzer, result, predictions, weights, wanted, resamples, draws: B.Draws) -> dict:
    """{path: (estimate, Tensor [R] | Folded)} from the analyzer's resampler, on the shared draws; a
    note (str) for a path whose resamples would pass the memory budget."""
    splits, count, block = _resamples(predictions, wanted, resamples)
    resample = analyzer.resampler(predictions, weights, result, {path for path, _ in wanted})
    sizes, parts = {split: predictions[split]["logits"].shape[1] for split in splits}, {}
    for start in range(0, count, block):
        stop = min(start + block, count)
        counts = {split: draws.counts(split, n, start, stop, getattr(predictions[split], "clusters", None))
                  for split, n in sizes.items()}
        for path, values in resample(counts).items():
            parts.setdefault(path, []).append(values)
    found, refused = {}, {}
    for path, pieces in parts.items():  # a number refused (memory, or no construction covers): no interval, why
        reason = next((piece.reason for piece in pieces if isinstance(piece, Refused)), None)
        if reason is None and isinstance(pieces[0], CI.Folded):
            reason = over_budget(2 * 8 * count * pieces[0].means.shape[-1], f"{count:,} resamples of {path[-2]}")
        if reason is not None:
            refused[path] = f"no interval: {reason}"
    folded_paths = {path for path, pieces in parts.items() if isinstance(pieces[0], CI.Folded) and path not in refused}
    ones = {split: torch.ones(1, predictions[split]["logits"].shape[1], dtype=torch.float64) for split in splits}
    estimates = analyzer.resampler(predictions, weights, result, folded_paths)(ones) if folded_paths else {}
    for path, reads in wanted:
        if path in refused:
            found[path] = refused[path]
            continue
        if path not in parts or any(piece is None for piece in parts[path]):
            continue
        pieces = parts[path]
        if isinstance(pieces[0], CI.Folded):
            estimate = estimates[path]
            folded = CI.Folded(estimate.means[0], estimate.mass[0], estimate.combine)
            found[path] = (folded, CI.Folded(torch.cat([p.means for p in pieces]), torch.cat([p.mass for p in pieces]),
                                            pieces[0].combine))
        else:
            found[path] = (None, torch.cat(pieces))
    return found


def _generic(analyzer, predictions, weights, wanted, resamples, allowance) -> tuple[dict, str | None]:
    """({path: (None, Tensor [R])}, note): the analyzer re-run on resampled predictions."""
    splits, count, _ = _resamples(predictions, wanted, resamples)
    streams = {split: _indices(predictions[split], split, count) for split in splits}
    values = {path: [] for path, _ in wanted}
    began = time.perf_counter()
    for done in range(count):
        rows = {split: next(stream) for split, stream in streams.items()}
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
