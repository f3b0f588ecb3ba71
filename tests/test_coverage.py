"""Honest coverage: a subsample's 95 % interval holds the full test set's value in about 95 % of draws.

A full test set of N examples, many random subsamples of m of them without replacement, and
for each the interval ensdiag reports for the whole split's value (`full_split`: the bootstrap
over the m examples with the finite-population factor √((N − m)/(N − 1)) applied, since m of
N vary less about the whole than m new examples about the population). The target is the
full-data value computed by the analyzer itself. With D draws the observed coverage of a true
95 % interval has a standard error of √(0.95·0.05/D); the tolerance is three of them, so a
method that covers 85 % (a biased interval) or 99.5 % (one without the factor) fails.
"""

import math

import pytest
import torch

from ensdiag.stats import bootstrap as B
from ensdiag.stats import constructions as CI
from ensdiag.analysis import all_analyzers, analyze_predictions

pytestmark = pytest.mark.slow  # coverage simulations: the slow tier

DRAWS = 300
TOLERANCE = 3 * math.sqrt(0.95 * 0.05 / DRAWS)  # ≈ 0.038


def _ensemble_outputs(n, k=4, classes=5, temperature=1.4, seed=0):
    """Member logits of an over-confident toy ensemble and labels drawn from a softer truth."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, classes, generator=g) * 2.5
    logits = base[None] + 0.8 * torch.randn(k, n, classes, generator=g)
    labels = torch.multinomial(torch.softmax(base / temperature, -1), 1, generator=g).squeeze(1)
    return logits, labels


def _interval(analyzer, path, predictions, full):
    """ensdiag's interval entry for one column, through the analyzer's registered resampler."""
    from ensdiag.core.intervals import _entry, _vectorised
    found = all_analyzers()[analyzer]
    result = {"status": "ok", **found(predictions)}
    reads = tuple(sorted({"id", "ood"} & set(predictions))) if analyzer == "ood" else ("id",)
    resampled = _vectorised(found, result, predictions, None, [(path, reads)], B.RESAMPLES, B.Draws())
    return _entry(result, path, reads, predictions, resampled[path], full)


def _subsamples(n, m, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(DRAWS):
        yield torch.randperm(n, generator=g)[:m].sort().values


def _coverage(entries, target):
    return sum(entry["full_split"]["low"] <= target <= entry["full_split"]["high"] for entry in entries) / len(entries)


PREDICTION_COLUMNS = {"NLL": ("calibration", ("splits", "id", "nll", "value")),
                      "ECE": ("calibration", ("splits", "id", "ece", "value")),
                      "disagreement": ("disagreement", ("splits", "id", "mean", "value"))}


@pytest.mark.parametrize("name", sorted(PREDICTION_COLUMNS))
def test_a_subsample_interval_covers_the_full_test_set_value(name):
    analyzer, path = PREDICTION_COLUMNS[name]
    n, m = 2000, 1200
    logits, labels = _ensemble_outputs(n)
    full = analyze_predictions({"id": {"logits": logits, "labels": labels}}, only=[analyzer])["analyzers"][analyzer]
    target = full
    for key in path:
        target = target[key]
    entries = [_interval(analyzer, path, {"id": {"logits": logits[:, pick], "labels": labels[pick]}}, {"id": n})
               for pick in _subsamples(n, m)]
    coverage = _coverage(entries, target)
    assert abs(coverage - 0.95) <= TOLERANCE, (name, coverage)


def test_a_stratified_auroc_interval_covers_the_full_test_set_value():
    n, m = 1500, 900
    logits, labels = _ensemble_outputs(n)
    ood_logits = _ensemble_outputs(n, seed=5)[0] * 0.5  # less confident: OOD scores higher on average
    whole = {"id": {"logits": logits, "labels": labels}, "ood": {"logits": ood_logits, "labels": None}}
    target = analyze_predictions(whole, only=["ood"])["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"]
    assert 0.6 < target < 0.9  # neither trivial nor hopeless
    path = ("scores", "msp", "auroc", "value")
    entries = [_interval("ood", path, {"id": {"logits": logits[:, a], "labels": labels[a]},
                                       "ood": {"logits": ood_logits[:, b], "labels": None}}, {"id": n, "ood": n})
               for a, b in zip(_subsamples(n, m, seed=2), _subsamples(n, m, seed=3))]
    assert entries[0]["strata"] == {"id": m, "ood": m}
    assert abs(_coverage(entries, target) - 0.95) <= TOLERANCE


def _separated_scores(n, shift, seed):
    """OOD scores N(shift, 1) against ID scores N(0, 1): AUROC Φ(shift/√2), and the fraction of OOD at
    or below ID's 95th percentile (FPR95 OOD→ID) Φ(z₀.₉₅ − shift), both known in closed form."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64), shift + torch.randn(n, generator=g, dtype=torch.float64)


