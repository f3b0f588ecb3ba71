"""The least barrier over weight matching's restarts (geometry/least.py) against an independent
weight matching written here: SciPy's linear assignment, NumPy's random generator, this file's own
interpolation and cross-entropy, on a Deep Ensemble pair trained by ensdiag on the embedded digits."""

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from ensdiag.analysis import analyze_model
from ensdiag.analysis.geometry import ModelProbe
from ensdiag.config import preset_config
from ensdiag.data import get_dataset
from ensdiag.data.batching import Normalize
from ensdiag.data.preset import holdout
from ensdiag.geometry.least import FULL, MIN_RESTARTS, QUICK, Rule, least_over_restarts, rule_for
from ensdiag.nn import build_model
from ensdiag.train import FitData, fit

INDEPENDENT_RESTARTS = 24


@pytest.fixture(scope="module")
def digits_pair(tmp_path_factory):
    """(model, probe, test split, normalize): two Deep Ensemble members trained by ensdiag on digits
    (its preset's optimiser, 20 epochs, no early stopping), probed as `ensdiag diversity` probes
    them, with intervals."""
    config = preset_config("digits", methods=["deep-ensemble"], members=2, epochs=20, early_stopping=False)
    train, test = get_dataset("digits").load(split="train"), get_dataset("digits").load(split="test")
    kept, held = holdout(len(train), config.val_fraction, 42)
    normalize = Normalize(config.mean, config.std)
    torch.manual_seed(42)
    model = build_model("mlp", "deep-ensemble", 2, 10, config.input_shape)
    data = FitData(train.images[kept], train.labels[kept], train.images[held], train.labels[held], normalize)
    fit(model, config, data, 42, tmp_path_factory.mktemp("pair") / "state.pt", "cpu")
    model.eval()
    probe = ModelProbe(model, {"id": test}, normalize, train.images[kept], train_labels=train.labels[kept], detail=True)
    return model, probe, test, normalize


# ------------------------------------------------------------------ the independent implementation

def _layers(model, member) -> list[tuple[np.ndarray, np.ndarray]]:
    state = model.member_state_dict(member)
    names = sorted({key.rsplit(".", 1)[0] for key in state if key.startswith("hidden.")}) + ["head"]
    return [(state[f"{name}.weight"].detach().double().numpy(), state[f"{name}.bias"].detach().double().numpy()) for name in names]


def _match(mine, theirs, rng) -> list:
    """Weight matching from a random start: each hidden layer's units permuted to maximise the summed
    inner products of every weight and bias they touch, one layer at a time in a random order."""
    perms = [rng.permutation(len(bias)) for _, bias in theirs[:-1]]
    for _ in range(200):
        improved = False
        for layer in rng.permutation(len(perms)):
            (w_a, b_a), (w_b, b_b) = mine[layer], theirs[layer]
            into = perms[layer - 1] if layer else np.arange(w_b.shape[1])
            after = perms[layer + 1] if layer + 1 < len(perms) else np.arange(len(theirs[layer + 1][1]))
            score = w_a @ w_b[:, into].T + np.outer(b_a, b_b) + mine[layer + 1][0].T @ theirs[layer + 1][0][after, :]
            _, best = linear_sum_assignment(score, maximize=True)
            rows = np.arange(len(best))
            now = score[rows, perms[layer]].sum()
            if score[rows, best].sum() > now + 1e-12 * abs(now):
                perms[layer], improved = best, True
        if not improved:
            break
    out, into = [], np.arange(theirs[0][0].shape[1])
    for layer, (weight, bias) in enumerate(theirs):
        order = perms[layer] if layer < len(perms) else np.arange(len(bias))
        out.append((weight[order][:, into], bias[order]))
        into = order
    return out


