"""Every metric against an independent reference: scikit-learn, a hand-computed case, or dense maths."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, average_precision_score, roc_auc_score, roc_curve

import ensdiag
from ensdiag.stats import metrics as M
from ensdiag.stats import weighted as W
from ensdiag.stats import ordered as O
from ensdiag.analysis.calibration import reliability
from ensdiag.stats.examples import Examples


def ood(score_id, score_ood) -> dict:
    return {key: float(value) for key, value in W.ood_metrics(score_id, score_ood).items()}


def ece(logits, labels) -> tuple[float, dict]:
    split = Examples(logits, labels)
    bins = W.calibration_bins(split.confidence, split.correct)
    return float(bins.ece()), reliability(bins)


def mean_of(logits, labels, key) -> float:
    return float(W.mean(getattr(Examples(logits, labels), key)))


def adaptive_ece(logits, labels, bins=15, extra_first=False) -> float:
    split = Examples(logits, labels)
    return float(O.adaptive_ece(split.confidence, split.correct, bins=bins, extra_first=extra_first))


def binned(logits, labels, bins=15):
    split = Examples(logits, labels)
    return W.calibration_bins(split.confidence, split.correct, bins=bins)


def areas(confidence, errors) -> dict:
    return {key: float(value) for key, value in O.risk_coverage_areas(confidence, errors).items()}


def random_logits(k=3, n=200, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, c, generator=g) * 2, torch.randint(0, c, (n,), generator=g)


@pytest.mark.parametrize("tied", [False, True], ids=["continuous", "heavily-tied"])
@pytest.mark.parametrize("seed", range(5))
def test_ood_metrics_equal_scikit_learn(seed, tied):
    rng = np.random.default_rng(seed)
    n_id, n_ood = rng.integers(50, 400, 2)
    score_id, score_ood = rng.normal(0, 1, n_id), rng.normal(0.7, 1, n_ood)
    if tied:  # a handful of distinct values, ties across and within classes
        score_id, score_ood = np.round(score_id * 2) / 2, np.round(score_ood * 2) / 2
    result = ood(torch.tensor(score_id), torch.tensor(score_ood))
    y = np.r_[np.zeros(n_id), np.ones(n_ood)]
    s = np.r_[score_id, score_ood]
    assert result["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert result["aupr_out"] == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert result["aupr_in"] == pytest.approx(average_precision_score(1 - y, -s), abs=1e-12)
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)  # OOD positive: the ROC point at recall 95 %
    assert result["fpr95_id_as_ood"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)
    fpr, tpr, _ = roc_curve(1 - y, -s, drop_intermediate=False)  # ID positive: OOD let through at 95 % ID kept
    assert result["fpr95_ood_as_id"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)


def test_auroc_is_the_pairwise_probability_with_half_ties():
    score_id, score_ood = torch.tensor([0.1, 0.5, 0.5]), torch.tensor([0.5, 0.9])
    # pairs (ood > id): 0.5 vs 0.1 -> 1; vs 0.5, 0.5 -> ½ + ½; 0.9 beats all three -> 3
    assert ood(score_id, score_ood)["auroc"] == pytest.approx((1 + 0.5 + 0.5 + 3) / 6)


def test_fpr95_hand_computed():
    score_id = torch.arange(1, 21, dtype=torch.float64)  # 1..20: τ = 19 accepts 19/20 = 95 %
    score_ood = torch.tensor([0.5, 10, 19, 19.5, 30, 40, 50, 60], dtype=torch.float64)
    # OOD accepted as ID: scores ≤ 19 -> 0.5, 10, 19 -> 3/8
    assert ood(score_id, score_ood)["fpr95_ood_as_id"] == pytest.approx(3 / 8)
    # the other direction: τ = 10 is the largest that flags ≥ 95 % of OOD (all 8: 7/8 < 95 %),
    # so τ = 0.5 flags every OOD sample; ID flagged at τ = 0.5: all 20 -> 1.0
    assert ood(score_id, score_ood)["fpr95_id_as_ood"] == pytest.approx(1.0)


def test_fpr95_counts_ties_at_the_threshold_as_accepted():
    score_id = torch.tensor([0.0] * 10 + [1.0] * 10)  # τ = 1 is the first to reach 95 %
    score_ood = torch.tensor([1.0, 1.0, 2.0, 3.0])
    assert ood(score_id, score_ood)["fpr95_ood_as_id"] == pytest.approx(0.5)


def test_fpr95_id_as_ood_hand_computed_with_ties_flagged():
    score_ood = torch.arange(1, 21, dtype=torch.float64)  # τ = 2 flags 19/20 = 95 % of OOD
    score_id = torch.tensor([0.0, 1.0, 2.0, 2.0, 5.0], dtype=torch.float64)
    # ID flagged as OOD: scores ≥ 2 -> 2, 2, 5 -> 3/5; the ID tied at τ count as flagged
    result = ood(score_id, score_ood)
    assert result["fpr95_id_as_ood"] == pytest.approx(3 / 5)
    # and the paper-text direction on the same scores: τ accepting ≥ 95 % of ID is 5; OOD ≤ 5: 5/20
    assert result["fpr95_ood_as_id"] == pytest.approx(5 / 20)


def probs_to_logits(p):
    return torch.log(torch.tensor(p, dtype=torch.float64).clamp(min=1e-300))[None]


def test_ece_hand_computed_with_confidence_exactly_one():
    # confidences 1.0 (correct), 1.0 (wrong), 0.6 (correct), 0.5 (wrong); 15 bins
    p = [[1.0, 0.0], [1.0, 0.0], [0.6, 0.4], [0.5, 0.5]]
    labels = torch.tensor([0, 1, 0, 1])
    value, bins = ece(probs_to_logits(p), labels)
    # bin 14 (last): conf 1, 1 -> acc 0.5 -> gap 0.5, weight 2/4
    # 0.6 lies in (8/15, 9/15] = bin 8: acc 1 -> gap 0.4; 0.5 in (7/15, 8/15] = bin 7: acc 0 -> gap 0.5
    assert value == pytest.approx(2 / 4 * 0.5 + 1 / 4 * 0.4 + 1 / 4 * 0.5)
    assert bins["count"][14] == 2 and bins["count"][8] == 1 and bins["count"][7] == 1 and sum(bins["count"]) == 4


def test_nll_accuracy_brier_against_direct_formulas():
    logits, labels = random_logits()
    p_bar = F.softmax(logits.double(), -1).mean(0)
    assert mean_of(logits, labels, "nll") == pytest.approx(-torch.log(p_bar[torch.arange(len(labels)), labels]).mean().item(), rel=1e-9)
    assert mean_of(logits, labels, "correct") == pytest.approx(accuracy_score(labels.numpy(), p_bar.argmax(1).numpy()))
    onehot = np.eye(5)[labels.numpy()]
    assert mean_of(logits, labels, "brier") == pytest.approx(((p_bar.numpy() - onehot) ** 2).sum(1).mean())
    members = F.softmax(logits.double(), -1)
    assert M.member_accuracy(Examples(logits, labels)) == pytest.approx([(m.argmax(1) == labels).double().mean().item() for m in members])
    assert M.member_nll(Examples(logits, labels))[1] == pytest.approx(F.cross_entropy(logits[1].double(), labels).item())


def test_nll_is_stable_for_extreme_logits():
    logits = torch.tensor([[[1000.0, -1000.0]], [[-1000.0, 1000.0]]])
    assert mean_of(logits, torch.tensor([0]), "nll") == pytest.approx(math.log(2))


def test_entropies_against_scipy():
    from scipy.stats import entropy
    logits, _ = random_logits(k=4, n=50)
    p = F.softmax(logits.double(), -1)
    expected_h = entropy(p.mean(0).numpy(), axis=1)
    torch.testing.assert_close(Examples(logits, None).entropy, torch.tensor(expected_h))
    torch.testing.assert_close(Examples(logits, None).expected_entropy, torch.tensor(entropy(p.numpy(), axis=2).mean(0)))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 20), st.integers(2, 6), st.integers(0, 10_000), st.floats(0.01, 30))
def test_jsd_is_nonnegative_and_zero_for_identical_members(k, n, c, seed, scale):
    logits = torch.randn(k, n, c, generator=torch.Generator().manual_seed(seed)) * scale
    assert (Examples(logits, None).jsd >= 0).all()
    same = logits[:1].expand(k, n, c)
    assert torch.equal(Examples(same, None).jsd, torch.zeros(n, dtype=torch.float64))  # exactly 0, not rounding noise


def test_jsd_ties_between_identical_member_samples_stay_ties_for_ood_ranking():
    """Samples whose members agree exactly all score JSD 0, so AUROC counts them as ties (½)."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(1, 40, 10, generator=g) * 4
    logits = base.expand(4, 40, 10).clone()
    logits[:, 30:] += torch.randn(4, 10, 10, generator=g)  # the last 10 samples: members differ
    score = Examples(logits, None).jsd
    assert (score[:30] == 0).all() and (score[30:] > 0).all()
    score_id, score_ood = score[:20], score[20:]  # 20 tied ID vs 10 tied + 10 positive OOD
    expected = roc_auc_score(np.r_[np.zeros(20), np.ones(20)], np.r_[np.zeros(20), np.zeros(10), np.ones(10)])
    assert ood(score_id, score_ood)["auroc"] == pytest.approx(expected)


