"""Member-pair matrices (KL both ways, JSD, double-fault, error correlation, Yule's Q) and the ambiguity:
against SciPy, NumPy and dense loops; the analyzer, its report table and figure, and `ensdiag diversity`."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.special import rel_entr

import ensdiag
from ensdiag.analysis import all_analyzers, analyze_predictions
from ensdiag.stats import metrics as M
from ensdiag.stats.examples import Examples
from ensdiag.stats import pairwise as P

from .cli import run_cli


def case(seed=0, k=4, n=60, c=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, c, generator=g, dtype=torch.float64) * 2, torch.randint(0, c, (n,), generator=g)


@pytest.mark.parametrize("seed", range(3))
def test_kl_matrix_in_both_directions_equals_scipy(seed):
    logits, _ = case(seed)
    p = torch.softmax(logits, -1).numpy()
    k = len(p)
    expected = np.array([[rel_entr(p[i], p[j]).sum(-1).mean() for j in range(k)] for i in range(k)])
    found = P.kl_matrix(logits).numpy()
    np.testing.assert_allclose(found, expected, rtol=1e-10, atol=1e-13)
    assert not np.allclose(found, found.T)  # KL is not symmetric: K and Kᵀ are the two directions
    assert (np.diag(found) == 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_jsd_matrix_equals_scipy_and_the_chunks_do_not_matter(seed, monkeypatch):
    logits, _ = case(seed)
    p = torch.softmax(logits, -1).numpy()
    k = len(p)
    expected = np.array([[np.mean(jensenshannon(p[i], p[j], axis=-1) ** 2) for j in range(k)] for i in range(k)])
    np.testing.assert_allclose(P.jsd_matrix(logits).numpy(), expected, rtol=1e-9, atol=1e-12)
    monkeypatch.setattr(P, "CHUNK_BYTES", 8 * k * logits.shape[-1] * 7)  # 7 samples a chunk
    np.testing.assert_allclose(P.jsd_matrix(logits).numpy(), expected, rtol=1e-9, atol=1e-12)
    assert (P.jsd_matrix(logits) <= math.log(2)).all()


def dense_error_statistics(logits, labels):
    """Double-fault, error correlation and Yule's Q by counting, pair by pair."""
    wrong = (logits.argmax(-1) != labels).numpy()
    k, n = wrong.shape
    double, q = np.zeros((k, k)), np.ones((k, k))
    for i in range(k):
        for j in range(k):
            n11 = np.sum(~wrong[i] & ~wrong[j])
            n00 = np.sum(wrong[i] & wrong[j])
            n10 = np.sum(~wrong[i] & wrong[j])
            n01 = np.sum(wrong[i] & ~wrong[j])
            double[i, j] = n00 / n
            if i != j:
                q[i, j] = (n11 * n00 - n10 * n01) / (n11 * n00 + n10 * n01)
    return double, np.corrcoef(wrong.astype(float)), q


@pytest.mark.parametrize("seed", range(3))
def test_error_statistics_equal_counting_and_numpy(seed):
    logits, labels = case(seed, n=80, c=3)
    double, correlation, q = dense_error_statistics(logits, labels)
    np.testing.assert_allclose(P.double_fault(logits, labels).numpy(), double, atol=1e-15)
    np.testing.assert_allclose(P.error_correlation(logits, labels).numpy(), correlation, atol=1e-12)
    np.testing.assert_allclose(P.yule_q(logits, labels).numpy(), q, atol=1e-12)


def test_yule_q_and_correlation_hand_computed():
    # member 0 errs on samples 0, 1; member 1 on 1, 2; member 2 never; 4 samples
    labels = torch.zeros(4, dtype=torch.long)
    wrong = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]])
    logits = torch.nn.functional.one_hot(wrong, 2).double() * 3
    q = P.yule_q(logits, labels)
    # members 0, 1: N¹¹ = 1 (sample 3), N⁰⁰ = 1 (sample 1), N¹⁰ = 1 (sample 2), N⁰¹ = 1 (sample 0) -> 0
    assert q[0, 1].item() == pytest.approx(0.0)
    # member 2 is never wrong: N⁰⁰ = N¹⁰... = 0 against member 0 (N¹¹ = 2, N⁰¹ = 2) -> (0 − 0)/(0 + 0) undefined
    assert math.isnan(q[0, 2].item())
    correlation = P.error_correlation(logits, labels)
    assert correlation[0, 1].item() == pytest.approx(0.0) and math.isnan(correlation[0, 2].item())
    assert P.double_fault(logits, labels)[0, 1].item() == pytest.approx(0.25)


