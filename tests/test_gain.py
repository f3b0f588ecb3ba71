"""ensemble-gain and selective: the decompositions sum exactly, against dense float64 loops and
hand-worked cases; AURC against a brute force over every order of tied samples."""

import itertools
import math

import pytest
import torch

from ensdiag.analysis import analyze_predictions
from ensdiag.stats import metrics as M
from ensdiag.stats import weighted as W
from ensdiag.stats import ordered as O
from ensdiag.stats.examples import Examples
from ensdiag.stats.scaling import fit_temperature


def gain_of(logits, labels) -> dict:
    """Each term's mean over the examples: what the ensemble-gain analyzer reports."""
    split = Examples(logits, labels)
    gain = {key: float(W.mean(values)) for key, values in M.gain_terms(split).items()}
    return {**gain, "member_error": split.member_errors.mean(1).tolist()}


def aurc(confidence, errors) -> float:
    return float(O.risk_coverage_areas(confidence, errors)["aurc"])

from .cli import run_cli


def random_case(seed, k=4, n=30, c=5):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, c, generator=generator, dtype=torch.float64) * 2, torch.randint(0, c, (n,), generator=generator)


def dense_gain(logits, labels):
    """The same quantities by explicit loops over samples and members, in float64."""
    k, n, c = logits.shape
    out = {key: 0.0 for key in ("nll_gibbs", "nll_ensemble", "nll_geometric", "kl", "brier_gibbs", "brier_ensemble",
                                "spread")}
    for s in range(n):
        p = [torch.softmax(logits[i, s], 0) for i in range(k)]
        mean = sum(p) / k
        y = int(labels[s])
        geometric = torch.exp(sum(torch.log(q) for q in p) / k)
        geometric = geometric / geometric.sum()
        onehot = torch.nn.functional.one_hot(torch.tensor(y), c).double()
        out["nll_gibbs"] += sum(-math.log(q[y]) for q in p) / k / n
        out["nll_ensemble"] += -math.log(mean[y]) / n
        out["nll_geometric"] += -math.log(geometric[y]) / n
        out["kl"] += sum(float((geometric * (geometric / q).log()).sum()) for q in p) / k / n
        out["brier_gibbs"] += sum(float(((q - onehot) ** 2).sum()) for q in p) / k / n
        out["brier_ensemble"] += float(((mean - onehot) ** 2).sum()) / n
        out["spread"] += sum(float(((q - mean) ** 2).sum()) for q in p) / k / n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_gain_matches_a_dense_reimplementation_and_its_identities_hold(seed):
    logits, labels = random_case(seed)
    gain, dense = gain_of(logits, labels), dense_gain(logits, labels)
    for key, dense_key in [("nll_gibbs", "nll_gibbs"), ("nll_ensemble", "nll_ensemble"), ("nll_geometric", "nll_geometric"),
                           ("kl_diversity", "kl"), ("brier_gibbs", "brier_gibbs"), ("brier_ensemble", "brier_ensemble"),
                           ("brier_spread", "spread")]:
        assert gain[key] == pytest.approx(dense[dense_key], rel=1e-9, abs=1e-12), key
    # the decompositions sum exactly (to float tolerance)
    assert gain["brier_gibbs"] - gain["brier_ensemble"] == pytest.approx(gain["brier_spread"], abs=1e-12)
    assert gain["nll_gibbs"] - gain["nll_geometric"] == pytest.approx(gain["kl_diversity"], abs=1e-12)
    assert gain["nll_gibbs"] >= gain["nll_ensemble"] and gain["kl_diversity"] >= 0
    assert gain["nll_ensemble"] == pytest.approx(float(W.mean(Examples(logits, labels).nll)))


def test_gain_on_a_hand_worked_case():
    """Two members, two classes, one sample of class 0: p_1 = (0.8, 0.2), p_2 = (0.4, 0.6)."""
    logits = torch.tensor([[[math.log(0.8), math.log(0.2)]], [[math.log(0.4), math.log(0.6)]]], dtype=torch.float64)
    gain = gain_of(logits, torch.tensor([0]))
    assert gain["nll_gibbs"] == pytest.approx(-(math.log(0.8) + math.log(0.4)) / 2)
    assert gain["nll_ensemble"] == pytest.approx(-math.log(0.6))
    assert gain["brier_spread"] == pytest.approx(((0.2 ** 2) * 2 + (0.2 ** 2) * 2) / 2)  # p̄ = (0.6, 0.4)
    assert gain["error_gibbs"] == 0.5 and gain["error_ensemble"] == 0.0 and gain["member_error"] == [0.0, 1.0]
    z = math.sqrt(0.8 * 0.4) + math.sqrt(0.2 * 0.6)
    assert gain["kl_diversity"] == pytest.approx(-math.log(z))