def test_disagreement_matrix_hand_computed():
    predicted = torch.tensor([[0, 1, 2, 2], [0, 1, 1, 2], [1, 1, 1, 0]])
    logits = F.one_hot(predicted, 3).float()
    d = M.disagreement_matrix(logits)
    expected = torch.tensor([[0, 0.25, 0.75], [0.25, 0, 0.5], [0.75, 0.5, 0]], dtype=torch.float64)
    torch.testing.assert_close(d, expected)
    assert M.mean_off_diagonal(d) == pytest.approx(1.5 / 3)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(1, 30), st.integers(0, 10_000))
def test_disagreement_is_symmetric_with_zero_diagonal(k, n, seed):
    d = M.disagreement_matrix(torch.randn(k, n, 4, generator=torch.Generator().manual_seed(seed)))
    assert torch.equal(d, d.T) and (d.diagonal() == 0).all() and ((0 <= d) & (d <= 1)).all()


@pytest.mark.parametrize("variant", ["channel", "kernel"])
def test_batch_ensemble_weight_cosine_equals_dense_reimplementation(variant):
    model = ensdiag.build_model("resnet18", "batch-ensemble", 3, 10, (3, 8, 8), variant=variant)
    overall, per_layer = M.weight_cosine(model.member_weights())
    # dense: rebuild every member's conv kernels directly from W, r, s
    vectors = []
    for i in range(3):
        parts = []
        for name, module in model.body.named_modules():
            if hasattr(module, "r") and module.weight.dim() == 4:
                if variant == "channel":
                    w = module.weight * module.r[i].view(-1, 1, 1, 1) * module.s[i].view(1, -1, 1, 1)
                else:
                    w = module.weight * torch.einsum("oca,ocb->ocab", module.r[i], module.s[i])
                parts.append(w.flatten())
            elif hasattr(module, "r"):  # the linear head: W ∘ r sᵀ, then its bias
                parts += [(module.weight * torch.outer(module.r[i], module.s[i])).flatten(), module.bias[i]]
        vectors.append(torch.cat(parts).double())
    v = torch.stack(vectors)
    dense = (v @ v.T) / (v.norm(dim=1)[:, None] * v.norm(dim=1)[None, :])
    torch.testing.assert_close(overall, dense.detach())
    assert set(per_layer) >= {"conv1", "layer4.1.conv2", "fc"}


