"""Do ensdiag's example-level intervals cover? Every column that carries one, on known populations.

    python benchmarks/interval_coverage.py --jobs 16            # the committed record: every population × N, 200 replicates
    python benchmarks/interval_coverage.py --replicates 40 --sizes 200 1000 --populations calibrated --out /tmp/c.json
    python benchmarks/interval_coverage.py --resume benchmarks/results/coverage-<date>.json --rounds 5 5 5

Each replicate draws a test set of N examples from a population of `coverage_populations.py` (whose
true values are computed there with numpy alone), runs every predictions analyzer on it in process
and puts each column's interval beside its value exactly as `ensdiag analyze --detail` does
(`ensdiag.core.intervals.column_resamples`: the analyzer's resampler on the shared draws, then the
column's construction); member geometry's columns (CKA, the barriers) go through the functions the
model analyzers call, on synthetic features and loss curves. Besides ensdiag's interval, every
construction a column could have used is built from the same resamples (`CANDIDATES`), so the
record shows why each column has the construction it has.

The record (benchmarks/results/coverage-<date>.json) holds per cell (population, N) and column: the
truth, and for ensdiag's interval and each candidate the replicates that covered it, missed it with
the truth below or above, their mean half-width, and how often the printed value fell outside it.
`benchmarks/docs_tables.py` renders it into docs/conventions.md; `tests/test_coverage_populations.py`
runs a subset of the cells (slow tier) and checks the committed record.

A full record is hours of a core (about 100 s per replicate of every cell), so it is built in parts:
`--resume RECORD` adds replicates to a record (each cell goes on from the replicate index it reached,
so no draw is repeated) when the code it measures — the analyzers, the intervals, member geometry and
these two scripts — gives the numbers it gave at every commit the record already holds: where git says
those files changed, replicate 0 of every cell is computed by the record's commit (a git worktree) and
by the code now, and every value and interval must agree to 10⁻⁹ (else it is refused, naming what
moved; `coverage_resume.py`). The record lists the commits and the replicates each added.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import coverage_populations as P  # noqa: E402
from coverage_resume import check_resumable, head_commit, resumed, uncommitted  # noqa: E402

SIZES = (200, 1000, 5000)
REPLICATES = 200
FLOOR = 0.93  # a column fails where the binomial upper bound of its coverage falls below this
ROUNDING = 1e-12  # a value this close outside its interval is the same number computed twice (a barrier's 1-ulp excess)
SPLITS = ("id", "shift", "ood")
OOD_ANALYZERS = ("ood", "uncertainty", "disagreement")  # what the OOD populations run (their ID is another's)
# model columns the suite produces from synthetic geometry: column key -> (kind, split its draws follow)
MODEL_COLUMNS = {"cka/splits/id/mean/value": ("cka", "id"), "cka/splits/ood/mean/value": ("cka", "ood"),
                 "paths/loss_barrier/value": ("loss", "id"), "paths/accuracy_barrier/value": ("accuracy", "id"),
                 "paths/train_loss_barrier/value": ("train_loss", "train")}


def key_of(analyzer: str, path) -> str:
    return "/".join((analyzer, *path))


def clopper_pearson(hits: int, trials: int) -> tuple[float, float]:
    """The exact binomial interval of a coverage (ensdiag's, tested against scipy's beta quantiles)."""
    from ensdiag.stats.constructions import clopper_pearson as exact
    return exact(hits, trials, 0.95)


# ------------------------------------------------------------------ candidate constructions

def candidates(estimate, resampled, value) -> dict:
    """{construction: (low, high)} of every construction from one column's resamples (ensdiag's
    bootstrap module): percentile, basic, the bias-corrected percentile and the hull of basic, percentile
    and the value for any statistic; the logit-scale ones (plain and debiased) for a number in [0, 1]
    (their floor 10⁻⁹, not the column's half pair, and no exact bound at 0 or 1: the column's own
    interval has those); the ray inversion and its hull for a folded one (a sum of absolute
    gaps or a maximum). "… ∪ percentile" is what `constructions.hulled` prints."""
    from ensdiag.stats import constructions as CI
    folded = isinstance(resampled, CI.Folded)
    values = resampled.combine(torch_nan_to_num(resampled.means)[None], resampled.mass)[0] if folded else resampled
    values = values[values.isfinite()]
    if value is None or not math.isfinite(value) or len(values) < 0.9 * len(resampled.means if folded else resampled):
        return {}
    found = {"percentile": CI.percentile(value, values), "basic": CI.basic(value, values), "bc": _bias_corrected(value, values)}
    hull = lambda name: (min(found[name][0], found["percentile"][0], value),  # noqa: E731
                         max(found[name][1], found["percentile"][1], value))
    found["basic ∪ percentile"] = hull("basic")
    if 0 <= value <= 1 and bool(((values >= 0) & (values <= 1)).all()):  # a number in [0, 1]: also on the logit scale
        found["logit"] = CI.logit(1e-9)(value, values)
        found["logit-debiased"] = CI.logit(1e-9, debiased=True)(value, values)
    if folded:
        found["ray"] = CI.ray(estimate, resampled)
        found["ray ∪ percentile"] = hull("ray")
    found["[0, hull]"] = (0.0, found["ray ∪ percentile" if folded else "basic ∪ percentile"][1])
    return found


def torch_nan_to_num(tensor):
    import torch
    return torch.nan_to_num(tensor)


def _bias_corrected(value, values):
    """Efron's bias-corrected percentile (BCa with no acceleration, which would need a jackknife)."""
    from scipy.stats import norm
    below = float((values < value).double().mean() + 0.5 * (values == value).double().mean())
    z0 = norm.ppf(min(max(below, 1e-6), 1 - 1e-6))
    low, high = norm.cdf(2 * z0 - 1.959964), norm.cdf(2 * z0 + 1.959964)
    found = np.quantile(values.numpy(), [low, high])
    return float(found[0]), float(found[1])


