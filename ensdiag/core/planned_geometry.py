"""A budget's member geometry: CKA and paths sized from their measured costs (planning.py).

Weights-only steps (rank, alignment) run first and are timed; CKA and the paths then share what
is left at the same number of examples, from a CKA pilot on `PILOT` examples (its forward
passes, and its interval, whose cost grows as the square of the examples it keeps), one
member's timed forward, one timed path point and one timed restart of weight matching; paths
fall back from the barrier search's least restarts (its rule's minimum, `least.rule_for`: 24 with
`--detail`, else 6; the search then capped there) to the aligned cosine's 3, then to fewer pairs, then to an adaptive grid, before reading fewer than
`PATH_EXAMPLES_FLOOR` test examples, and are refitted to the time actually left after CKA.
`estimate_full` states, from the same measured costs, how long the diagnosis without a budget
would take.
"""

import math
import time

import torch

from ..analysis import all_analyzers
from ..analysis.geometry import BATCHNORM_EXAMPLES, PATH_EXAMPLES, PATH_PAIRS
from ..errors import Skip
from ..geometry.align import RESTARTS, restart
from ..geometry.least import rule_for
from ..geometry.paths import evaluate_point, excess
from ..geometry.representations import layer_cka
from ..geometry.resampled import CKA_INTERVAL_EXAMPLES, barrier_interval, cka_interval
from ..stats import constructions as CI
from ..text import counted

PATH_EXAMPLES_FLOOR = 200  # below this many test examples per path point, fewer points and pairs
GEOMETRY_FLOOR = 50  # below this many examples a geometry step is skipped


PILOT = 64  # examples CKA's pilot reads per split, and images of the timed path point
FORWARD_PILOT = 256  # images of one member's timed forward: on a CPU, an image costs more in a large batch
SEARCH = "search"  # in PATH_CHOICES: the barrier search's minimum restarts (its rule's, `least.rule_for`)
PATH_CHOICES = ((3, 11, SEARCH), (3, 11, 3), (2, 11, 3), (1, 11, 3), (1, "adaptive", 3))  # (pairs, points, restarts)
ADAPTIVE_POINTS = 11  # an adaptive path is planned at its worst (6 points on a flat curve, 11 where it bends)
BOUNDED_POINTS = 3  # points a restart's walk is planned at beyond the first (it stops once it can lower no barrier)


def run_geometry(plan, probe, names: list, analyze, status, results: dict) -> dict:
    """The model analyzers `names` (`analyze(name)` runs one), each result put into `results` as it is
    found (an interrupted run keeps the steps finished); within a limited plan, each step's examples
    chosen from measured costs and recorded, a step that does not fit skipped with its reason."""
    analyzers = all_analyzers()
    # a limited plan: weights-only steps first (their cost does not depend on examples), then alignment (paths start
    # from it), CKA and paths (which share what is left), then any other model analyzer
    order = {"alignment": 1, "cka": 2, "paths": 3}
    for name in sorted(names, key=lambda name: order.get(name, 4) if analyzers[name].reads_data else 0) \
            if plan.limited else names:
        if plan.limited:
            if name in ("cka", "paths") and "geometry" not in plan.costs:
                _plan_geometry(plan, probe, [step for step in ("cka", "paths") if step in names])
            elif name == "paths" and "paths" not in plan.skipped and plan.seconds is not None:
                _refit_paths(plan, probe)  # what the steps before took, not what they were expected to take
            reason = plan.skipped.get(name) or (f"the budget was spent ({plan.spent():.0f} s of {plan.seconds:.0f} s) "
                                                "before this step" if plan.seconds is not None and plan.remaining() <= 0 else None)
            if reason:
                plan.skipped[name] = reason
                results[name] = {"status": "skipped", "description": analyzers[name].description, "reason": f"budget: {reason}"}
                continue
        began = time.perf_counter()
        with status(f"member geometry: {analyzers[name].description} …"):  # paths on a ResNet take minutes
            results.update(analyze(name))
        if plan.limited:
            plan.record(name, seconds=round(time.perf_counter() - began, 2), **_geometry_facts(name, results[name], probe))
    return results


def _geometry_facts(name, result, probe) -> dict:
    if result.get("status") != "ok":
        return {"status": result.get("status"), "reason": result.get("reason")}
    if name == "cka":
        return {"n": {split: found["n"] for split, found in result["splits"].items()},
                "half_width": {split: CI.half_width(found["mean"].get("interval")) for split, found in result["splits"].items()}}
    if name == "paths":
        return {"pairs": len(result["pairs"]), "points": [len(pair["t"]) for pair in result["pairs"]], "n": result["n"],
                "batchnorm_images": len(probe._training_pick()) if "recomputed" in result["batchnorm"] else 0,
                "train_sample": result.get("train_n", 0), "restarts": result["restarts"]["per_pair"],
                "half_width": CI.half_width(result["loss_barrier"].get("interval"))}
    return {}