def _large_sample_truth(metric, shift):
    from ensdiag.stats.weighted import ood_metrics
    score_id, score_ood = _separated_scores(1_000_000, shift, seed=10**6)
    return float(ood_metrics(score_id, score_ood, only=(metric,))[metric])


@pytest.mark.parametrize("metric, kind, shift, truth", [
    ("auroc", "logit", 4.05, lambda normal, shift: normal.cdf(shift / math.sqrt(2))),
    ("aupr_out", "logit-debiased", 4.3, lambda normal, shift: _large_sample_truth("aupr_out", shift)),
    ("fpr95_ood_as_id", "binomial", 4.5, lambda normal, shift: normal.cdf(normal.inv_cdf(0.95) - shift))])
def test_near_separated_scores_get_an_interval_that_covers_where_the_percentiles_do_not(metric, kind, shift, truth):
    """AUROC and AUPR near 1 (0.998) and FPR95 near 0 (0.002) at n = 200 per split: the percentile
    interval sits beside the population's value in far more than 5 % of test sets (it rests on the
    handful of examples where the splits overlap); the construction the column declares covers. (AUPR
    has no closed form: its truth is a million-example sample's.)"""
    from statistics import NormalDist

    from ensdiag.stats.weighted import ood_metrics
    n, draws = 200, 200
    target = truth(NormalDist(), shift)
    covered = {"percentile": 0, kind: 0}
    for draw in range(draws):
        score_id, score_ood = _separated_scores(n, shift, seed=draw)
        counts = {split: B.Draws().counts(split, n, 0, B.RESAMPLES) for split in ("id", "ood")}
        value = float(ood_metrics(score_id, score_ood, only=(metric,))[metric])
        resampled = ood_metrics(score_id, score_ood, counts["id"], counts["ood"], only=(metric,))[metric]
        for construction in covered:
            entry = CI.interval(value, resampled, 2 * n, construction, strata={"id": n, "ood": n}, trials=n)
            covered[construction] += entry["low"] <= target <= entry["high"]
            if construction == kind:
                assert entry["low"] <= value <= entry["high"]
    assert covered[kind] / draws >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / draws)
    assert covered["percentile"] / draws < 0.90  # the reason for the construction: plain percentiles miss


def test_the_ece_interval_covers_a_well_calibrated_models_population_value_where_percentiles_never_do():
    """ECE folds noise into an upward bias as large as a small ECE itself: the percentile interval
    of 1,500 examples misses the population's ECE almost always, ensdiag's ray inversion does not."""
    from ensdiag.core.intervals import _entry, _vectorised
    population, m, draws = 60_000, 1500, 150
    logits, labels = _ensemble_outputs(population, temperature=1.0, seed=7)
    calibration = all_analyzers()["calibration"]
    target = calibration({"id": {"logits": logits, "labels": labels}})["splits"]["id"]["ece"]["value"]
    assert target < 0.03  # well calibrated: the regime where the bias dominates
    g = torch.Generator().manual_seed(11)
    path = ("splits", "id", "ece", "value")
    hits = percentile_hits = 0
    for _ in range(draws):
        pick = torch.randint(0, population, (m,), generator=g)
        predictions = {"id": {"logits": logits[:, pick], "labels": labels[pick]}}
        result = {"status": "ok", **calibration(predictions)}
        resampled = _vectorised(calibration, result, predictions, None, [(path, ("id",))], B.RESAMPLES, B.Draws())[path]
        entry = _entry(result, path, ("id",), predictions, resampled, {})
        hits += entry["low"] <= target <= entry["high"]
        folded = resampled[1]
        values = folded.combine(folded.means[None], folded.mass)[0]
        low, high = torch.quantile(values, torch.tensor([0.025, 0.975], dtype=values.dtype)).tolist()
        percentile_hits += low <= target <= high
    assert abs(hits / draws - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / draws), hits / draws
    assert percentile_hits / draws < 0.5, percentile_hits / draws


