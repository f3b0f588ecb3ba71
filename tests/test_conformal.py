"""Split-conformal prediction sets (ensdiag/analysis/conformal.py): the scores, the quantile and the
sets against a case computed by hand; coverage by simulation over many random calibration splits
(inside its binomial band at α = 0.1, where the quantile without the finite-sample correction falls
out of it); the analyzer's split stated and seeded, `val` calibrating where there is one, the
per-subtask numbers adding up to the overall ones, padded choices never in a set."""

import math

import pytest
import torch
from scipy.stats import binom

from ensdiag.analysis import analyze_predictions
from ensdiag.stats.constructions import clopper_pearson
from ensdiag.analysis.conformal import (aps_scores, calibration_split, conformal, conformal_quantile,
                                        conformal_rank, lac_scores, prediction_sets)

# three questions, three choices; eighths, so every sum is exact
PROBS = torch.tensor([[0.5, 0.375, 0.125], [0.25, 0.25, 0.5], [0.125, 0.625, 0.25]], dtype=torch.float64)
LABELS = torch.tensor([0, 1, 2])


def test_scores_quantile_and_sets_by_hand():
    assert lac_scores(PROBS).tolist() == [[0.5, 0.625, 0.875], [0.75, 0.75, 0.5], [0.875, 0.375, 0.75]]
    # APS: the mass of the choices more likely than c, plus p_c (a tie is not "more likely")
    assert aps_scores(PROBS).tolist() == [[0.5, 0.875, 1.0], [0.75, 0.75, 0.5], [1.0, 0.625, 0.875]]
    assert conformal_rank(3, 0.5) == 2 and conformal_rank(3, 0.1) == 4 and conformal_rank(19, 0.1) == 18
    lac = lac_scores(PROBS).gather(1, LABELS[:, None]).squeeze(1)  # 0.5, 0.75, 0.75
    aps = aps_scores(PROBS).gather(1, LABELS[:, None]).squeeze(1)  # 0.5, 0.75, 0.875
    assert conformal_quantile(lac, 0.5) == 0.75 and conformal_quantile(aps, 0.5) == 0.75
    assert conformal_quantile(lac, 0.1) == math.inf  # rank 4 of 3: every set is every choice
    possible = torch.ones(3, 3, dtype=torch.bool)
    assert prediction_sets(lac_scores(PROBS), 0.75, possible).tolist() == [
        [True, True, False], [True, True, True], [False, True, True]]
    assert prediction_sets(aps_scores(PROBS), 0.75, possible).tolist() == [
        [True, False, False], [True, True, True], [False, True, False]]


def test_a_padded_choice_is_never_in_a_set():
    probs = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    for score in (lac_scores, aps_scores):
        assert prediction_sets(score(probs), math.inf, probs > 0).tolist() == [[True, True, False]]


def test_the_split_is_seeded_and_halves_the_questions():
    calibration, test = calibration_split(11)
    assert len(calibration) == 5 and len(test) == 6
    assert sorted(torch.cat([calibration, test]).tolist()) == list(range(11))
    assert torch.equal(calibration, calibration_split(11)[0]) and not torch.equal(calibration, calibration_split(11, 1)[0])


def simulated_coverage(rank_of, repeats=4000, n=20, alpha=0.1):
    """Over `repeats` random calibration splits (calibration_split with seeds 0, 1, …) of one fixed
    set of n questions, how often a test question drawn at random has its answer in its LAC / APS set."""
    g = torch.Generator().manual_seed(46)
    probs = -torch.rand(n, 4, generator=g).log()  # Dirichlet(1, 1, 1, 1): continuous, no ties among scores
    probs = (probs / probs.sum(1, keepdim=True)).double()
    labels = torch.multinomial(probs.float(), 1, generator=g).squeeze(1)
    scores = {"lac": lac_scores(probs), "aps": aps_scores(probs)}
    own = {name: score.gather(1, labels[:, None]).squeeze(1) for name, score in scores.items()}
    covered = {"lac": 0, "aps": 0}
    for seed in range(repeats):
        calibration, test = calibration_split(n, seed)
        question = test[torch.randint(len(test), (), generator=g)]
        for name, score in scores.items():
            rank = rank_of(len(calibration), alpha)
            threshold = own[name][calibration].kthvalue(rank).values.item() if rank <= len(calibration) else math.inf
            sets = prediction_sets(score[question][None], threshold, probs[question][None] > 0)
            covered[name] += bool(sets[0, labels[question]])
    return covered, n // 2