# ------------------------------------------------------------------ one replicate

class Replicates:
    """One population at one N: its fixed validation split, shared draws, and replicate i's intervals."""

    def __init__(self, population: P.Population, n: int, only=None):
        import torch
        from ensdiag.analysis import all_analyzers
        from ensdiag.stats import bootstrap as B
        self.population, self.n, self.draws = population, n, B.Draws()
        names = [name for name, analyzer in all_analyzers().items() if analyzer.needs == "predictions"]
        if not population.everything:  # the OOD populations: the analyzers that read the OOD split
            names = [name for name in names if name in OOD_ANALYZERS]
        self.only = [name for name in names if only is None or name in only]
        val = P.validation(population)
        self.val = {"logits": torch.from_numpy(val["logits"]), "labels": torch.from_numpy(val["labels"])}

    def predictions(self, rng) -> dict:
        import torch
        found = {"val": self.val}
        for split in SPLITS if self.population.shift else ("id", "ood"):
            drawn = self.population.draw(split, self.n, rng)
            found[split] = {"logits": torch.from_numpy(drawn["logits"]),
                            "labels": None if drawn["labels"] is None else torch.from_numpy(drawn["labels"])}
        return found

    def run(self, index: int) -> dict:
        """{column key: {"value", "ensdiag": (low, high) | None, "note", "candidates": {name: (low, high)}}}."""
        rng = np.random.default_rng([self.population.seed, self.n, index])
        found = self._predictions_columns(self.predictions(rng))
        found.update(self._geometry_columns(rng))
        return found

    def _predictions_columns(self, predictions) -> dict:
        from ensdiag.analysis import all_analyzers, analyze_predictions
        from ensdiag.analysis.registry import without_ood_labels
        from ensdiag.layout import lookup
        from ensdiag.core.intervals import column_resamples, targets
        examples = without_ood_labels(predictions)
        metrics = analyze_predictions(examples, only=self.only)
        analyzers, found = all_analyzers(), {}
        for name, result in metrics["analyzers"].items():
            analyzer = analyzers[name]
            if result.get("status") != "ok" or analyzer.needs != "predictions":
                continue
            wanted = targets(analyzer, result, examples, detail=True)
            if not wanted:
                continue
            entries, _ = column_resamples(analyzer, result, examples, None, wanted, self.draws)
            for path, (entry, raw) in entries.items():
                value = lookup(result, path)[0]
                if raw is None and name == "calibration" and path[-2] == "mce":  # no interval printed: why not
                    raw = (None, self._mce_resamples(examples))
                found[key_of(name, path)] = _outcome(value, entry, raw)
        return found

    def _mce_resamples(self, examples):
        """The MCE over the shared draws, for the candidates that show why it prints no interval."""
        from ensdiag.stats import bootstrap as B
        from ensdiag.analysis.calibration import bins
        from ensdiag.stats.examples import Examples
        split = Examples.of(examples["id"])
        return bins(split, self.draws.counts("id", self.n, 0, B.resamples_for(self.n))).mce()

    def _geometry_columns(self, rng) -> dict:
        import torch
        from ensdiag.geometry.cka import Moments
        from ensdiag.geometry.paths import barrier, excess
        from ensdiag.geometry.resampled import (CKA_INTERVAL_EXAMPLES, barrier_entry, cka_entry, cka_resamples,
                                                least_barrier_resamples)
        found = {}
        for split in ("id", "ood") if self.population.everything else ("ood",):
            features = {layer: [torch.from_numpy(x) for x in members]
                        for layer, members in P.features(self.population, self.n, rng).items()}
            means = []
            for members in features.values():
                moments = Moments()
                moments.add(members)
                linear = moments.cka()[0]
                means.append(float((linear.sum() - linear.diagonal().sum()) / (len(members) * (len(members) - 1))))
            value = sum(means) / len(means)
            kept = {layer: [x[:CKA_INTERVAL_EXAMPLES] for x in members] for layer, members in features.items()}
            raw = cka_resamples(kept, self.n, split, value)
            found[f"cka/splits/{split}/mean/value"] = _outcome(value, cka_entry(raw, self.n, len(kept["layer0"][0])), raw)
        if not self.population.everything:
            return found
        curves = [{key: torch.from_numpy(values) for key, values in pair.items()}
                  for pair in P.loss_curves(self.population, self.n, rng)]
        ts = list(P.PATH_POINTS)
        for key, (kind, split) in MODEL_COLUMNS.items():  # as analysis/geometry.py's `paths` and its barrier intervals
            if kind == "cka":
                continue
            worse = kind != "accuracy"
            value = sum(barrier(ts, pair[kind].mean(1).tolist(), worse) for pair in curves) / len(curves)
            # one alignment per pair: the least barrier over one restart is its barrier
            raw = least_barrier_resamples([[(excess(ts, pair[kind], worse), 1)] for pair in curves], split)
            found[key] = _outcome(value, barrier_entry(raw, self.n), raw)
        return found