def test_weight_cosine_of_ones_init_is_one():
    model = ensdiag.build_model("mlp", "batch-ensemble", 4, 10, (1, 8, 8), init="ones")
    overall, _ = M.weight_cosine(model.member_weights())
    torch.testing.assert_close(overall, torch.ones(4, 4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_sortable_key_orders_exactly_like_the_floats(dtype):
    values = torch.tensor([-3.5, -1.0, -0.0, 0.0, 1e-30, 0.25, 2.0, -1e-30, float("inf"), -float("inf"), 0.25], dtype=dtype)
    keys = M.sortable_key(values)
    order = torch.argsort(keys, stable=True)
    assert torch.equal(values[order], torch.sort(values, stable=True).values)
    for i in range(len(values)):
        for j in range(len(values)):
            assert bool(keys[i] == keys[j]) == bool(values[i] == values[j])


def dense_disagreement(logits):
    """The [k, k, N] definition, as the old implementation computed it (reference only)."""
    p = logits.argmax(-1)
    return (p[:, None] != p[None]).double().mean(-1)


def predicted_logits(predicted, classes, dtype=torch.float32):
    """Logits whose argmax is `predicted` [k, N], built without an int64 one-hot."""
    logits = torch.zeros(*predicted.shape, classes, dtype=dtype)
    return logits.scatter_(2, predicted[..., None], 1.0)


def agreeing_predictions(k, n, c, unanimous, seed):
    """[k, N] labels: a fraction `unanimous` of the samples predicted alike by every member."""
    g = torch.Generator().manual_seed(seed)
    predicted = torch.randint(0, c, (k, n), generator=g)
    same = torch.rand(n, generator=g) < unanimous
    return torch.where(same, predicted[0], predicted)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9), st.integers(1, 60), st.integers(2, 7), st.integers(1, 70), st.floats(0, 1), st.integers(0, 10_000))