def test_coverage_at_alpha_01_lies_in_its_binomial_band_over_random_calibration_splits():
    """Exchangeable by construction (a random split of one set of questions): each split's test
    question is covered with probability p, 1 − α ≤ p ≤ 1 − α + 1/(n + 1) (n = 10 calibration
    questions); over 4,000 independent splits the count is Binomial(4,000, p), inside [its 0.01 %
    quantile at 1 − α, its 99.99 % quantile at 1 − α + 1/(n + 1)]. The rank ⌈n(1 − α)⌉ without the
    (n + 1) correction covers 9/11 < 0.9 and falls below the band: the test can fail."""
    repeats, alpha = 4000, 0.1
    covered, n = simulated_coverage(conformal_rank, repeats)
    low = binom.ppf(1e-4, repeats, 1 - alpha)
    high = binom.ppf(1 - 1e-4, repeats, 1 - alpha + 1 / (n + 1))
    for name, count in covered.items():
        assert low <= count <= high, (name, count / repeats, low / repeats, high / repeats)
    naive, _ = simulated_coverage(lambda m, a: math.ceil(m * (1 - a)), repeats)
    assert all(count < low for count in naive.values()), naive


def predictions_of(sizes=(30, 50, 20), k=3, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = {f"id/task{i}": {"logits": 2 * torch.randn(k, n, classes, generator=g),
                             "labels": torch.randint(0, classes, (n,), generator=g)} for i, n in enumerate(sizes)}
    pooled = {"logits": torch.cat([p["logits"] for p in parts.values()], 1),
              "labels": torch.cat([p["labels"] for p in parts.values()])}
    return {"id": pooled, **parts}


def test_the_analyzer_states_its_split_and_breaks_coverage_down_by_subtask():
    predictions = predictions_of()
    result = conformal(predictions)
    assert result["split"] == {"calibration": "a random half of id (⌊n/2⌋, seed 0)", "test": "the other id questions",
                               "seed": 0, "n_calibration": 50, "n_test": 50}
    assert "exchangeable" in result["guarantee"] and "marginal" in result["guarantee"].lower()
    for name in ("lac", "aps"):
        entry = result["scores"][name]
        parts = entry["per_subtask"]
        assert sum(part["n"] for part in parts.values()) == entry["n"] == 50
        for key in ("coverage", "set_size"):  # the overall number is the subtasks' weighted by their test questions
            assert entry[key]["value"] == pytest.approx(sum(p[key]["value"] * p["n"] for p in parts.values()) / 50)
        interval = entry["coverage"]["interval"]
        covered = round(entry["coverage"]["value"] * 50)
        assert (interval["low"], interval["high"]) == pytest.approx(clopper_pearson(covered, 50))
        assert interval["low"] <= entry["coverage"]["value"] <= interval["high"]
        assert entry["set_size"]["interval"]["low"] <= entry["set_size"]["value"] <= entry["set_size"]["interval"]["high"]
        assert [entry["levels"][str(a)]["set_size"]["value"] for a in (0.05, 0.2)] == sorted(
            [entry["levels"][str(a)]["set_size"]["value"] for a in (0.05, 0.2)], reverse=True)  # smaller α, larger sets
    assert conformal(predictions) == result  # seeded: the same every time


def test_a_validation_split_calibrates_and_every_id_question_is_tested():
    predictions = predictions_of()
    predictions["val"] = predictions_of((40,), seed=1)["id"]
    result = conformal(predictions)
    assert result["split"]["calibration"] == "val" and result["split"]["n_test"] == 100
    metrics = analyze_predictions(predictions, only=["conformal"])
    assert metrics["analyzers"]["conformal"]["status"] == "ok"


def test_no_labelled_questions_is_a_skip():
    metrics = analyze_predictions({"ood": {"logits": torch.randn(2, 5, 3), "labels": None}}, only=["conformal"])
    assert metrics["analyzers"]["conformal"]["status"] == "skipped"


@pytest.mark.parametrize("covered, n", [(0, 10), (10, 10), (7, 10), (180, 200), (1, 3)])
def test_the_clopper_pearson_interval_is_scipys_exact_binomial_interval(covered, n):
    from scipy.stats import binomtest
    reference = binomtest(covered, n).proportion_ci(confidence_level=0.95, method="exact")
    assert clopper_pearson(covered, n) == pytest.approx((reference.low, reference.high), abs=1e-12)
