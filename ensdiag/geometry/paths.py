"""Loss and accuracy along the straight line between two members' weights.

θ(t) = (1 − t)·θ_a + t·θ_b for t on an even grid from 0 to 1 (θ_b aligned to θ_a first where
members are independent networks). Interpolated BatchNorm statistics describe no network, so
at every point, the ends included, they are recomputed on training images (the average of
near-equal batches' statistics in train mode, no gradient) before the network is evaluated; a network
without BatchNorm is evaluated as interpolated.

The barrier is the largest rise above the straight line between the ends:
max_t [L(θ(t)) − ((1 − t)·L(θ_a) + t·L(θ_b))], and the same with accuracy falling below its
line (the error barrier of Frankle et al. 2020). On the training loss (Ainsworth et al. 2023),
0 says the members lie in one linearly connected basin. On the *test* loss it says less:
averaging over-fitted members' weights tempers their over-confident logits, so the test loss
can dip below its line while the error rises, and a test-loss barrier of 0 is no evidence of
connectivity.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


GEOMETRY_SEED = 0  # the training sample's and the null baseline's draws: fixed, the same on every path


def seeded_sample(n: int, size: int) -> torch.Tensor:
    """The indices [min(n, size)] of a sample of n training examples, ascending: the first of an order drawn
    from `GEOMETRY_SEED` (a training split may be sorted by class), the same on every path."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(GEOMETRY_SEED))
    return order[:size].sort().values


def interpolate(state_a: dict, state_b: dict, t: float) -> dict:
    return {key: (1 - t) * value + t * state_b[key] if value.is_floating_point() else value
            for key, value in state_a.items()}