def _timed_restart(probe) -> float:
    """Seconds of one restart of weight matching from a random start (members 0 and 1), or 0 where
    members are compared as trained."""
    try:
        groups, states, _ = probe.aligned()
    except Skip:
        return 0.0
    began = time.perf_counter()
    restart(states[0], states[1], groups, RESTARTS)
    return time.perf_counter() - began


def _timed_forward(probe) -> float:
    """Seconds per image of one member network's forward (the unit of a path's cost)."""
    network = probe.members()[0]
    split = probe.split("id", limit=FORWARD_PILOT)
    device = next(network.parameters()).device
    with torch.no_grad():
        x = probe.normalize(split.images.to(device))
        network(x[:2])  # a first call pays one-time costs
        began = time.perf_counter()
        network(x)
    return (time.perf_counter() - began) / len(split)


def _timed_point(probe, per_image: float) -> float:
    """Seconds a path point costs beyond its images' forwards: loading the interpolated weights,
    recomputing BatchNorm in training mode, the losses; one point timed on `PILOT` images each."""
    split = probe.split("id", limit=PILOT)
    states = [{key: value.detach() for key, value in network.state_dict().items()} for network in probe.members()[:2]]
    scratch = probe.ensemble.member_network(0)
    train = probe.batchnorm_images()
    has_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in scratch.modules())
    images = train[:len(split)] if has_norm and train is not None and len(train) >= 2 else None
    began = time.perf_counter()
    evaluate_point(scratch, states[0], states[1], 0.5, split, probe.normalize, images, split)
    spent = time.perf_counter() - began
    return max(spent - per_image * len(split) * (3 if images is not None else 2), 0.0)


def _cka_pilot(probe) -> tuple[float, float, float | None]:
    """(seconds per example and split of CKA's forward passes, seconds of its interval on `PILOT`
    examples, that interval's half-width)."""
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
    width = CI.half_width(cka_interval(found["kept"], len(split), "id", None))
    return forward, time.perf_counter() - began, width


def cka_seconds(n: float, costs: dict, splits: int) -> float:
    """CKA's cost on n examples per split: its forward passes, and its interval, whose Gram
    matrices grow as the square of the examples it keeps (at most `CKA_INTERVAL_EXAMPLES`)."""
    kept = min(n, CKA_INTERVAL_EXAMPLES)
    return splits * (n * costs.get("cka per example and split", 0.0)
                     + costs.get("cka interval on the pilot", 0.0) * (kept / PILOT) ** 2)


def paths_seconds(n: float, costs: dict, pairs: int, points, restarts: int = 1, images: float | None = None) -> float:
    """A path's cost: every point reads n test examples, n training-sample images and n images to
    recompute BatchNorm statistics (planned at its worst; `images`: those counts' sum where they differ),
    at one member's forward cost, and pays its fixed cost (weights, BatchNorm in training mode, losses)
    as timed on a pilot point; each pair walks one whole path, then each further restart of the barrier
    search costs a timed weight matching and a walk planned at `BOUNDED_POINTS` points (geometry/least.py)."""
    images = 3 * n if images is None else images
    per_point = images * costs.get("member forward per image", 0.0) + costs.get("path point fixed", 0.0)
    whole = ADAPTIVE_POINTS if points == "adaptive" else points
    search = (restarts - 1) * (costs.get("restart", 0.0) + BOUNDED_POINTS * per_point) if costs.get("restart") else 0.0
    return pairs * (whole * per_point + search)


def _largest(cost, limit: float, seconds: float) -> int:
    """The largest n ≤ limit whose cost(n) fits `seconds` (cost grows with n), by bisection."""
    if cost(limit) <= seconds:
        return int(limit)
    low, high = 0.0, float(limit)
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if cost(middle) <= seconds else (low, middle)
    return int(low)