def test_disagreement_matrix_equals_the_dense_definition_across_chunks(k, n, c, chunk, unanimous, seed):
    logits = predicted_logits(agreeing_predictions(k, n, c, unanimous, seed), c)
    logits += torch.rand(logits.shape, generator=torch.Generator().manual_seed(seed)) * 0.5  # noise below the margin
    d = M.disagreement_matrix(logits, chunk_size=chunk)
    assert d.dtype == torch.float64 and torch.equal(d, dense_disagreement(logits))  # bit for bit


@pytest.mark.parametrize("chunk", [None, 1, 2, 63, 64, 65, 127, 128, 129])
@pytest.mark.parametrize("k,c", [(2, 3), (3, 5), (17, 10), (40, 2)])
def test_disagreement_matrix_chunk_boundaries(k, c, chunk):
    logits, _ = random_logits(k=k, n=128, c=c, seed=k * c)
    d = M.disagreement_matrix(logits, chunk_size=chunk)
    assert torch.equal(d, dense_disagreement(logits))
    assert torch.equal(d, d.T) and torch.equal(d.diagonal(), torch.zeros(k, dtype=torch.float64))


def test_disagreement_matrix_of_no_samples_is_nan_like_the_dense_mean():
    logits = torch.zeros(3, 0, 4)
    assert torch.isnan(M.disagreement_matrix(logits)).all() and torch.isnan(dense_disagreement(logits)).all()


def test_disagreement_matrix_of_a_thousand_members_needs_no_k_by_k_by_n_tensor():
    """k = 1000, N = 20,000, C = 10: the dense [k, k, N] comparison is 20 GB; this stays near k·N."""
    k, n, c = 1000, 20_000, 10
    predicted = agreeing_predictions(k, n, c, unanimous=0.95, seed=7)
    logits = predicted_logits(predicted, c, torch.float16)  # 400 MB
    del predicted
    limit = None
    try:  # cap this process's address space at what it maps now + 3 GiB, so a dense version fails fast
        import resource
        mapped = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize:")).split()[1]) * 1024
        limit = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 3 * 2**30, limit[1]))
    except (ImportError, OSError, StopIteration, ValueError):
        limit = None
    try:
        d = M.disagreement_matrix(logits, chunk_size=1000)
    finally:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, limit)
    assert d.shape == (k, k) and d.dtype == torch.float64
    members = torch.tensor([0, 1, 2, 500, 998, 999])
    torch.testing.assert_close(d[members][:, members], dense_disagreement(logits[members]), rtol=0, atol=0)
    assert torch.equal(d, d.T) and (d.diagonal() == 0).all()


def _dense_bins(confidence, edges):
    """Equal-width bin of each confidence, by a loop: [0, e1], then (lo, hi]."""
    return [next(b for b in range(len(edges) - 1) if c <= edges[b + 1] or b == len(edges) - 2) for c in confidence]