def _loss(layers, x, y) -> float:
    h = x
    for weight, bias in layers[:-1]:
        h = np.maximum(h @ weight.T + bias, 0.0)
    logits = h @ layers[-1][0].T + layers[-1][1]
    top = logits.max(1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    return float((log_sum - logits[np.arange(len(y)), y]).mean())


def _barrier(mine, theirs, x, y) -> float:
    ts = np.linspace(0, 1, 11)
    losses = [_loss([((1 - t) * wa + t * wb, (1 - t) * ba + t * bb) for (wa, ba), (wb, bb) in zip(mine, theirs)], x, y)
              for t in ts]
    return max(loss - ((1 - t) * losses[0] + t * losses[-1]) for t, loss in zip(ts, losses))


def _independent_barriers(model, test, normalize, restarts=INDEPENDENT_RESTARTS) -> list[float]:
    x = normalize(test.images).flatten(1).double().numpy()
    y = test.labels.numpy()
    mine, theirs = _layers(model, 0), _layers(model, 1)
    return [_barrier(mine, _match(mine, theirs, np.random.default_rng(1000 + restart)), x, y) for restart in range(restarts)]


# ------------------------------------------------------------------ the tests

def test_no_independent_restart_finds_a_barrier_below_the_printed_interval(digits_pair):
    """24 restarts of an independent weight matching (random starts and orders, its own seeds) find no
    test-loss barrier below ensdiag's least by more than its printed interval reaches; the independent
    losses at the ends are ensdiag's (the same network, read two ways)."""
    model, probe, test, normalize = digits_pair
    paths = analyze_model(probe, only=["alignment", "paths"])["paths"]
    least, interval = paths["loss_barrier"]["value"], paths["loss_barrier"]["interval"]
    assert "restarts of weight matching" in interval["method"]  # the interval's definition names the restarts
    found = _independent_barriers(model, test, normalize)
    x = normalize(test.images).flatten(1).double().numpy()
    assert _loss(_layers(model, 0), x, test.labels.numpy()) == pytest.approx(paths["pairs"][0]["loss"][0], abs=1e-5)
    assert interval["low"] <= least <= interval["high"]
    assert min(found) >= interval["low"] - 1e-9, (min(found), least, interval)
    pair = paths["pairs"][0]
    assert pair["restarts_run"] >= MIN_RESTARTS and pair["loss_barrier"] == least
    assert (paths["restarts"]["minimum"], paths["restarts"]["patience"], paths["restarts"]["limit"]) == tuple(FULL)
    assert f"until {FULL.patience} restarts in a row lowered no barrier, at least {FULL.minimum}" in paths["restarts"]["rule"]
    assert pair["loss_barrier"] == min(r["loss_barrier"] for r in pair["restarts"] if r["complete"])


# ------------------------------------------------------------------ the stop rule, by hand

def _fake(barriers_of_seed, alignment_of_seed=lambda seed: seed):
    """A search over made-up alignments: seed -> its alignment's key, key -> its barriers; a walk is
    whole unless it can stop, and then reports a made-up lower bound (half way there)."""
    walked = []

    def alignment_of(seed):
        key = alignment_of_seed(seed)
        return key, key

    def evaluate(end, least):
        walked.append(end)
        value = barriers_of_seed(end)
        if least is not None and value >= least["loss_barrier"]:
            return {}, {"loss_barrier": (value + least["loss_barrier"]) / 2}, False
        return {}, {"loss_barrier": value}, True
    return alignment_of, evaluate, walked


def test_restarting_stops_after_patience_restarts_without_a_new_least():
    values = {0: 0.5, 1: 0.4, 20: 0.1, 25: 0.3}
    alignment_of, evaluate, _ = _fake(lambda seed: values.get(seed, 0.45 + seed / 1000))
    found = least_over_restarts(alignment_of, evaluate, ["loss_barrier"], limit=64, patience=12, minimum=24)
    assert found["least"] == {"loss_barrier": 0.1} and found["run"] == 20 + 12 + 1  # seeds 21..32 lowered nothing
    assert found["stopped"] == "12 restarts in a row lowered no barrier"
    assert [entry["complete"] for entry in found["alignments"]][:3] == [True, True, False]
    early = least_over_restarts(alignment_of, evaluate, ["loss_barrier"], limit=64, patience=12, minimum=3)
    assert early["run"] == 1 + 12 + 1 and early["least"] == {"loss_barrier": 0.4}  # without the minimum: 0.1 missed
    capped = least_over_restarts(alignment_of, evaluate, ["loss_barrier"], limit=20, patience=12, minimum=24)
    assert capped["run"] == 20 and capped["stopped"] == "the cap of 20 restarts"


def test_the_longer_search_goes_with_the_interval_and_a_budget_caps_either():
    assert rule_for(detail=True) == FULL and rule_for(detail=False) == QUICK
    assert QUICK.minimum < FULL.minimum and QUICK.limit < FULL.limit and QUICK.patience < FULL.patience
    assert FULL.capped(None) == FULL and FULL.capped(100) == FULL
    assert FULL.capped(3) == Rule(minimum=3, patience=FULL.patience, limit=3)
    assert QUICK.capped(10) == Rule(minimum=QUICK.minimum, patience=QUICK.patience, limit=10)


def test_a_restart_reaching_a_known_alignment_counts_but_is_not_walked_again():
    alignment_of, evaluate, walked = _fake(lambda key: 0.3 - 0.1 * key, alignment_of_seed=lambda seed: seed % 3)
    found = least_over_restarts(alignment_of, evaluate, ["loss_barrier"], limit=30, patience=5, minimum=10)
    assert walked == [0, 1, 2] and found["run"] == 10
    assert [entry["seeds"] for entry in found["alignments"]] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert found["least"]["loss_barrier"] == pytest.approx(0.1)


def test_a_bounded_walk_is_the_whole_path_until_it_may_stop():
    """Without a stop a bounded walk evaluates the grid of a whole walk, with its ends shared, and
    reads the same curve; with one it stops as soon as its barriers so far reach the least."""
    from ensdiag.data.registry import Split
    from ensdiag.geometry.paths import barriers_of, bounded_walk, path
    generator = torch.Generator().manual_seed(0)
    test = Split(torch.rand(40, 1, 4, 4, generator=generator), torch.randint(0, 3, (40,), generator=generator))
    train = Split(torch.rand(30, 1, 4, 4, generator=generator), torch.randint(0, 3, (30,), generator=generator))
    ends = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        ends.append(build_model("mlp", "single", 1, 3, (1, 4, 4)).member_network(0).state_dict())
    scratch = build_model("mlp", "single", 1, 3, (1, 4, 4)).member_network(0)
    stopped_at = []
    for points in (11, 6, "adaptive"):
        whole = path(scratch, ends[0], ends[1], test, lambda x: x, None, points, train)
        shared = {t: whole["points"][t] for t in (0.0, 1.0)}
        again, complete = bounded_walk(scratch, ends[0], ends[1], shared, test, lambda x: x, None, points, train)
        assert complete and again["t"] == whole["t"]
        for key in ("loss", "accuracy", "train_loss"):
            assert again[key] == pytest.approx(whole[key], abs=1e-12)
        full = barriers_of(whole)
        least = {key: value / 2 for key, value in full.items()}  # every barrier already above this: stop at once
        part, complete = bounded_walk(scratch, ends[0], ends[1], shared, test, lambda x: x, None, points, train,
                                      stop=lambda found: all(found[key] >= least[key] for key in least))
        bounds = barriers_of(part)
        assert all(bounds[key] <= full[key] + 1e-12 for key in least)  # lower bounds of the whole walk's barriers
        assert not complete and all(bounds[key] >= least[key] for key in least) and len(part["t"]) < len(whole["t"])
        stopped_at.append(len(part["t"]))
    assert stopped_at[0] == 3  # the ends and t = ½: the barriers' peak is there


def test_the_interval_of_one_alignment_is_the_example_level_one_and_its_value_the_least():
    """Restarts that all reach one alignment change nothing: the interval is the example-level one.
    With several, the estimate is the mean over pairs of the least (over alignments) of the largest
    mean excess, computed here by hand, and resamples draw each pair's restarts."""
    from ensdiag.geometry.resampled import _restart_draws, barrier_interval, least_barrier_interval
    generator = torch.Generator().manual_seed(1)
    n = 300
    curves = [0.05 * torch.sin(torch.linspace(0, 3.1416, 7, dtype=torch.float64))[:, None]
              * (1 + torch.rand(7, n, generator=generator, dtype=torch.float64))
              for _ in range(5)]
    one = barrier_interval([([0.0] * 7, curves[0])], "id")
    same = least_barrier_interval([[(curves[0], 24)]], "id")
    assert (same["low"], same["high"]) == (one["low"], one["high"]) and "restarts" not in same["method"]
    pairs = [[(curves[0], 10), (curves[1], 14)], [(curves[2], 3), (curves[3][2:5], 20), (curves[4], 1)]]
    entry = least_barrier_interval(pairs, "id")
    by_hand = sum(min(max(values.mean(1).max().item(), 0.0) for values, _ in pair) for pair in pairs) / len(pairs)
    assert entry["low"] <= by_hand <= entry["high"] and "(24/24)" in entry["method"]
    draws = _restart_draws(pairs, 3, 50)
    assert torch.equal(draws.sum(2), torch.tensor([[24.0, 24.0]]).expand(50, 2))
    assert (draws[:, 0, 2] == 0).all() and (draws[:, 1] > 0).any(0).all()