def _features(n, seed=0):
    """Two small untrained MLP members' representations of n inputs: {layer: [x0, x1]}."""
    import ensdiag
    from ensdiag.geometry.representations import layer_cka
    torch.manual_seed(seed)
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 4, (1, 4, 4))
    networks = [model.member_network(i).eval() for i in range(2)]
    images = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed + 1))
    return layer_cka(networks, images, lambda x: x, retain=n)["kept"]


def test_the_cka_interval_covers_the_full_test_set_value():
    from ensdiag.geometry.cka import Moments
    from ensdiag.geometry.resampled import cka_interval
    n, m = 300, 180
    features = _features(n)

    def mean_cka(pick):
        values = []
        for members in features.values():
            moments = Moments()
            moments.add([x[pick] for x in members])
            values.append(moments.cka()[0][0, 1].item())
        return sum(values) / len(values)

    target = mean_cka(torch.arange(n))
    entries = [cka_interval({layer: [x[pick] for x in members] for layer, members in features.items()}, m, "id",
                            mean_cka(pick), of=n) for pick in _subsamples(n, m, seed=4)]
    assert abs(_coverage(entries, target) - 0.95) <= TOLERANCE


def _trained_member(seed=0):
    """A small MLP fitted for a few hundred steps on a toy problem, and its data."""
    import ensdiag
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3000, 1, 4, 4, generator=g)
    y = (x.flatten(1)[:, :3].sum(1) > 0).long() + (x.flatten(1)[:, 3] > 0.5).long()
    torch.manual_seed(seed)
    network = ensdiag.build_model("mlp", "single", 1, 3, (1, 4, 4)).member_network(0)  # 16 → 64 → 32 → 16 → 3
    optimizer = torch.optim.Adam(network.parameters(), lr=0.02)
    for step in range(300):
        batch = torch.randint(0, 2000, (128,), generator=g)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(network(x[batch])[0], y[batch]).backward()  # a member returns [1, B, C]
        optimizer.step()
    return network.eval(), x[2000:], y[2000:]


def test_the_barrier_interval_covers_the_full_test_set_value():
    """The path between a trained network and its own copy with permuted hidden units (the same
    function, unaligned weights) rises well above its ends: a barrier to measure."""
    from ensdiag.data.registry import Split
    from ensdiag.geometry.paths import barrier, excess, path
    from ensdiag.geometry.resampled import barrier_interval
    network, x, y = _trained_member()
    state = {key: value.detach().clone() for key, value in network.state_dict().items()}
    permuted = dict(state)
    hidden = [key for key in state if key.endswith("weight") and state[key].dim() == 2]
    order = torch.randperm(state[hidden[0]].shape[0], generator=torch.Generator().manual_seed(3))
    first, second = hidden[0], hidden[1]
    permuted[first] = state[first][order]
    permuted[first.replace("weight", "bias")] = state[first.replace("weight", "bias")][order]
    permuted[second] = state[second][:, order]
    found = path(network, state, permuted, Split(x, y), lambda t: t, points=11)
    n, m = len(y), 600
    values = excess(found["t"], found["examples"]["loss"])
    target = barrier(found["t"], found["loss"])
    assert target > 0.1 and abs(values.mean(1).max().item() - target) < 1e-9
    entries = [barrier_interval([(found["t"], values[:, pick])], "id", of=n) for pick in _subsamples(n, m, seed=6)]
    assert abs(_coverage(entries, target) - 0.95) <= TOLERANCE