@pytest.mark.parametrize("seed", range(4))
def test_ece_variants_match_dense_loops(seed):
    from ensdiag.stats import metrics as M
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 50, 4, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, 4, (50,), generator=generator)
    p = Examples(logits, None).mean
    confidence, predicted = p.max(1)
    correct = (predicted == labels).double()
    n, bins = 50, 15
    # equal-mass: sorted by confidence, bin b holds samples floor(bN/B)..floor((b+1)N/B)-1
    order = sorted(range(n), key=lambda i: (float(confidence[i]), i))
    adaptive = 0.0
    for b in range(bins):
        members = order[b * n // bins:(b + 1) * n // bins]
        if members:
            adaptive += len(members) / n * abs(sum(float(correct[i]) for i in members) / len(members)
                                               - sum(float(confidence[i]) for i in members) / len(members))
    assert adaptive_ece(logits, labels, bins) == pytest.approx(adaptive, abs=1e-12)
    edges = [b / bins for b in range(bins + 1)]
    classwise = 0.0
    for c in range(4):
        which = _dense_bins(p[:, c].tolist(), edges)
        for b in range(bins):
            members = [i for i in range(n) if which[i] == b]
            if members:
                classwise += len(members) / n * abs(sum(float(labels[i] == c) for i in members) / len(members)
                                                    - sum(float(p[i, c]) for i in members) / len(members)) / 4
    assert float(W.classwise_ece(Examples(logits, None).mean, labels, bins=bins)) == pytest.approx(classwise, abs=1e-12)
    which = _dense_bins(confidence.tolist(), edges)
    signed = sum(sum(float(confidence[i] - correct[i]) for i in range(n) if which[i] == b) / n for b in range(bins))
    assert float(binned(logits, labels, bins).signed()) == pytest.approx(signed, abs=1e-12)


@pytest.mark.parametrize("n", [7, 15, 50, 61, 300])
def test_torch_uncertainty_adaptive_bins_are_numpy_array_split(n):
    """The peer's equal-mass bins put the N mod B extra samples in the first bins, as
    `np.array_split` does over the confidences sorted ascending."""
    generator = torch.Generator().manual_seed(n)
    logits = torch.randn(2, n, 5, generator=generator, dtype=torch.float64) * 2
    labels = torch.randint(0, 5, (n,), generator=generator)
    confidence, predicted = Examples(logits, None).mean.max(1)
    order = np.argsort(confidence.numpy(), kind="stable")
    correct = (predicted == labels).double().numpy()[order]
    expected = sum(len(part) / n * abs(correct[part].mean() - confidence.numpy()[order][part].mean())
                   for part in np.array_split(np.arange(n), 15) if len(part))
    assert adaptive_ece(logits, labels, 15, extra_first=True) == pytest.approx(expected, abs=1e-12)
    if n % 15 == 0:  # the two conventions differ only in where the remainder goes
        assert adaptive_ece(logits, labels, 15, extra_first=True) == pytest.approx(adaptive_ece(logits, labels, 15))


@pytest.mark.parametrize("n", [1, 2, 9, 200])
def test_trapezoid_aurc_is_sklearn_auc_over_coverages_divided_by_the_span(n):
    from sklearn.metrics import auc
    generator = torch.Generator().manual_seed(n)
    confidence, errors = torch.rand(n, generator=generator), torch.rand(n, generator=generator) < 0.3
    risk, found = M.risk_coverage(confidence, errors), areas(confidence, errors)
    assert found["aurc"] == pytest.approx(risk.mean().item(), abs=1e-12)  # the closed form is the curve's mean
    if n == 1:
        assert found["aurc_trapezoid"] == pytest.approx(risk[0].item())
        return
    coverage = np.arange(1, n + 1) / n
    assert found["aurc_trapezoid"] == pytest.approx(auc(coverage, risk.numpy()) / (1 - 1 / n), abs=1e-12)


def test_overconfidence_has_the_sign_of_the_miscalibration():
    wrong = torch.log(torch.tensor([[[0.9, 0.1], [0.9, 0.1]]], dtype=torch.float64))  # confident, both wrong
    assert float(binned(wrong, torch.tensor([1, 1])).signed()) == pytest.approx(0.9)
    assert ece(wrong, torch.tensor([1, 1]))[0] == pytest.approx(0.9)
    timid = torch.log(torch.tensor([[[0.6, 0.4], [0.6, 0.4]]], dtype=torch.float64))  # right both times at 0.6
    assert float(binned(timid, torch.tensor([0, 0])).signed()) == pytest.approx(-0.4)


# --- issue 38: MCE, the ECE's direction, AUGRC, OOD scores of logits and votes, SmoothECE -----------

def test_mce_is_the_largest_bin_gap_of_a_dense_loop():
    logits, labels = random_logits(k=3, n=300, c=4, seed=4)
    confidence, predicted = Examples(logits, None).mean.max(1)
    gaps = []
    for b in range(15):  # the ECE's bins: [0, 1/15], then (lo, hi]
        lo, hi = b / 15, (b + 1) / 15
        inside = [(c, p == y) for c, p, y in zip(confidence.tolist(), predicted.tolist(), labels.tolist())
                  if (lo < c <= hi) or (b == 0 and c == 0)]
        if inside:
            gaps.append(abs(sum(float(ok) for _, ok in inside) / len(inside) - sum(c for c, _ in inside) / len(inside)))
    assert float(binned(logits, labels).mce()) == pytest.approx(max(gaps), abs=1e-12)


def test_mce_and_direction_hand_computed():
    # confidences 0.9 (right), 0.9 (wrong), 0.6 (right): bins (0.8667, 0.9333] acc ½ conf 0.9, (0.5333, 0.6] acc 1 conf 0.6
    p = [[0.9, 0.1], [0.9, 0.1], [0.6, 0.4]]
    logits, labels = probs_to_logits(p), torch.tensor([0, 1, 0])
    assert float(binned(logits, labels).mce()) == pytest.approx(0.4)
    value, _ = ece(logits, labels)
    assert value == pytest.approx((2 * 0.4 + 0.4) / 3)
    assert float(binned(logits, labels).signed()) / value == pytest.approx((2 * 0.4 - 0.4) / (2 * 0.4 + 0.4))  # ⅓


def test_ece_direction_is_plus_one_when_every_bin_is_over_confident():
    from ensdiag.analysis.calibration import calibration
    logits = probs_to_logits([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
    result = calibration({"id": {"logits": logits, "labels": torch.tensor([1, 1, 1])}})["splits"]["id"]
    assert result["ece_direction"]["value"] == pytest.approx(1.0)
    result = calibration({"id": {"logits": probs_to_logits([[0.6, 0.4]] * 2), "labels": torch.tensor([0, 0])}})
    assert result["splits"]["id"]["ece_direction"]["value"] == pytest.approx(-1.0)


def test_augrc_by_hand_and_against_every_order_of_tied_samples():
    import itertools
    # confidences 0.9, 0.8, 0.8, 0.5 with errors 0, 1, 0, 1: the two at 0.8 tie
    confidence, errors = torch.tensor([0.9, 0.8, 0.8, 0.5]), torch.tensor([0, 1, 0, 1])
    orders = []
    for middle in itertools.permutations([1, 2]):
        order = [0, *middle, 3]
        wrong = [int(errors[i]) for i in order]
        orders.append(sum(sum(wrong[:j]) / 4 for j in range(1, 5)) / 4)  # generalised risk: wrong and accepted, of all N
    assert areas(confidence, errors)["augrc"] == pytest.approx(sum(orders) / len(orders))
    assert areas(confidence, errors)["augrc"] == pytest.approx((0 + 0.5 / 4 + 1 / 4 + 2 / 4) / 4)


@pytest.mark.parametrize("n", [2, 7, 50])
def test_trapezoid_augrc_is_sklearn_auc_of_the_generalised_risk_divided_by_the_span(n):
    from sklearn.metrics import auc
    g = torch.Generator().manual_seed(n)
    confidence, errors = torch.rand(n, generator=g, dtype=torch.float64), torch.randint(0, 2, (n,), generator=g)
    risk = M.risk_coverage(confidence, errors)
    coverage = np.arange(1, n + 1) / n
    assert areas(confidence, errors)["augrc_trapezoid"] == pytest.approx(auc(coverage, coverage * risk.numpy()) / (1 - 1 / n),
                                                                         abs=1e-12)


def test_energy_and_max_logit_of_the_mean_logits_against_scipy():
    from scipy.special import logsumexp

    from ensdiag.stats import scores as S
    logits, _ = random_logits(k=4, n=50, c=6, seed=2)
    mean = logits.double().numpy().mean(0)
    np.testing.assert_allclose(S.energy(logits).numpy(), -logsumexp(mean, axis=1), rtol=1e-12)
    np.testing.assert_allclose(S.energy(logits, temperature=2.0).numpy(), -2 * logsumexp(mean / 2, axis=1), rtol=1e-12)
    np.testing.assert_allclose(S.max_logit(logits).numpy(), -mean.max(1), rtol=1e-12)


def test_variation_ratio_hand_computed():
    from ensdiag.stats import scores as S
    # 4 members, 3 classes; sample 0: votes 0,0,0,0 -> 0; sample 1: 0,0,1,2 -> 1 − 2/4; sample 2: 0,1,1,0 -> 1 − 2/4
    votes = torch.tensor([[0, 0, 0], [0, 0, 1], [0, 1, 1], [0, 2, 0]])  # [k, N]
    logits = torch.nn.functional.one_hot(votes, 3).float() * 5
    assert S.variation_ratio(logits).tolist() == pytest.approx([0.0, 0.5, 0.5])


def dense_smooth_ece(f, y, sigma, points=20001):
    """∫|Σ_i K(t, f_i)(f_i − y_i)|/N dt with the Gaussian reflected at 0 and 1 (images up to ±4), quadrature on a
    fine mesh: the definition, without the authors' grid."""
    from scipy.stats import norm
    t = np.linspace(0, 1, points)
    kernel = sum(norm.pdf(t[:, None] - f[None, :] - 2 * m, scale=sigma) + norm.pdf(t[:, None] + f[None, :] - 2 * m,
                                                                                  scale=sigma) for m in range(-2, 3))
    return np.trapezoid(np.abs(kernel @ (f - y)), t) / len(f)


@pytest.mark.parametrize("sigma", [0.02, 0.05, 0.1, 0.3])
def test_smooth_ece_at_a_bandwidth_is_the_kernel_integral_of_its_definition(sigma):
    from ensdiag.stats import smooth_ece as SE
    rng = np.random.default_rng(1)
    f = rng.beta(4, 1.5, 300)
    y = (rng.uniform(size=300) < f ** 1.5).astype(float)
    assert SE.smooth_ece_at(f, y, sigma) == pytest.approx(dense_smooth_ece(f, y, sigma), rel=5e-3)  # the grid's error


def test_smooth_ece_bandwidth_is_the_fixed_point():
    from ensdiag.stats import smooth_ece as SE
    rng = np.random.default_rng(3)
    f = rng.uniform(0.3, 1, 500)
    y = (rng.uniform(size=500) < f - 0.1).astype(float)
    found = {"value": float(SE.smooth_ece(f, y)), "bandwidth": SE.bandwidth(f, y)}
    sigma = found["bandwidth"]
    assert SE.smooth_ece_at(f, y, sigma) <= sigma  # not too small …
    assert SE.smooth_ece_at(f, y, sigma - 2**-10) > sigma - 2**-10  # … and the next smaller step is
    assert found["value"] == pytest.approx(sigma, abs=2**-10 + 1e-3)


def test_smooth_ece_hand_cases():
    from ensdiag.stats import smooth_ece as SE
    # calibrated: confidence ½ and half of the samples right: the smoothed gap is 0 at every σ, so the search
    # halves σ down to its floor: 2⁻⁹, the last step not below 0.001
    assert float(SE.smooth_ece(np.full(10, 0.5), np.array([0, 1] * 5))) == pytest.approx(0.0, abs=1e-12)
    assert SE.bandwidth(np.full(10, 0.5), np.array([0, 1] * 5)) == 2**-9
    # always wrong at confidence 1: the gap is 1 wherever there is mass
    assert float(SE.smooth_ece(np.ones(20), np.zeros(20))) == pytest.approx(1.0, abs=1e-3)
    assert math.isnan(float(SE.smooth_ece(np.array([]), np.array([]))))
    assert math.isnan(float(SE.smooth_ece(np.array([0.5, math.nan]), np.array([1, 0]))))


def test_variation_ratio_is_nan_where_a_vote_is_undefined():
    from ensdiag.stats import scores as S
    logits, _ = random_logits(k=3, n=5, c=4, seed=1)
    logits[2, 3] = math.nan
    ratio = S.variation_ratio(logits)
    assert ratio[3].isnan() and not ratio[[0, 1, 2, 4]].isnan().any()