def _plan_geometry(plan, probe, steps: list) -> None:
    """Examples (and path pairs and points) for CKA and paths from their measured costs."""
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
        forward, interval, width = _cka_pilot(probe)
        plan.costs.update({"cka per example and split": forward, "cka interval on the pilot": interval})
    if "paths" in steps:
        plan.costs["restart"] = _timed_restart(probe)
        plan.costs["member forward per image"] = _timed_forward(probe)
        plan.costs["path point fixed"] = _timed_point(probe, plan.costs["member forward per image"])
    seconds, limit = plan.remaining(), max(available.values())
    cka = (lambda n: cka_seconds(n, plan.costs, splits)) if "cka" in steps else (lambda n: 0.0)  # noqa: E731
    chosen, n = _path_choice(plan, probe, limit, seconds, cka) if "paths" in steps else (None, None)
    if "paths" in steps and n < min(GEOMETRY_FLOOR, limit):
        pairs, points, _ = chosen
        plan.skipped["paths"] = (f"{counted(pairs, 'pair')} × {points} points on {GEOMETRY_FLOOR} examples (with CKA) "
                                 f"would need {cka(GEOMETRY_FLOOR) + paths_seconds(GEOMETRY_FLOOR, plan.costs, *chosen):.0f} "
                                 f"s; {seconds:.0f} s were left")
        n = None
    if "cka" in steps:
        n_cka = n if n is not None else (limit if math.isinf(seconds) else _largest(cka, limit, seconds))
        if plan.precision is not None and width:
            n_cka = min(n_cka, max(PILOT, int(PILOT * (width / plan.precision) ** 2)))
        if n_cka < min(GEOMETRY_FLOOR, limit):
            plan.skipped["cka"] = (f"{GEOMETRY_FLOOR} examples per split would need {cka(GEOMETRY_FLOOR):.0f} s; "
                                   f"{seconds:.0f} s were left")
        probe.limits["cka"] = max(int(n_cka), 2)
    if "paths" in steps and "paths" not in plan.skipped:
        # a budget caps the barrier search where it was planned
        _use(probe, chosen, min(PATH_EXAMPLES, available["id"]) if math.isinf(seconds) else int(n), not math.isinf(seconds))
        if plan.precision is not None:
            probe.enough = lambda curves: (width := CI.half_width(barrier_interval(
                [(curves["t"], excess(curves["t"], curves["loss"]))], "id"))) is not None and width <= plan.precision


def _path_choice(plan, probe, limit: int, seconds: float, other=lambda n: 0.0) -> tuple[tuple, int]:
    """((pairs, points, restarts), n): the first of `PATH_CHOICES` whose paths, beside `other(n)`, read at
    least `PATH_EXAMPLES_FLOOR` of `limit` examples in `seconds` (else the last), and the n they read."""
    k = probe.ensemble.num_members or 2
    for pairs, points, restarts in PATH_CHOICES:
        chosen = (min(pairs, k - 1), points, rule_for(probe.detail).minimum if restarts == SEARCH else restarts)
        n = limit if math.isinf(seconds) else _largest(lambda n: other(n) + paths_seconds(n, plan.costs, *chosen), limit,
                                                        seconds)
        if n >= min(PATH_EXAMPLES_FLOOR, limit):
            break
    return chosen, n


def _use(probe, chosen: tuple, n: int, cap_restarts: bool = True) -> None:
    """The paths' pairs, points and examples (and, `cap_restarts`, the barrier search's restarts) for the probe."""
    probe.path_pairs, probe.path_points, restarts = chosen
    if cap_restarts:
        probe.limits["restarts"] = restarts
    probe.limits["paths"] = max(2, n)
    probe.limits["batchnorm"] = max(2, min(n, BATCHNORM_EXAMPLES))


def _refit_paths(plan, probe) -> None:
    """The paths' examples, pairs and points again, for the time actually left."""
    if "member forward per image" not in plan.costs or "paths" not in probe.limits:
        return
    seconds, planned = plan.remaining(), probe.limits["paths"]
    restarts = probe.limits.get("restarts", 1)
    if paths_seconds(planned, plan.costs, probe.path_pairs, probe.path_points, restarts) <= seconds:
        return
    chosen, n = _path_choice(plan, probe, planned, seconds)
    if n < min(GEOMETRY_FLOOR, planned):
        plan.skipped["paths"] = (f"{chosen[0]} pair × {chosen[1]} points on {GEOMETRY_FLOOR} examples would need "
                                 f"{paths_seconds(GEOMETRY_FLOOR, plan.costs, *chosen):.0f} s; {seconds:.0f} s were left")
        return
    _use(probe, chosen, n)


def estimate_full(plan, metrics: dict, geometry_examples, path_points=11, detail: bool = False) -> float:
    """Seconds the same diagnosis would take on every example (no budget), from the measured costs:
    predictions of every split, CKA on the examples it would keep, paths on the protocol's pairs,
    points and examples, the weights-only steps as they ran, the analyzers scaled to every example."""
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
        total += paths_seconds(n, plan.costs, min(PATH_PAIRS, k - 1), path_points, rule_for(detail).minimum,
                               images=n + 2 * BATCHNORM_EXAMPLES)
    total += sum(read[name]["seconds"] for name in ("alignment", "rank-structure") if name in read)
    plan.estimate = total
    return total
