"""Seeds needed, checked by simulation: at the count the verdict prints beside "not settled", new
seeds that vary as the observed ones did give an interval that clears the line in ≥ 75 % of
replicates (the count is chosen for 80 %), and at half that count in clearly fewer — so a count that
is too small or needlessly large fails. The intervals simulated are the verdict's own (stats.fieller
for a ratio of means over seeds, stats.t_interval for a gain), not the noncentral-t formula the
count comes from."""

import math

import numpy as np
import pytest
import torch

from ensdiag.seeds import stats
from ensdiag.seeds.verdict import _add_seeds_needed

REPLICATES = 2000  # the share's standard error ≈ 0.009: 0.80 and 0.75 lie 5 apart


def _constant_resamples(per_seed: list[dict]) -> list[dict]:
    """Every seed's values on every resample of the test examples, here the same on each: the test
    set adds no error the seeds share (the floor is 0), so the count is the seeds' alone."""
    return [{key: torch.full((50,), value, dtype=torch.float64) for key, value in values.items()} for values in per_seed]


def _observed(mean, covariance, seeds, rng):
    return rng.multivariate_normal(mean, covariance, size=seeds)


def _cleared(interval, line, below) -> bool:
    """The interval lies wholly on the estimate's side of the line (None: unbounded, not cleared)."""
    if interval is None or not all(math.isfinite(bound) for bound in interval):
        return False
    return interval[1] < line if below else interval[0] > line


def _ratio_clearing(pairs, seeds, line, below, rng) -> float:
    """The share of replicates of `seeds` new seeds, drawn from the observed pairs' mean and
    covariance, whose Fieller interval for the ratio of means clears `line`."""
    mean, covariance = pairs.mean(0), np.cov(pairs.T)
    hits = 0
    for _ in range(REPLICATES):
        drawn = rng.multivariate_normal(mean, covariance, size=seeds)
        hits += _cleared(stats.fieller(drawn[:, 0].tolist(), drawn[:, 1].tolist()), line, below)
    return hits / REPLICATES


