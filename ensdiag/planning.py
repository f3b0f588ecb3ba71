"""A time budget and a precision target: how many examples each step of a diagnosis reads.

    plan = Plan.of(budget="5m", precision=0.01)      # either may be None
    diagnosis = inspect(ensemble, splits, plan=plan)  # core.py asks the plan at every step
    diagnosis.metrics["budget"]                       # what was measured, with what precision, what was skipped

Every step's cost is measured, not guessed: a first batch of each split times the ensemble per
example, a first forward of one member times the paths, and weights-only steps (alignment,
rank) are timed as they run. The plan then gives each step the examples it can afford:

- predictions get a share of the budget (`PREDICTION_SHARE`, all of it without member
  geometry), spread so that every split family (id, shift, ood, val) reads the same number of
  examples where it has them, since the widest interval decides what a diagnosis can say; a
  split too small for its share gives the rest to the others;
- examples are read in a seeded random order (a split's first examples may be one class) and in
  doubling chunks; with a precision target a split stops once every headline number that
  reads it has an interval at most that half-width (`bootstrap.half_width`);
- member geometry then shares what is left: CKA and paths read the same n where they can, paths
  on 3, then 2, then 1 pair and 11, then adaptive points as n would otherwise fall below
  `PATH_EXAMPLES_FLOOR`; a step that cannot run says why (`skipped`), never silently.

A subsample's intervals carry `full_split`, the interval for what the whole split would give
(`bootstrap.py`). `estimate_full` states, from the same measured costs, how long the diagnosis
without a budget would take.
"""

import math
import re
import time
from dataclasses import dataclass, field

import torch

from . import bootstrap as B
from .errors import EnsdiagError
from .quickcheck import parse_precision, parse_seconds

PREDICTION_SHARE = 0.5  # of the budget, for predictions, when member geometry follows
RESERVE = 0.05  # of the budget, kept for the analyzers and their intervals
FIRST_CHUNK = 128  # examples of a split's first chunk (the ensemble's cost per example is timed on it)
PATH_EXAMPLES_FLOOR = 200  # below this many test examples per path point, fewer points and pairs
GEOMETRY_FLOOR = 50  # below this many examples a geometry step is skipped
CHECK_RESAMPLES = 200  # resamples of the precision checks while a split is read (the stored intervals use 1,000)


@dataclass
class Plan:
    """The budget of one diagnosis and the record of what each step measured."""

    seconds: float | None = None
    precision: float | None = None
    geometry: bool = True
    started: float = field(default_factory=time.perf_counter)
    steps: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)  # measured seconds per example (or per step for weights-only steps)
    full: dict = field(default_factory=dict)  # split -> its size, where it was subsampled
    sizes: dict = field(default_factory=dict)  # split -> its size (None: a stream of unknown length)

    @classmethod
    def of(cls, budget=None, precision=None, geometry=True) -> "Plan | None":
        seconds, target = parse_seconds(budget), parse_precision(precision)
        return None if seconds is None and target is None else cls(seconds, target, geometry)

    def spent(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        return math.inf if self.seconds is None else max(0.0, self.seconds * (1 - RESERVE) - self.spent())

    def record(self, step: str, **facts) -> None:
        self.steps.append({"step": step, **facts})

    def skip(self, step: str, reason: str) -> None:
        self.skipped[step] = reason

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "precision_target": self.precision, "spent_seconds": round(self.spent(), 2),
                "costs": {key: round(value, 6) for key, value in self.costs.items()}, "steps": self.steps,
                "skipped": self.skipped, **({"full_estimate_seconds": round(self.estimate, 1)}
                                            if getattr(self, "estimate", None) is not None else {})}

    # predictions ---------------------------------------------------------------------------------

    def prediction_seconds(self) -> float:
        return self.remaining() * (PREDICTION_SHARE if self.geometry else 1.0)

    def examples_per_family(self, sizes: dict, seconds: float, cost: float) -> dict:
        """{family: examples} spending `seconds` at `cost` per example: the same n for every family
        that has it, a family with fewer examples read whole and its rest shared by the others."""
        if math.isinf(seconds):
            return dict(sizes)
        left, chosen, open_ = seconds / max(cost, 1e-12), {}, dict(sizes)
        while open_:
            share = left / len(open_)
            small = {name: size for name, size in open_.items() if size is not None and size <= share}
            if not small:
                chosen.update({name: int(share) for name in open_})
                break
            chosen.update(small)
            left -= sum(small.values())
            open_ = {name: size for name, size in open_.items() if name not in small}
        return chosen