def _outcome(value, entry, raw) -> dict:
    estimate, resampled = raw if raw is not None else (None, None)
    low, high = (entry or {}).get("low"), (entry or {}).get("high")
    return {"value": value, "ensdiag": None if low is None else (low, high), "note": (entry or {}).get("note"),
            "construction": (entry or {}).get("method"),
            "candidates": candidates(estimate, resampled, value) if isinstance(value, (int, float)) and raw else {}}


# ------------------------------------------------------------------ cells and the record

def tally(outcomes: list[dict], truth) -> dict:
    """Coverage of ensdiag's interval and of each candidate over the replicates of one cell and column."""
    def count(pairs, values):
        kept = [(pair, value) for pair, value in zip(pairs, values) if pair is not None]
        if not isinstance(truth, (int, float)) or not math.isfinite(truth):  # no population value to cover
            return {"replicates": len(kept), "covered": None, "truth_below": None, "truth_above": None,
                    "half_width": float(np.mean([(high - low) / 2 for (low, high), _ in kept])) if kept else None,
                    "value_outside": 0, "coverage_interval": None}
        hits = sum(low <= truth <= high for (low, high), _ in kept)
        return {"replicates": len(kept), "covered": hits, "truth_below": sum(truth < low for (low, _), _ in kept),
                "truth_above": sum(truth > high for (_, high), _ in kept),
                "half_width": float(np.mean([(high - low) / 2 for (low, high), _ in kept])) if kept else None,
                "value_outside": sum(not (low - ROUNDING <= value <= high + ROUNDING) for (low, high), value in kept
                                     if isinstance(value, (int, float))),
                "coverage_interval": clopper_pearson(hits, len(kept)) if kept else None}
    values = [outcome["value"] for outcome in outcomes]
    found = {"truth": truth, "ensdiag": count([outcome["ensdiag"] for outcome in outcomes], values),
             "construction": next((outcome["construction"] for outcome in outcomes if outcome["construction"]), None),
             "notes": sorted({outcome["note"] for outcome in outcomes if outcome["note"]}),
             "candidates": {name: count([outcome["candidates"].get(name) for outcome in outcomes], values)
                            for name in dict.fromkeys(name for outcome in outcomes for name in outcome["candidates"])}}
    return found


def run_cell(population_name: str, n: int, replicates: range, truths: dict, only=None) -> dict:
    """{column key: tally} of one population at one N over the given replicates."""
    import torch
    torch.set_num_threads(1)
    runner = Replicates(P.POPULATIONS[population_name], n, only)
    outcomes = [runner.run(index) for index in replicates]
    keys = dict.fromkeys(key for outcome in outcomes for key in outcome)
    return {key: tally([outcome[key] for outcome in outcomes if key in outcome], truths.get(key)) | {"known": key in truths}
            for key in keys}


def _job(args):
    population, n, replicates, truths, only = args
    return population, n, replicates.start, run_cell(population, n, replicates, truths, only)