@pytest.mark.parametrize("seed", range(3))
def test_ambiguity_is_the_brier_gap_and_half_the_mean_pairwise_squared_distance(seed):
    logits, labels = case(seed)
    p = torch.softmax(logits, -1)
    k = len(p)
    pairwise = sum(((p[i] - p[j]) ** 2).sum(-1).mean().item() for i in range(k) for j in range(k)) / (2 * k * k)
    terms = M.gain_terms(Examples(logits, labels))
    gain = {key: terms[key].mean().item() for key in ("brier_gibbs", "brier_ensemble")}
    assert P.ambiguity(logits) == pytest.approx(pairwise, rel=1e-12)
    assert P.ambiguity(logits) == pytest.approx(gain["brier_gibbs"] - gain["brier_ensemble"], rel=1e-10)


def test_undefined_predictions_give_null_rows_not_numbers():
    logits, labels = case(0, k=3)
    logits[1, 5] = math.nan
    for matrix in (P.kl_matrix(logits), P.jsd_matrix(logits), P.double_fault(logits, labels)):
        assert matrix[1, 0].isnan() and matrix[0, 1].isnan() and not matrix[0, 2].isnan()
    result = all_analyzers()["member-pairs"]({"id": {"logits": logits, "labels": labels}})
    entry = result["splits"]["id"]["kl"]
    assert entry["mean"]["value"] is None and entry["matrix"]["status"] == "non-finite"


def predictions(k=3):
    g = torch.Generator().manual_seed(1)
    return {"id": {"logits": torch.randn(k, 40, 4, generator=g), "labels": torch.randint(0, 4, (40,), generator=g)},
            "ood": {"logits": torch.randn(k, 20, 4, generator=g), "labels": None}}


def test_the_analyzer_stores_every_matrix_per_split_and_its_mean():
    splits = predictions()
    result = analyze_predictions(splits)["analyzers"]["member-pairs"]
    assert result["status"] == "ok"
    assert set(result["splits"]["id"]) == {"kl", "jsd", "double_fault", "error_correlation", "yule_q", "ambiguity"}
    assert set(result["splits"]["ood"]) == {"kl", "jsd", "ambiguity"}  # unlabelled: no errors to pair
    kl = P.kl_matrix(splits["id"]["logits"])
    np.testing.assert_allclose(result["splits"]["id"]["kl"]["matrix"]["value"], kl.numpy(), rtol=1e-12)
    assert result["splits"]["id"]["kl"]["mean"]["value"] == pytest.approx(M.mean_off_diagonal(kl))


def test_the_analyzer_skips_one_member_and_too_many():
    from ensdiag.analysis import Skip
    with pytest.raises(Skip, match="k = 1"):
        all_analyzers()["member-pairs"](predictions(k=1))
    with pytest.raises(Skip, match="65 > 64"):
        all_analyzers()["member-pairs"](predictions(k=65))


def test_diversity_command_shows_and_draws_the_pair_matrices(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    code, out, _ = run_cli(capsys, "diversity", path, "--no-geometry", "--format", "json")
    pairs = json.loads(out)["analyzers"]["member-pairs"]
    assert code == 0 and pairs["status"] == "ok" and len(pairs["splits"]["id"]["jsd"]["matrix"]["value"]) == 3
    code, out, _ = run_cli(capsys, "diversity", path, "--no-geometry", "--plot", tmp_path / "d.png")
    assert code == 0 and "member pairs on id" in out and "Yule's Q (id)" in out
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pair_rows_for_heatmaps_skip_what_is_not_there():
    from ensdiag.report.geometry_figures import pair_rows
    result = analyze_predictions(predictions())["analyzers"]["member-pairs"]
    rows = pair_rows(result)
    assert [label for label, _ in rows] == ["member pairs (id)", "member pairs (ood)"]
    assert [title for title, _, _ in rows[1][1]] == ["KL(row ‖ column)", "JSD"]
    assert pair_rows({"status": "skipped", "reason": "k = 1"}) == []