@pytest.mark.parametrize("case", [
    # (question, numerator, denominator, mean of (numerator, denominator), their covariance, seed of the draw)
    ("nll", "mine_nll", "gain_nll", (0.012, 0.10), ((0.0004, 0.0001), (0.0001, 0.0003)), 0),  # a share near 12 %
    ("nll", "mine_nll", "gain_nll", (0.040, 0.10), ((0.0003, 0.0001), (0.0001, 0.0002)), 1),  # 40 %: 50 % nearer
    ("diversity", "method_kl", "reference_kl", (0.06, 0.10), ((0.0003, 0.0), (0.0, 0.00005)), 2),  # 0.6×
    pytest.param(("auroc", "mine_auroc", "gain_auroc", (0.002, 0.015), ((0.00002, 0.0), (0.0, 0.00001)), 3),
                 marks=pytest.mark.slow),  # 13 %, noisy: many seeds, many Fieller intervals to simulate
])
def test_at_the_printed_count_the_ratios_interval_clears_the_nearer_line(case):
    key, numerator, denominator, mean, covariance, seed = case
    rng = np.random.default_rng(seed)
    for attempt in range(50):  # three observed seeds that leave the question open
        pairs = _observed(mean, covariance, 3, rng)
        rho = pairs[:, 0].mean() / pairs[:, 1].mean()
        interval = stats.fieller(pairs[:, 0].tolist(), pairs[:, 1].tolist())
        if interval is not None and stats.settles(interval) == "unsettled" and 0.02 < rho < 0.95 and \
                min(abs(rho - stats.SINGLE_LIKE), abs(rho - stats.ENSEMBLE_LIKE)) > 0.05:
            break
    else:
        pytest.fail("no open question drawn")
    per_seed = [{numerator: a, denominator: b} for a, b in pairs.tolist()]
    entry = {key: {"answer": "unsettled", "value": rho}}
    _add_seeds_needed(entry, {key: rho}, per_seed, _constant_resamples(per_seed))
    needed = entry[key]["seeds_needed"]
    assert needed["why"] is None and 3 < needed["seeds"] <= stats.MOST_SEEDS, needed
    line = min((stats.SINGLE_LIKE, stats.ENSEMBLE_LIKE), key=lambda threshold: abs(rho - threshold))
    below = rho < line
    at_count = _ratio_clearing(pairs, needed["seeds"], line, below, rng)
    assert at_count >= 0.75, (needed, at_count)
    half = max(2, needed["seeds"] // 2)
    if half < needed["seeds"] - 1:  # not needlessly many: half as many seeds clear it clearly less often
        assert _ratio_clearing(pairs, half, line, below, rng) < 0.75, needed


@pytest.mark.parametrize("spread, gain", [(0.05, 0.03), (0.02, 0.004), (0.3, 0.2)])
def test_at_the_printed_count_a_noisy_gain_is_told_from_zero(spread, gain):
    """A share not given because the Deep Ensemble's own gain is within noise: the count of seeds at
    which the gain's t-interval over seeds excludes 0."""
    rng = np.random.default_rng(7)
    for attempt in range(200):
        gains = rng.normal(gain, spread, 3)
        if stats.t_interval(gains.tolist())[0] < 0 < gains.mean():
            break
    per_seed = [{"gain_nll": value} for value in gains.tolist()]
    entry = {"nll": {"answer": None, "value": None, "undetermined": "noise"}}
    _add_seeds_needed(entry, {"nll": None, "gain_nll": gains.mean()}, per_seed, _constant_resamples(per_seed))
    needed = entry["nll"]["seeds_needed"]
    assert needed["why"] is None and needed["seeds"] > 3, needed

    def clearing(seeds):
        drawn = rng.normal(gains.mean(), gains.std(ddof=1), size=(REPLICATES, seeds))
        half = stats.t_quantile(seeds) * drawn.std(1, ddof=1) / math.sqrt(seeds)
        return float((drawn.mean(1) - half > 0).mean())
    assert clearing(needed["seeds"]) >= 0.75
    assert clearing(needed["seeds"] - 1) < 0.8 + 0.02  # the smallest such count (to the simulation's error)
    if needed["seeds"] // 2 < needed["seeds"] - 1:
        assert clearing(max(2, needed["seeds"] // 2)) < 0.75


def test_the_test_sets_shared_error_raises_the_count_or_rules_seeds_out():
    """The floor: error the seeds share does not shrink with seeds. A floor below the distance asks
    for more seeds (the seeds' part must fit in √(d² − floor²)); one at or above it, for a larger test set."""
    values = [0.10, 0.16, 0.04]
    plain = stats.seeds_needed(values, 0.05)["seeds"]
    assert stats.seeds_needed(values, 0.05, floor=0.03)["seeds"] > plain > 3
    # with floor f the count is the one at distance √(d² − f²) without it
    assert stats.seeds_needed(values, 0.05, floor=0.03)["seeds"] == stats.seeds_needed(values, 0.04)["seeds"]
    assert stats.seeds_needed(values, 0.05, floor=0.05) == {"seeds": None, "why": "test set"}
    assert stats.seeds_needed([0.1], 0.2) == {"seeds": None, "why": "one seed"}
    assert stats.seeds_needed([0.1, 0.1], 0.2) == {"seeds": None, "why": "no spread"}
    assert stats.seeds_needed([0.0, 1.0, -1.0], 1e-3)["why"] == "too many"


def test_the_shared_floor_is_the_between_seed_covariance_of_the_resamples():
    """Against numpy: 1.96·√(mean covariance between two different seeds' resampled values)."""
    from ensdiag.seeds.verdict import _shared_floor
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.05, 400)  # the test set's error, common to every seed
    resampled = [shared + rng.normal(0, 0.02, 400) for _ in range(4)]
    covariance = np.cov(np.stack(resampled))
    expected = 1.959963984540054 * math.sqrt((covariance.sum() - np.trace(covariance)) / 12)
    assert _shared_floor([torch.tensor(v) for v in resampled]) == pytest.approx(expected, rel=1e-9)
    assert _shared_floor([torch.tensor(resampled[0])]) == pytest.approx(1.959963984540054 * resampled[0].std(ddof=1))


def test_the_counts_range_holds_the_count_of_the_true_spread_as_often_as_sigmas_interval_holds_sigma():
    """"≈ 54 seeds (15 to 2,100)": three seeds say little about σ, so the count comes with the counts at the
    ends of σ's 95 % interval. Drawn from a known σ, the range holds the count that σ itself gives in about 95 %
    of replicates (the count grows with σ, so it covers as σ's interval does), and the range is wide: from 3
    seeds its ends lie a factor of ~100 apart in σ²."""
    rng = np.random.default_rng(11)
    distance, sigma = 0.1, 0.15
    true = stats.seeds_needed([-sigma, 0.0, sigma], distance)  # s = σ exactly: the count σ itself gives
    truth = true["seeds"]
    assert truth is not None and true["range"][0] < truth and (true["range"][1] or math.inf) > 10 * truth
    held = 0
    for _ in range(400):
        found = stats.seeds_needed(rng.normal(0.0, sigma, 3).tolist(), distance)
        low, high = found["range"]
        held += (low or stats.MOST_SEEDS + 1) <= truth <= (high or math.inf)
    assert 0.92 <= held / 400 <= 0.98