@torch.no_grad()
def recompute_batchnorm(network, images: torch.Tensor, normalize, batch_size: int = 500) -> bool:
    """Reset and re-estimate every BatchNorm's running statistics on `images`; False if it has none."""
    norms = [m for m in network.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return False
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches, not an exponential one
    network.train()
    device = next(network.parameters()).device
    try:  # near-equal batches: none of a single image (BatchNorm needs two), none weighted more than the rest
        for batch in torch.tensor_split(images, math.ceil(len(images) / batch_size)):
            network(normalize(batch.to(device)))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        network.eval()
    return True


@torch.no_grad()
def example_losses(network, images, labels, normalize, batch_size: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy [n], correct [n]) of a one-member network on each labelled image, float64 on the CPU."""
    network.eval()
    device = next(network.parameters()).device
    losses, correct = [], []
    for start in range(0, len(images), batch_size):
        logits = network(normalize(images[start:start + batch_size].to(device)))[0].double()
        y = labels[start:start + batch_size].to(device)
        losses.append(F.cross_entropy(logits, y, reduction="none").cpu())
        correct.append((logits.argmax(1) == y).double().cpu())
    return torch.cat(losses), torch.cat(correct)


ADAPTIVE = "adaptive"
FLAT_LOSS = 0.01  # nats: a second difference below this, on both sides of a skipped point, counts as flat
FLAT_ACCURACY = 0.005


def describe_points(points) -> str:
    if points == ADAPTIVE:
        return (f"adaptive: every other point of the 11-point grid, and a skipped point only where a second difference "
                f"next to it exceeds {FLAT_LOSS} nats of loss or {FLAT_ACCURACY:.1%} accuracy")
    return f"{points} evenly spaced points"


def evaluate_point(network, state_a, state_b, t, test, normalize, train_images, train) -> dict:
    """One point t of the path: `network` loaded with the interpolated weights, its BatchNorm
    statistics recomputed on `train_images`, the test (and training-sample) losses per example."""
    network.load_state_dict(interpolate(state_a, state_b, t))
    recomputed = recompute_batchnorm(network, train_images, normalize) if train_images is not None else False
    found = {"batchnorm_recomputed": recomputed}
    if recomputed:  # what a later chunk of test examples at this point needs besides the interpolated weights
        found["buffers"] = {key: value.detach().clone() for key, value in network.named_buffers()}
    for prefix, split in (("", test), ("train_", train)):
        if split is not None:
            losses, correct = example_losses(network, split.images, split.labels, normalize)
            found[f"{prefix}loss"], found[f"{prefix}accuracy"] = losses.mean().item(), correct.mean().item()
            found[f"{prefix}examples"] = (losses, correct)
    return found


def _grid(points) -> list[float]:
    return torch.linspace(0, 1, 11 if points == ADAPTIVE else points).tolist()  # adaptive: a subset of the 11-point grid


def always_evaluated(points) -> list[float]:
    """The points of the grid every walk evaluates, whatever its curve (adaptive: every other one)."""
    grid = _grid(points)
    return grid[::2] if points == ADAPTIVE else grid


def screen_order(points) -> list[float]:
    """The interior points every walk evaluates, nearest t = ½ first (ties: the smaller t): where a
    barrier usually peaks, so a walk that can stop early (`bounded_walk`) learns most first."""
    return sorted(always_evaluated(points)[1:-1], key=lambda t: (abs(t - 0.5), t))


def adaptive_midpoints(points, found: dict) -> list[float]:
    """The midpoints an adaptive grid adds to the points every walk evaluates (`found`: {t: point}),
    where the curve bends next to them; none for an even grid."""
    if points != ADAPTIVE:
        return []
    grid, chosen = _grid(points), always_evaluated(points)
    bends = set()
    for key, tolerance in (("loss", FLAT_LOSS), ("accuracy", FLAT_ACCURACY), ("train_loss", FLAT_LOSS),
                           ("train_accuracy", FLAT_ACCURACY)):
        if key in found[chosen[0]]:  # interior points whose second difference |v[i−1] − 2v[i] + v[i+1]| is above it
            v = [found[t][key] for t in chosen]
            bends |= {i for i in range(1, len(chosen) - 1) if abs(v[i - 1] - 2 * v[i] + v[i + 1]) > tolerance}
    # the midpoint of [chosen[i], chosen[i+1]]: wanted if either end bends
    return [grid[2 * i + 1] for i in range(len(chosen) - 1) if i in bends or i + 1 in bends]


def curve_of(found: dict, n: int) -> dict:
    """The curve over the points evaluated ({t: `evaluate_point`'s result}), as `path` returns it."""
    ts = sorted(found)
    keys = [key for key in ("loss", "accuracy", "train_loss", "train_accuracy") if key in found[ts[0]]]
    examples = {f"{prefix}{kind}": torch.stack([found[t][f"{prefix}examples"][index] for t in ts])
                for prefix in ("", "train_") if f"{prefix}examples" in found[ts[0]]
                for index, kind in enumerate(("loss", "accuracy"))}
    return {"t": ts, **{key: [found[t][key] for t in ts] for key in keys}, "n": n,
            "batchnorm_recomputed": found[ts[-1]]["batchnorm_recomputed"], "examples": examples}


def barriers_of(curve: dict) -> dict:
    """{"loss_barrier", "accuracy_barrier", "train_loss_barrier" (with a training sample)} of a curve;
    over fewer points than the grid, lower bounds of the grid's."""
    return {"loss_barrier": barrier(curve["t"], curve["loss"]),
            "accuracy_barrier": barrier(curve["t"], curve["accuracy"], higher_is_worse=False),
            **({"train_loss_barrier": barrier(curve["t"], curve["train_loss"])} if "train_loss" in curve else {})}


def path(network, state_a, state_b, test, normalize, train_images=None, points: int | str = 11, train=None,
         enough=None, first: int = 128) -> dict:
    """{"t", "loss", "accuracy", "batchnorm_recomputed"} along θ(t) on the labelled `test` split,
    and "train_loss", "train_accuracy" on the labelled `train` sample when one is given;
    "examples": the same per example, [points, n] tensors (for intervals; not JSON);
    "points": {t: each point as evaluated} (the ends another walk between the same functions can
    share, `bounded_walk`); `network` is a plain network of the members' shape whose weights are
    overwritten.

    `points`: an even grid of that many points, or "adaptive": t = 0, 0.2, …, 1 first, then each
    midpoint 0.1, 0.3, … only where the curve bends on either side of it (a second difference of
    the loss or accuracy, test or training, above `FLAT_LOSS` / `FLAT_ACCURACY`). A curve flat
    everywhere costs 6 points instead of 11; the barrier is read from the points evaluated.

    `enough(examples)`: the test examples are read in doubling chunks (`first` of them, then as
    many again, …), every point on each chunk, until `enough` of the per-example curves so far
    says True (a precision target); the points, and their BatchNorm statistics, are the first
    chunk's."""
    full, test = test, (test.subset(slice(0, first)) if enough is not None and len(test) > first else test)
    evaluate = lambda t: evaluate_point(network, state_a, state_b, t, test, normalize, train_images, train)  # noqa: E731
    found = {t: evaluate(t) for t in always_evaluated(points)}
    found.update({t: evaluate(t) for t in adaptive_midpoints(points, found)})
    ts = sorted(found)
    done = len(test)
    while done < len(full) and not enough({"loss": torch.stack([found[t]["examples"][0] for t in ts]), "t": ts}):
        chunk = full.subset(slice(done, 2 * done))
        for t in ts:  # every point on the next chunk, its BatchNorm statistics as recomputed
            point = found[t]
            network.load_state_dict({**interpolate(state_a, state_b, t), **point.get("buffers", {})})
            losses, correct = example_losses(network, chunk.images, chunk.labels, normalize)
            point["examples"] = tuple(torch.cat([old, new]) for old, new in zip(point["examples"], (losses, correct)))
            point["loss"], point["accuracy"] = point["examples"][0].mean().item(), point["examples"][1].mean().item()
        done += len(chunk)
    return {**curve_of(found, done), "points": found}


def bounded_walk(network, state_a, state_b, ends: dict, test, normalize, train_images=None, points: int | str = 11,
                 train=None, stop=None) -> tuple[dict, bool]:
    """(curve, complete): θ(t) walked point by point, `screen_order` first, then an adaptive grid's
    midpoints, on the same examples as the walk whose ends are given (`ends`: {0.0: point, 1.0:
    point}, another alignment's walk between the same two functions: an aligned member computes
    what the member does, up to float rounding). After each point, `stop(barriers_of(curve so
    far))` may end the walk: its barriers are then lower bounds of the whole grid's."""
    found = dict(ends)
    evaluate = lambda t: evaluate_point(network, state_a, state_b, t, test, normalize, train_images, train)  # noqa: E731
    def order():
        yield from screen_order(points)
        yield from adaptive_midpoints(points, found)  # (asked once the screen's points are in `found`)
    for t in order():
        found[t] = evaluate(t)
        if stop is not None and stop(barriers_of(curve_of(found, len(test)))):
            return curve_of(found, len(test)), False
    return curve_of(found, len(test)), True


def excess(ts, values: torch.Tensor, higher_is_worse: bool = True) -> torch.Tensor:
    """[points, n]: each example's rise above the line between the path's ends (below it, for
    accuracy): the barrier is the maximum over points of its mean over the examples."""
    t = torch.tensor(ts, dtype=torch.float64)[:, None]
    line = (1 - t) * values[:1] + t * values[-1:]
    return (values - line) * (1 if higher_is_worse else -1)


def barrier(ts, values, higher_is_worse: bool = True) -> float:
    """The largest excess of `values` over the line between its ends (below it, for accuracy)."""
    first, last = values[0], values[-1]
    excess = [(v - ((1 - t) * first + t * last)) * (1 if higher_is_worse else -1) for t, v in zip(ts, values)]
    return max(excess)
