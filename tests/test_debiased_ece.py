"""The debiased calibration error against the authors' own package (a committed fixture made by
tests/fixtures/debiased_ece/make_fixtures.py in its own venv) and against its bias on a model
calibrated by construction."""

import json
from pathlib import Path

import pytest
import torch

from ensdiag.analysis import analyze_predictions
from ensdiag.stats import ordered as O


def debiased_l2(confidence, correct) -> dict:
    return {key: float(value) for key, value in O.debiased_l2(confidence, correct).items()}

CASES = json.loads((Path(__file__).parent / "fixtures" / "debiased_ece" / "cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"n={len(case['labels'])}" for case in CASES])
def test_the_debiased_and_plugin_errors_equal_the_authors_package(case):
    probs, labels = torch.tensor(case["probs"], dtype=torch.float64), torch.tensor(case["labels"])
    confidence, predicted = probs.max(1)
    found = debiased_l2(confidence, (predicted == labels).double())
    assert found["debiased_l2"] == pytest.approx(case["debiased"], abs=1e-12)
    assert found["plugin_l2"] == pytest.approx(case["plugin"], abs=1e-12)
    logits = probs.log().float()[None]  # one member: p̄ is its softmax, up to float32 rounding
    result = analyze_predictions({"id": {"logits": logits, "labels": labels}}, only=["debiased-ece"])["analyzers"]
    assert result["debiased-ece"]["splits"]["id"]["debiased_l2"]["value"] == pytest.approx(case["debiased"], abs=1e-5)


def test_on_a_calibrated_model_the_debiased_error_is_near_zero_where_the_binned_one_is_not():
    """Labels drawn with the stated confidence (calibrated by construction): the plug-in error of 200
    examples stays well above 0 by noise alone, the debiased one far less so, on average."""
    generator = torch.Generator().manual_seed(0)
    debiased, plugin = [], []
    for _ in range(200):
        confidence = 0.5 + 0.5 * torch.rand(200, generator=generator, dtype=torch.float64)
        correct = (torch.rand(200, generator=generator, dtype=torch.float64) < confidence).double()
        found = debiased_l2(confidence, correct)
        debiased.append(found["debiased_l2"] ** 2)
        plugin.append(found["plugin_l2"] ** 2)
    # squared errors: the plug-in one is all noise (0.0125 here); the debiased one, clipped at 0, keeps a fifth of it
    assert sum(plugin) / 200 > 0.01 and sum(debiased) / 200 < sum(plugin) / 200 / 4