def family(split: str) -> str:
    return B.family(split)


def random_order(name: str, size: int) -> torch.Tensor:
    """The order a split's examples are read in under a budget: seeded by the split and its size
    (the same examples for every method measured on that split)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(B.seed_of(name, size) + 1))


def length(data) -> int | None:
    """Examples in data given in any form `data.given` reads; None for a stream of unknown length."""
    from .data.registry import Split
    if isinstance(data, Split) or isinstance(data, torch.Tensor):
        return len(data)
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(d, torch.Tensor) for d in data):
        return len(data[0])
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        return len(data)
    return None


def take(data, index: torch.Tensor):
    """The examples `index` of random-access data, in the same form."""
    from .data.registry import Split
    if isinstance(data, Split):
        return data.subset(index)
    if isinstance(data, torch.Tensor):
        return data[index]
    if isinstance(data, (tuple, list)):
        return data[0][index], data[1][index]
    return torch.utils.data.Subset(data, index.tolist())


def predict_within(plan: Plan, ensemble, splits: dict, preprocess, device, keep: int, progress=None):
    """({split: {"logits", "labels"}} on the examples the plan affords, {split: kept (x, y) of the
    first `keep` of them}); every split's step recorded in the plan."""
    known = ("id", "shift", "ood", "val")
    order = sorted((name for name in splits if splits[name] is not None),
                   key=lambda s: known.index(family(s)) if family(s) in known else len(known))
    plan.sizes = {name: length(splits[name]) for name in order}
    families = {}
    for name in order:
        families.setdefault(family(name), []).append(name)
    family_sizes = {group: (sum(plan.sizes[s] for s in names) if all(plan.sizes[s] is not None for s in names) else None)
                    for group, names in families.items()}
    budget, began = plan.prediction_seconds(), plan.spent()
    plan.deadline = began + budget  # predictions and their analysis end here (seconds since the plan started)
    per_family = {}

    def share(group):
        chosen = per_family.get(group)
        return None if chosen is None else max(1, chosen // len(families[group]))

    def first_chunk(group, chunk, seconds):  # the costs per example, from the first split's first chunk
        n = chunk["logits"].shape[1]
        plan.costs["predict per example"] = seconds / max(n, 1)
        fixed, per_example = _analysis_cost(chunk)
        plan.costs["analysis per example"] = per_example
        reserve = fixed * len(order)  # the analyzers' fixed part, once per split
        plan.costs["analysis fixed"] = reserve
        per_family.update(plan.examples_per_family(family_sizes, max(budget - reserve - (plan.spent() - began), 0.0),
                                                   plan.costs["predict per example"] + per_example))
        return share(group)

    found, kept = {}, {}
    for group, names in families.items():
        for name in names:
            began = time.perf_counter()
            timing = (lambda n, seconds, group=group: first_chunk(group, n, seconds)) if not per_family else None
            logits, labels, first, why = _read(plan, ensemble, name, splits[name], plan.sizes[name],
                                               FIRST_CHUNK if timing else share(group), preprocess, device, keep, found,
                                               progress, timing)
            found[name] = {"logits": logits, "labels": labels}
            if first is not None:
                kept[name] = first
            n, size = logits.shape[1], plan.sizes[name]
            if size is not None and n < size:
                plan.full[name] = size
            plan.record(f"predict {name}", n=n, of=size, seconds=round(time.perf_counter() - began, 2), stopped=why,
                        **_widest(found, name))
    return found, kept


def _analysis_left(plan, found, reading) -> float:
    """Seconds the analyzers will take on what has been read (the split being read included)."""
    read = reading + sum(split["logits"].shape[1] for split in found.values())
    return plan.costs.get("analysis fixed", 0.0) + plan.costs.get("analysis per example", 0.0) * read


class _Stream:
    """Batches of a stream taken `count` examples at a time; the rest of a cut batch waits for the next take."""

    def __init__(self, batches):
        self.batches, self.rest = batches, None

    def take(self, count):
        taken = 0
        while taken < count:
            if self.rest is not None:
                (x, y), self.rest = self.rest, None
            else:
                try:
                    x, y = next(self.batches)
                except StopIteration:
                    return
            if taken + len(x) > count:
                cut = count - taken
                self.rest = (x[cut:], None if y is None else y[cut:])
                x, y = x[:cut], None if y is None else y[:cut]
            taken += len(x)
            yield x, y


def _read(plan, ensemble, name, data, size, wanted, preprocess, device, keep, found, progress, timing=None):
    """Predict `wanted` examples of one split (all where None) in a seeded random order and in
    doubling chunks, stopping early once the precision target is met or the time is spent;
    (logits, labels, kept, why it stopped). `timing(chunk, seconds)`: called after the first chunk,
    returns how many examples to read in all."""
    from .data.given import batches
    from .predict import predict_batches
    index = random_order(name, size) if size is not None else None
    stream = _Stream(batches(data, name)) if index is None else None
    chunks, labels, first, done, checked = [], [], None, 0, FIRST_CHUNK
    why = "budget"
    while True:
        limit = size if wanted is None else (wanted if size is None else min(wanted, size))
        if limit is not None and done >= limit:
            why = "all examples" if limit == size else why
            break
        step = max(done, FIRST_CHUNK) if limit is None else min(max(done, FIRST_CHUNK), limit - done)
        source = batches(take(data, index[done:done + step]), name) if index is not None else stream.take(step)
        began = time.perf_counter()
        try:
            logits, y, kept = predict_batches(ensemble, source, preprocess, device, max(keep - done, 0), name,
                                              progress(name) if progress else None)
        except EnsdiagError:
            if done and index is None:  # the stream ended
                why = "all examples"
                break
            raise
        chunks.append(logits)
        labels.append(y)
        if kept is not None:
            first = kept if first is None else (torch.cat([first[0], kept[0]]),
                                                None if first[1] is None else torch.cat([first[1], kept[1]]))
        done += logits.shape[1]
        if timing is not None:
            pilot = {"logits": logits, "labels": y}
            wanted, timing = timing(pilot, time.perf_counter() - began), None
            continue
        if index is None and logits.shape[1] < step:
            why = "all examples"
            break
        if plan.precision is not None and done >= 2 * checked:
            checked = done
            partial = {**found, name: {"logits": torch.cat(chunks, 1),
                                       "labels": None if any(part is None for part in labels) else torch.cat(labels)}}
            widest = _widest(partial, name)
            if widest.get("half_width") is not None and widest["half_width"] <= plan.precision:
                why = "precision reached"
                break
        if plan.seconds is not None and plan.spent() + _analysis_left(plan, found, done) >= plan.deadline:
            why = "budget"
            break
    y = None if any(part is None for part in labels) else torch.cat(labels)
    return torch.cat(chunks, 1), y, first, why


ANALYSIS_TILES = 8  # the pilot chunk repeated this often, for the second of the two timed analyses


def _analysis_cost(chunk: dict) -> tuple[float, float]:
    """(fixed seconds, seconds per example) of the analyzers and their intervals on one split,
    fitted to two timed runs: on the chunk, and on the chunk repeated `ANALYSIS_TILES` times (what
    they cost depends on how many examples there are, hardly on their values)."""
    from .analysis import analyze_predictions
    from .intervals import add_intervals
    n = chunk["logits"].shape[1]
    if n < 8:
        return 0.0, 0.0
    timed = []
    for tiles in (1, ANALYSIS_TILES):
        part = {"id": {"logits": chunk["logits"].repeat(1, tiles, 1),
                       "labels": None if chunk["labels"] is None else chunk["labels"].repeat(tiles)}}
        began = time.perf_counter()
        add_intervals(analyze_predictions(part), part)
        timed.append(time.perf_counter() - began)
    per_example = max(timed[1] - timed[0], 0.0) / (n * (ANALYSIS_TILES - 1))
    return max(timed[0] - per_example * n, 0.0), per_example


def _widest(predictions: dict, split: str) -> dict:
    """{"half_width", "column"} of the widest example-level interval among the headline numbers
    that read `split` (vectorised analyzers only; a quick check with `CHECK_RESAMPLES`)."""
    from .analysis import all_analyzers, analyze_predictions
    from .checks import check_predictions
    from .intervals import add_intervals, targets
    from .predictions import with_pooled_shift
    try:
        checked = with_pooled_shift(check_predictions(dict(predictions), "the examples read so far", need_id=False))
    except EnsdiagError:
        return {}
    names = [name for name, analyzer in all_analyzers().items() if analyzer.needs == "predictions" and analyzer.resampler]
    metrics = analyze_predictions(checked, only=names)
    add_intervals(metrics, checked, resamples=CHECK_RESAMPLES, only=names)
    widest = {}
    for name in names:
        result = metrics["analyzers"].get(name, {})
        if result.get("status") != "ok":
            continue
        for path, reads in targets(all_analyzers()[name], result, checked):
            if split not in reads:
                continue
            node = result
            for key in path[:-1]:
                node = node[key]
            width = B.half_width(node.get("interval"))
            if width is not None and (not widest or width > widest["half_width"]):
                widest = {"half_width": round(width, 6), "column": f"{name}/{'/'.join(path[:-1])}"}
    return widest


# member geometry ---------------------------------------------------------------------------------

PILOT = 64  # examples CKA's pilot reads per split, and images one member's timed forward reads
PATH_CHOICES = ((3, 11), (3, "adaptive"), (2, "adaptive"), (1, "adaptive"))  # (pairs, points), most first
ADAPTIVE_POINTS = 8  # what an adaptive path costs on average, for planning (6 on a flat curve, 11 at most)


def geometry_order(names: list, analyzers: dict) -> list:
    """Weights-only steps first (their cost does not depend on examples), then alignment (paths
    start from it), CKA and paths (which share what is left), then any other model analyzer."""
    rank = {"alignment": 1, "cka": 2, "paths": 3}
    return sorted(names, key=lambda name: (0 if not analyzers[name].reads_data else rank.get(name, 4)))


def run_geometry(plan: Plan, probe, names: list, analyze, status) -> dict:
    """{name: result} of the model analyzers within the plan; each step's examples chosen from
    measured costs and recorded, a step that does not fit skipped with its reason."""
    from .analysis import all_analyzers
    analyzers = all_analyzers()
    results = {}
    for name in geometry_order(names, analyzers):
        if name in ("cka", "paths") and "geometry" not in plan.costs:
            _plan_geometry(plan, probe, [step for step in ("cka", "paths") if step in names])
        elif name == "paths" and "paths" not in plan.skipped and plan.seconds is not None:
            _refit_paths(plan, probe)  # what the steps before took, not what they were expected to take
        reason = plan.skipped.get(name) or (f"the budget was spent ({plan.spent():.0f} s of {plan.seconds:.0f} s) before "
                                            "this step" if plan.seconds is not None and plan.remaining() <= 0 else None)
        if reason:
            plan.skip(name, reason)
            results[name] = {"status": "skipped", "description": analyzers[name].description, "reason": f"budget: {reason}"}
            continue
        began = time.perf_counter()
        with status(f"member geometry: {analyzers[name].description} …"):
            results.update(analyze(name))
        plan.record(name, seconds=round(time.perf_counter() - began, 2), **_geometry_facts(name, results[name], probe))
    return results


def _geometry_facts(name, result, probe) -> dict:
    if result.get("status") != "ok":
        return {"status": result.get("status"), "reason": result.get("reason")}
    if name == "cka":
        return {"n": {split: found["n"] for split, found in result["splits"].items()},
                "half_width": {split: B.half_width(found["mean"].get("interval")) for split, found in result["splits"].items()}}
    if name == "paths":
        return {"pairs": len(result["pairs"]), "points": [len(pair["t"]) for pair in result["pairs"]], "n": result["n"],
                "batchnorm_images": len(probe._training_pick()) if "recomputed" in result["batchnorm"] else 0,
                "train_sample": result.get("train_n", 0),
                "half_width": B.half_width(result["loss_barrier"].get("interval"))}
    return {}


def _timed_forward(probe) -> float:
    """Seconds per image of one member network's forward (the unit of a path's cost)."""
    networks = probe.members()
    split = probe.split("id", limit=PILOT)
    network = networks[0]
    device = next(network.parameters()).device
    with torch.no_grad():
        x = probe.normalize(split.images.to(device))
        network(x[:2])  # a first call pays one-time costs
        began = time.perf_counter()
        network(x)
    return (time.perf_counter() - began) / len(split)


def _cka_pilot(plan, probe) -> tuple[float, float, float | None]:
    """(seconds per example and split of CKA's forward passes, seconds of its interval on `PILOT`
    examples, that interval's half-width)."""
    from .geometry.representations import layer_cka
    from .geometry.resampled import cka_interval
    split = probe.split("id", limit=PILOT)
    warm = layer_cka(probe.members(), split.images[:8], probe.normalize, retain=8)  # first calls pay one-time costs
    if warm["kept"]:
        cka_interval(warm["kept"], len(warm["kept"][next(iter(warm["kept"]))][0]), "id", None)
    began = time.perf_counter()
    found = layer_cka(probe.members(), split.images, probe.normalize, retain=len(split))
    forward = (time.perf_counter() - began) / len(split)
    if not found["kept"]:
        return forward, 0.0, None
    began = time.perf_counter()
    width = B.half_width(cka_interval(found["kept"], len(split), "id", None))
    return forward, time.perf_counter() - began, width


def cka_seconds(n: float, costs: dict, splits: int) -> float:
    """CKA's cost on n examples per split: its forward passes, and its interval, whose Gram
    matrices grow as the square of the examples it keeps (at most `CKA_INTERVAL_EXAMPLES`)."""
    from .geometry.resampled import CKA_INTERVAL_EXAMPLES
    kept = min(n, CKA_INTERVAL_EXAMPLES)
    return splits * (n * costs.get("cka per example and split", 0.0)
                     + costs.get("cka interval on the pilot", 0.0) * (kept / PILOT) ** 2)


def paths_seconds(n: float, costs: dict, pairs: int, points, batchnorm: bool = True) -> float:
    """A path's cost: every point reads n test examples, n training-sample images and (with
    BatchNorm) n images to recompute its statistics, at one member's forward cost."""
    per_point = ADAPTIVE_POINTS if points == "adaptive" else points
    return pairs * per_point * (3 if batchnorm else 2) * n * costs.get("member forward per image", 0.0)


def _largest(cost, limit: float, seconds: float) -> int:
    """The largest n ≤ limit whose cost(n) fits `seconds` (cost grows with n), by bisection."""
    if cost(limit) <= seconds:
        return int(limit)
    low, high = 0.0, float(limit)
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if cost(middle) <= seconds else (low, middle)
    return int(low)


def _plan_geometry(plan: Plan, probe, steps: list) -> None:
    """Examples (and path pairs and points) for CKA and paths from their measured costs."""
    from .analysis.geometry import BATCHNORM_EXAMPLES, PATH_EXAMPLES
    from .analysis.registry import Skip
    plan.costs["geometry"] = 1.0
    try:
        probe.members()
    except Skip:
        return  # the analyzers say why themselves
    if probe.split("id") is None:
        return
    available = {name: len(probe.split(name)) for name in ("id", "ood") if probe.split(name) is not None}
    splits = len(available)
    width = None
    if "cka" in steps:
        forward, interval, width = _cka_pilot(plan, probe)
        plan.costs.update({"cka per example and split": forward, "cka interval on the pilot": interval})
    if "paths" in steps:
        plan.costs["member forward per image"] = _timed_forward(probe)
    seconds, k = plan.remaining(), probe.ensemble.num_members or 2
    limit = max(available.values())
    cka = (lambda n: cka_seconds(n, plan.costs, splits)) if "cka" in steps else (lambda n: 0.0)  # noqa: E731
    chosen, n = None, None
    for pairs, points in (PATH_CHOICES if "paths" in steps else ()):
        chosen = (min(pairs, k - 1), points)
        n = limit if math.isinf(seconds) else _largest(lambda n: cka(n) + paths_seconds(n, plan.costs, *chosen), limit,
                                                        seconds)
        if n >= min(PATH_EXAMPLES_FLOOR, limit):
            break
    if "paths" in steps and n < min(GEOMETRY_FLOOR, limit):
        pairs, points = chosen
        plan.skip("paths", f"{pairs} pair{'s' * (pairs > 1)} × {points} points on {GEOMETRY_FLOOR} examples (with CKA) "
                           f"would need {cka(GEOMETRY_FLOOR) + paths_seconds(GEOMETRY_FLOOR, plan.costs, *chosen):.0f} s; "
                           f"{seconds:.0f} s were left")
        n = None
    if "cka" in steps:
        n_cka = n if n is not None else (limit if math.isinf(seconds) else _largest(cka, limit, seconds))
        if plan.precision is not None and width:
            n_cka = min(n_cka, max(PILOT, int(PILOT * (width / plan.precision) ** 2)))
        if n_cka < min(GEOMETRY_FLOOR, limit):
            plan.skip("cka", f"{GEOMETRY_FLOOR} examples per split would need {cka(GEOMETRY_FLOOR):.0f} s; {seconds:.0f} s "
                             "were left")
        probe.limits["cka"] = max(int(n_cka), 2)
    if "paths" in steps and "paths" not in plan.skipped:
        n_paths = min(PATH_EXAMPLES, available["id"]) if math.isinf(seconds) else int(n)
        probe.path_pairs, probe.path_points = chosen
        probe.limits["paths"] = max(2, n_paths)
        probe.limits["batchnorm"] = max(2, min(n_paths, BATCHNORM_EXAMPLES))
        if plan.precision is not None:
            probe.enough = lambda curves: _barrier_precise(curves, plan.precision)


def _refit_paths(plan: Plan, probe) -> None:
    """The paths' examples, pairs and points again, for the time actually left."""
    from .analysis.geometry import BATCHNORM_EXAMPLES
    if "member forward per image" not in plan.costs or "paths" not in probe.limits:
        return
    seconds, k = plan.remaining(), probe.ensemble.num_members or 2
    planned = probe.limits["paths"]
    if paths_seconds(planned, plan.costs, probe.path_pairs, probe.path_points) <= seconds:
        return
    for pairs, points in PATH_CHOICES:
        chosen = (min(pairs, k - 1), points)
        n = _largest(lambda n: paths_seconds(n, plan.costs, *chosen), planned, seconds)
        if n >= min(PATH_EXAMPLES_FLOOR, planned):
            break
    if n < min(GEOMETRY_FLOOR, planned):
        plan.skip("paths", f"{chosen[0]} pair × {chosen[1]} points on {GEOMETRY_FLOOR} examples would need "
                           f"{paths_seconds(GEOMETRY_FLOOR, plan.costs, *chosen):.0f} s; {seconds:.0f} s were left")
        return
    probe.path_pairs, probe.path_points = chosen
    probe.limits["paths"] = max(2, n)
    probe.limits["batchnorm"] = max(2, min(n, BATCHNORM_EXAMPLES))


def _barrier_precise(curves, target) -> bool:
    from .geometry.paths import excess
    from .geometry.resampled import barrier_interval
    width = B.half_width(barrier_interval([(curves["t"], excess(curves["t"], curves["loss"]))], "id"))
    return width is not None and width <= target


def estimate_full(plan: Plan, metrics: dict, geometry_examples, path_points=11) -> float:
    """Seconds the same diagnosis would take on every example (no budget), from the measured costs:
    predictions of every split, CKA on the examples it would keep, paths on the protocol's pairs,
    points and examples, the weights-only steps as they ran, the analyzers scaled to every example."""
    from .analysis.geometry import BATCHNORM_EXAMPLES, PATH_EXAMPLES, PATH_PAIRS
    sizes = {name: size for name, size in plan.sizes.items() if size is not None}
    read = {step["step"]: step for step in plan.steps}
    total = plan.costs.get("predict per example", 0.0) * sum(sizes.values())
    measured = sum(step.get("n", 0) for step in plan.steps if step["step"].startswith("predict "))
    if "analyzers and intervals" in read and measured:
        total += read["analyzers and intervals"]["seconds"] * sum(sizes.values()) / measured
    limit = lambda n: n if geometry_examples is None else min(n, geometry_examples)  # noqa: E731
    geometry = [name for name in ("id", "ood") if name in sizes]
    if "cka per example and split" in plan.costs and geometry:
        total += cka_seconds(max(limit(sizes[name]) for name in geometry), plan.costs, len(geometry))
    if "member forward per image" in plan.costs and "id" in sizes:
        k = metrics.get("ensemble", {}).get("num_members") or 2
        n = min(PATH_EXAMPLES, limit(sizes["id"]))
        total += paths_seconds(1, plan.costs, min(PATH_PAIRS, k - 1), path_points) * (n + 2 * BATCHNORM_EXAMPLES) / 3
    total += sum(read[name]["seconds"] for name in ("alignment", "rank-structure") if name in read)
    plan.estimate = total
    return total
