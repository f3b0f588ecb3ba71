"""ensdiag against torch-uncertainty 0.13's own metric and OOD-criterion classes and against relplot, the
SmoothECE authors' package, on the committed cases (tests/fixtures/peer_metrics/make_fixtures.py wrote
both the inputs and the peers' values, in a venv of their own)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ensdiag.analysis import analyze_predictions
from ensdiag.stats import scores as S
from ensdiag.stats import smooth_ece as SE
from ensdiag.stats.examples import Examples

HERE = Path(__file__).parent / "fixtures" / "peer_metrics"
PEER = json.loads((HERE / "peer_metrics.json").read_text())
INPUTS = np.load(HERE / "cases.npz")
CASES = sorted(PEER["cases"])
FLOAT32 = 2e-6  # torch-uncertainty computes in float32


def case(name):
    return (torch.from_numpy(INPUTS[f"{name}/logits"]), torch.from_numpy(INPUTS[f"{name}/labels"]).long(),
            torch.from_numpy(INPUTS[f"{name}/ood"]))


def relplot_inputs(name):
    """The confidences (max p̄ in float32, as torch-uncertainty computes p̄) and correctness relplot was given."""
    return INPUTS[f"{name}/confidence"], INPUTS[f"{name}/correct"]


def test_the_fixture_records_the_versions_that_made_it():
    assert PEER["versions"]["torch-uncertainty"] == "0.13.0" and PEER["versions"]["relplot"] == "1.0.3"


@pytest.fixture(scope="module", params=CASES)
def analysed(request):
    logits, labels, ood = case(request.param)
    metrics = analyze_predictions({"id": {"logits": logits, "labels": labels}, "ood": {"logits": ood, "labels": None}})
    return request.param, metrics["analyzers"]


def test_mce_and_ece_equal_torch_uncertainty(analysed):
    name, analyzers = analysed
    peer, found = PEER["cases"][name]["calibration"], analyzers["calibration"]["splits"]["id"]
    assert found["mce"]["value"] == pytest.approx(peer["mce"], abs=FLOAT32)
    assert found["ece"]["value"] == pytest.approx(peer["ece"], abs=FLOAT32)


@pytest.mark.parametrize("kernel", ["reflected", "logit"])
def test_smooth_ece_equals_relplot_to_float64_rounding_and_torch_uncertainty_to_float32(kernel, analysed):
    name, analyzers = analysed
    peer = PEER["cases"][name]["calibration"]
    f, y = relplot_inputs(name)
    found = {"value": float(SE.smooth_ece(f, y, kernel=kernel)), "bandwidth": SE.bandwidth(f, y, kernel)}
    assert found["bandwidth"] == peer[f"relplot_smooth_ece_{kernel}_bandwidth"] == peer[f"tu_smooth_ece_{kernel}_bandwidth"]
    assert found["value"] == pytest.approx(peer[f"relplot_smooth_ece_{kernel}"], rel=1e-12)
    # torch-uncertainty sizes its grids a little differently from relplot (int(10/σ) mesh points, odd grids):
    # on the tied case, whose confidences are 100 spikes, that moves its log-odds value by 9e-6 (2.4e-4 relative)
    tolerance = 1e-5 if (name, kernel) == ("tied", "logit") else FLOAT32
    assert found["value"] == pytest.approx(peer[f"tu_smooth_ece_{kernel}"], abs=tolerance)
    assert SE.smooth_ece_at(f, y, 0.003, kernel) == pytest.approx(peer[f"relplot_smooth_ece_{kernel}_at_0.003"], rel=1e-12)
    stored = analyzers["calibration"]["splits"]["id"]["smooth_ece" if kernel == "reflected" else "smooth_ece_tu"]
    assert stored["value"] == pytest.approx(peer[f"tu_smooth_ece_{kernel}"], abs=tolerance)  # from ensdiag's float64 p̄


def test_smoothed_reliability_curve_equals_relplots_diagram(analysed):
    name, _ = analysed
    peer = PEER["cases"][name]["calibration"]["relplot_curve"]
    f, y = relplot_inputs(name)
    curve = SE.smooth_reliability(f, y, peer["sigma"], points=len(peer["mesh"]))
    np.testing.assert_allclose(curve["confidence"], peer["mesh"], atol=1e-15)
    # relplot convolves directly, ensdiag by FFT (bounded cost at small σ): 1e-9 apart where the density is ~0
    np.testing.assert_allclose(curve["accuracy"], peer["mu"], atol=1e-8)
    np.testing.assert_allclose(curve["density"], peer["density"], atol=1e-8)


def test_aurc_and_augrc_equal_torch_uncertainty_where_no_confidences_tie(analysed):
    name, analyzers = analysed
    logits, labels, _ = case(name)
    confidence, _ = Examples(logits, None).mean.max(dim=1)
    if len(confidence.unique()) < len(confidence):
        pytest.skip("tied confidences: torch-uncertainty orders them arbitrarily, ensdiag takes the expectation")
    peer, found = PEER["cases"][name]["calibration"], analyzers["selective"]["splits"]["id"]
    assert found["aurc_trapezoid"]["value"] == pytest.approx(peer["aurc"], abs=FLOAT32)
    assert found["augrc_trapezoid"]["value"] == pytest.approx(peer["augrc"], abs=FLOAT32)


def test_tied_case_has_ties_so_the_skip_above_is_exercised():
    logits, _, _ = case("tied")
    confidence, _ = Examples(logits, None).mean.max(dim=1)
    assert len(confidence.unique()) < len(confidence)


OURS = {  # torch-uncertainty criterion -> (ensdiag score, what to add to the peer's value to get ensdiag's)
    "msp": (lambda z: 1 - Examples(z, None).confidence, 1.0),  # the peer's −max p̄; ensdiag's 1 − max p̄
    "logit": (S.max_logit, 0.0),
    "energy": (S.energy, 0.0),
    "entropy": (lambda z: Examples(z, None).expected_entropy, 0.0),  # the peer's "entropy" criterion is the mean member entropy
    "mutual_information": (lambda z: Examples(z, None).jsd, 0.0),
}


@pytest.mark.parametrize("criterion", sorted(OURS))
def test_ood_scores_equal_torch_uncertaintys_criteria(criterion, analysed):
    name, _ = analysed
    logits, _, ood = case(name)
    score, offset = OURS[criterion]
    peer = PEER["cases"][name]["ood"][criterion]
    for ours, theirs in ((score(logits), peer["id_scores"]), (score(ood), peer["ood_scores"])):
        np.testing.assert_allclose(ours.numpy(), np.asarray(theirs) + offset, rtol=1e-5, atol=5e-6)


def test_variation_ratio_counts_the_modal_vote_where_torch_uncertainty_counts_the_vote_for_argmax_p_bar(analysed):
    """The two agree wherever argmax p̄ is the modal vote; elsewhere ensdiag's is lower (the mode has more votes)."""
    name, _ = analysed
    logits, _, ood = case(name)
    peer = PEER["cases"][name]["ood"]["variation_ratio"]
    for member_logits, theirs in ((logits, peer["id_scores"]), (ood, peer["ood_scores"])):
        ours, theirs = S.variation_ratio(member_logits).numpy(), np.asarray(theirs)
        votes = torch.nn.functional.one_hot(member_logits.argmax(-1), member_logits.shape[-1]).sum(0)
        modal = votes.gather(1, Examples(member_logits, None).mean.argmax(-1, keepdim=True)).squeeze(1) == votes.max(1).values
        np.testing.assert_allclose(ours[modal.numpy()], theirs[modal.numpy()], atol=1e-6)
        assert (ours[~modal.numpy()] < theirs[~modal.numpy()]).all()


ANALYZER_SCORE = {"msp": "msp", "logit": "max_logit", "energy": "energy", "entropy": "expected_entropy",
                  "mutual_information": "jsd"}


@pytest.mark.parametrize("criterion", sorted(ANALYZER_SCORE))
def test_ood_analyzer_equals_torch_uncertaintys_auroc_aupr_and_fpr95(criterion, analysed):
    name, analyzers = analysed
    peer = PEER["cases"][name]["ood"][criterion]
    found = analyzers["ood"]["scores"][ANALYZER_SCORE[criterion]]
    assert found["auroc"]["value"] == pytest.approx(peer["auroc"], abs=1e-5)
    assert found["aupr_out"]["value"] == pytest.approx(peer["aupr"], abs=1e-5)
    assert found["fpr95_id_as_ood"]["value"] == pytest.approx(peer["fpr95"], abs=1e-5)