def brute_force_aurc(confidence, errors):
    """The mean over every order of tied samples of the plain AURC."""
    groups = {}
    for c, e in zip(confidence.tolist(), errors.tolist()):
        groups.setdefault(c, []).append(e)
    ordered = [groups[c] for c in sorted(groups, reverse=True)]
    values = []
    for orders in itertools.product(*(itertools.permutations(g) for g in ordered)):
        sequence = [e for group in orders for e in group]
        values.append(sum(sum(sequence[:j]) / j for j in range(1, len(sequence) + 1)) / len(sequence))
    return sum(values) / len(values)


def test_aurc_by_hand_and_against_a_brute_force_over_tie_orders():
    confidence, errors = torch.tensor([0.9, 0.8, 0.7]), torch.tensor([False, True, False])
    assert M.risk_coverage(confidence, errors).tolist() == pytest.approx([0.0, 0.5, 1 / 3])
    assert aurc(confidence, errors) == pytest.approx((0 + 0.5 + 1 / 3) / 3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        confidence = torch.randint(0, 3, (7,), generator=generator).double() / 2  # many ties
        errors = torch.rand(7, generator=generator) < 0.4
        assert aurc(confidence, errors) == pytest.approx(brute_force_aurc(confidence, errors))
        assert M.risk_coverage(confidence, errors).mean().item() == pytest.approx(brute_force_aurc(confidence, errors))


def test_analyzers_report_gain_and_aurc_and_skip_a_single_member():
    logits, labels = random_case(7)
    result = analyze_predictions({"id": {"logits": logits.float(), "labels": labels}}, only=["ensemble-gain", "selective"])
    gain = result["analyzers"]["ensemble-gain"]["splits"]["id"]
    assert gain["brier_spread"]["value"] > 0 and len(gain["member_ece"]["value"]) == 4
    selective = result["analyzers"]["selective"]["splits"]["id"]
    assert 0 <= selective["aurc"]["value"] <= 1 and len(selective["member_aurc"]["value"]) == 4
    curve = selective["curve"]
    assert len(curve["member_risk"]) == 4 and all(len(r) == len(curve["coverage"]) == 30 for r in curve["member_risk"])
    # the last point of each member's curve is its error rate over all samples
    errors = (logits.float().argmax(-1) != labels).double().mean(1)
    assert [r[-1] for r in curve["member_risk"]] == pytest.approx(errors.tolist())
    single = analyze_predictions({"id": {"logits": logits[:1].float(), "labels": labels}}, only=["ensemble-gain"])
    assert single["analyzers"]["ensemble-gain"]["status"] == "skipped"


def test_report_shows_the_gain_table_and_aurc(finished_run, capsys):
    code, text, err = run_cli(capsys, "report", finished_run, "--format", "markdown", "--no-figures")
    assert code == 0, err
    assert "Brier spread" in text and "KL diversity" in text and "AURC ↓" in text


def calibration_case(margin, correct_of_four=3, members=2):
    """Binary logits (margin, 0) on every sample, `correct_of_four` of each 4 labelled 0: the
    NLL-optimal temperature is margin / logit(p), p = correct_of_four / 4."""
    z = torch.tensor([[margin, 0.0]] * 8, dtype=torch.float64)
    labels = torch.tensor(([0] * correct_of_four + [1] * (4 - correct_of_four)) * 2)
    return z.expand(members, -1, -1).float(), labels


def test_temperature_is_the_known_optimum_of_a_constructed_case():
    logits, labels = calibration_case(2.0)
    optimum = 2.0 / math.log(3)  # σ(2/T) = 3/4
    assert fit_temperature(Examples(logits, None).log_mean, labels) == pytest.approx(optimum, rel=1e-6)
    result = analyze_predictions({"val": {"logits": logits, "labels": labels}, "id": {"logits": logits, "labels": labels}},
                                 only=["temperature"])["analyzers"]["temperature"]
    assert result["temperature_pooled"]["value"] == pytest.approx(optimum, rel=1e-6)
    assert result["temperature_members"]["value"] == pytest.approx([optimum, optimum], rel=1e-6)
    after = result["splits"]["id"]
    assert after["pool_then_calibrate"]["nll"]["value"] < after["before"]["nll"]["value"]
    assert after["pool_then_calibrate"]["ece"]["value"] == pytest.approx(0.0, abs=1e-6)  # σ(2/T*) = 3/4 = accuracy
    assert after["calibrate_then_pool"]["ece"]["value"] == pytest.approx(0.0, abs=1e-6)
    assert "note" not in result


def test_temperature_says_when_scaling_changes_nothing_and_skips_without_validation():
    logits, labels = calibration_case(math.log(3))  # already calibrated: T* = 1
    result = analyze_predictions({"val": {"logits": logits, "labels": labels}}, only=["temperature"])
    assert "changes almost nothing" in result["analyzers"]["temperature"]["note"]
    skipped = analyze_predictions({"id": {"logits": logits, "labels": labels}}, only=["temperature"])
    assert "no validation split" in skipped["analyzers"]["temperature"]["reason"]


def test_runs_store_validation_predictions_and_report_temperatures(finished_run, capsys):
    import json
    metrics = json.loads(next(finished_run.glob("*/seed-*/metrics.json")).read_text())
    assert metrics["analyzers"]["temperature"]["status"] == "ok"
    code, text, err = run_cli(capsys, "report", finished_run, "--format", "markdown", "--no-figures")
    assert code == 0 and "T pooled" in text and "ECE pool→T" in text


@pytest.mark.parametrize("seed", range(3))
def test_bias_variance_diversity_sum_to_the_expected_loss_and_match_dense_loops(seed):
    from ensdiag.seeds.across import decompose
    generator = torch.Generator().manual_seed(seed)
    s, k, n, c = 3, 4, 12, 5
    log_q = torch.log_softmax(torch.randn(s, k, n, c, generator=generator, dtype=torch.float64) * 2, -1)
    labels = torch.randint(0, c, (n,), generator=generator)
    result = decompose([Examples(logits, labels) for logits in log_q])
    for part in result.values():
        assert part["bias"] + part["variance"] - part["diversity"] == pytest.approx(part["loss"], abs=1e-12)
    # the cross-entropy terms by explicit loops
    q = log_q.exp()
    variance = diversity = 0.0
    for x in range(n):
        central = torch.exp(sum(log_q[a, i, x] for a in range(s) for i in range(k)) / (s * k))
        central = central / central.sum()
        for a in range(s):
            ensemble = torch.exp(sum(log_q[a, i, x] for i in range(k)) / k)
            ensemble = ensemble / ensemble.sum()
            for i in range(k):
                variance += float((central * (central.log() - log_q[a, i, x])).sum()) / (s * k * n)
                diversity += float((ensemble * (ensemble.log() - log_q[a, i, x])).sum()) / (s * k * n)
    assert result["cross_entropy"]["variance"] == pytest.approx(variance, rel=1e-9)
    assert result["cross_entropy"]["diversity"] == pytest.approx(diversity, rel=1e-9)
    assert result["squared"]["diversity"] == pytest.approx(
        float(((q - q.mean(1, keepdim=True)) ** 2).sum(-1).mean()), rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_the_arithmetic_mean_decomposition_holds_exactly_and_shares_bias_and_variance(seed):
    """CE with the arithmetic mean p̄_s: loss = bias + variance − diversity, the diversity being the members'
    mean CE minus p̄'s (label-dependent); both CE decompositions name their combiner."""
    from ensdiag.seeds.across import decompose
    generator = torch.Generator().manual_seed(seed)
    s, k, n, c = 3, 4, 12, 5
    log_q = torch.log_softmax(torch.randn(s, k, n, c, generator=generator, dtype=torch.float64) * 2, -1)
    labels = torch.randint(0, c, (n,), generator=generator)
    result = decompose([Examples(logits, labels) for logits in log_q])
    arithmetic, geometric = result["cross_entropy_arithmetic"], result["cross_entropy"]
    assert arithmetic["bias"] + arithmetic["variance"] - arithmetic["diversity"] == pytest.approx(arithmetic["loss"],
                                                                                                abs=1e-12)
    member_loss = arithmetic_loss = 0.0  # explicit loops
    for a in range(s):
        for x in range(n):
            y = int(labels[x])
            member_loss += sum(-float(log_q[a, i, x, y]) for i in range(k)) / (k * s * n)
            arithmetic_loss += -math.log(sum(math.exp(float(log_q[a, i, x, y])) for i in range(k)) / k) / (s * n)
    assert arithmetic["loss"] == pytest.approx(arithmetic_loss, rel=1e-12)
    assert arithmetic["diversity"] == pytest.approx(member_loss - arithmetic_loss, rel=1e-12)
    assert geometric["bias"] + geometric["variance"] == pytest.approx(member_loss, rel=1e-12)  # the members' own loss
    assert arithmetic["diversity"] >= 0  # Jensen: p̄'s NLL is never above the members' mean NLL
    assert "arithmetic" in arithmetic["combiner"] and "geometric" in geometric["combiner"]
    assert "arithmetic" in result["squared"]["combiner"]


def test_ensemble_gain_names_the_combiner_of_every_term():
    logits, labels = random_case(0)
    result = analyze_predictions({"id": {"logits": logits.float(), "labels": labels}})["analyzers"]["ensemble-gain"]
    combiners = result["combiners"]
    assert result["version"] == 2 and set(combiners) == {"arithmetic", "geometric"}
    named = [term for entry in combiners.values() for term in entry["terms"]]
    assert sorted(named) == sorted(key for key in result["splits"]["id"] if "gibbs" not in key and "member" not in key)