def merge(parts: list[dict]) -> dict:
    """Tallies of the same cell over several chunks of replicates, added up."""
    def add(a, b):
        if a is None:
            return b
        if a["covered"] is None or b["covered"] is None:  # no truth: the widths only
            return a | {"replicates": a["replicates"] + b["replicates"]}
        total = a["replicates"] + b["replicates"]
        found = {key: a[key] + b[key] for key in ("replicates", "covered", "truth_below", "truth_above", "value_outside")}
        found["half_width"] = (None if not total else (a["half_width"] or 0) * a["replicates"] / total
                               + (b["half_width"] or 0) * b["replicates"] / total)
        found["coverage_interval"] = clopper_pearson(found["covered"], total) if total else None
        return found
    merged = {}
    for part in parts:
        for key, entry in part.items():
            held = merged.get(key)
            if held is None:  # a copy: the parts are merged again after every round, and must stay as they were
                merged[key] = json.loads(json.dumps(entry))
                continue
            held["ensdiag"] = add(held["ensdiag"], entry["ensdiag"])
            held["notes"] = sorted(set(held["notes"]) | set(entry["notes"]))
            for name, tallied in entry["candidates"].items():
                held["candidates"][name] = add(held["candidates"].get(name), tallied)
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", nargs="+", default=list(P.POPULATIONS))
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--replicates", type=int, default=REPLICATES)
    parser.add_argument("--rounds", nargs="+", type=int, default=None,
                        help="replicates per round at each size (default: 25 at each); the record is written after each round")
    parser.add_argument("--until", type=float, default=None, help="start no round after this Unix time (a deadline)")
    parser.add_argument("--truth-examples", type=int, default=P.TRUTH_EXAMPLES)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="+", default=None, help="these predictions analyzers only (exploring)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None, help="add replicates to this record (written in place)")
    args = parser.parse_args()
    out = args.resume or args.out or \
        Path(__file__).parent / "results" / f"coverage-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    rounds = dict(zip(args.sizes, args.rounds or [25] * len(args.sizes)))
    began = time.process_time()
    import ensdiag
    if not Path(ensdiag.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1]):
        raise SystemExit(f"this checkout's code is what a record measures, but Python imports ensdiag from "
                         f"{Path(ensdiag.__file__).parent} (pip install -e . here, or PYTHONPATH=.)")
    changed = uncommitted()
    if changed:  # a record names the commit whose code made it
        raise SystemExit("commit the code a record measures first: " + ", ".join(changed))
    record = check_resumable(args) if args.resume else None
    truths = population_truths(args.populations, args.truth_examples, args.jobs)
    done, start, args.parts = [], {n: 0 for n in args.sizes}, []
    if record is not None:
        done, start, args.parts, seconds = resumed(record, truths)
        began -= seconds
    args.parts.append({"commit": head_commit(), "from": dict(start)})
    while any(start[n] < args.replicates for n in args.sizes) and (args.until is None or time.time() < args.until):
        jobs = [(name, n, range(start[n], min(start[n] + rounds[n], args.replicates)), truths[name], args.only)
                for n in args.sizes if start[n] < args.replicates for name in args.populations]
        if args.jobs > 1:
            import multiprocessing
            with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
                done += pool.map(_job, jobs, chunksize=1)
        else:
            done += [_job(job) for job in jobs]
        start = {n: min(start[n] + rounds[n], args.replicates) for n in args.sizes}
        args.parts[-1]["to"] = dict(start)
        write_record(out, args, truths, done, time.process_time() - began)
        print(f"replicates so far {start}; wrote {out}", flush=True)


def _truth(args):
    return P.true_values(P.POPULATIONS[args[0]], args[1])


def population_truths(names: list, examples: int, jobs: int) -> dict:
    """{population: its true values}, computed over `jobs` processes."""
    if jobs <= 1:
        return {name: _truth((name, examples)) for name in names}
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(min(jobs, len(names))) as pool:
        return dict(zip(names, pool.map(_truth, [(name, examples) for name in names], chunksize=1)))


def write_record(out: Path, args, truths: dict, done: list, seconds: float):
    """The record of the rounds done so far: every cell with the replicates it has."""
    import torch
    import ensdiag
    from ensdiag.provenance import environment
    cells = []
    for name in args.populations:
        for n in args.sizes:
            parts = [tallied for population, size, _, tallied in sorted(done, key=lambda d: d[2])
                     if population == name and size == n]
            if parts:
                cells.append({"population": name, "n": n, "columns": merge(parts)})
    record = {"what": "coverage of ensdiag's example-level 95 % intervals on known populations", "environment":
              environment(torch.device("cpu")) | {"ensdiag": ensdiag.__version__},
              "settings": {"replicates_wanted": args.replicates, "sizes": args.sizes, "truth_examples": args.truth_examples,
                           "members": P.MEMBERS, "classes": P.CLASSES, "floor": FLOOR, "level": 0.95, "only": args.only},
              "populations": {name: {"description": P.POPULATIONS[name].description,
                                     "truths": {key: value for key, value in truths[name].items()}}
                              for name in args.populations},
              "cells": cells, "process_seconds": round(seconds, 1),
              "parts": [part if "confirm" in part else  # (coverage_confirm.py's, kept as they are)
                        {"commit": part["commit"], "from": {str(n): i for n, i in part["from"].items()},
                         "to": {str(n): i for n, i in part.get("to", part["from"]).items()}} for part in args.parts]}
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
