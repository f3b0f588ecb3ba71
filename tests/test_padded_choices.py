"""Questions with different numbers of choices (lm-eval's ARC: 3, 4 and 5): padded to the most
any has with `PAD_LOGIT`, a choice of probability exactly 0. Padding a question set changes no
analyzer's result and no report table, and mixed choice counts give every metric of a ragged
float64 reference computed question by question (docs/conventions.md, "Questions with different
numbers of choices")."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp, softmax
from scipy.stats import entropy
from sklearn.metrics import roc_auc_score

from ensdiag.analysis import analyze_predictions
from ensdiag.core.diagnosis import Diagnosis
from ensdiag.foreign.predictions import PAD_LOGIT
from ensdiag.report import make_report

from .test_multiple_choice import dense_ece


def padded(logits: torch.Tensor, width: int) -> torch.Tensor:
    pad = torch.full((*logits.shape[:2], width - logits.shape[2]), PAD_LOGIT)
    return torch.cat([logits, pad], dim=2)


def splits(seed, k=3, choices=3, scale=2.0):
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, 150, choices, generator=generator) * scale  # members that partly agree
    logits = shared + torch.randn(k, 150, choices, generator=generator) * scale / 2
    labels = torch.randint(0, choices, (150,), generator=torch.Generator().manual_seed(99))  # one test set
    return {"id": {"logits": logits[:, :70], "labels": labels[:70]}, "val": {"logits": logits[:, 70:110], "labels": labels[70:110]},
            "ood": {"logits": logits[:, 110:] / 4, "labels": None}}


def assert_same(a, b, where=""):
    """Equal JSON-like trees, numbers to 1e-9 (relative) or 1e-12."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{index}]")
    elif isinstance(a, float) and isinstance(b, float) and not (math.isnan(a) and math.isnan(b)):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


def test_padding_changes_no_analyzer_result():
    """Every registered predictions analyzer (calibration with classwise ECE, uncertainty,
    disagreement, ood, temperature, ensemble-gain, selective, and any added later) gives the same
    numbers on three-choice questions as on the same questions padded to five choices."""
    plain = splits(0)
    wide = {name: {**split, "logits": padded(split["logits"], 5)} for name, split in plain.items()}
    found, expected = analyze_predictions(wide), analyze_predictions(plain)
    assert found.pop("num_classes") == 5 and expected.pop("num_classes") == 3
    assert all(result["status"] in ("ok", "skipped") for result in expected["analyzers"].values())
    assert {"calibration", "disagreement", "ood", "temperature", "ensemble-gain"} <= {
        name for name, result in expected["analyzers"].items() if result["status"] == "ok"}
    assert_same(found, expected)


def test_padding_changes_no_report_table(tmp_path):
    """The report's tables, verdict and bias–variance–diversity (which read the saved predictions
    again) are the same for padded and unpadded runs."""
    reports = []
    for width, folder in ((3, tmp_path / "plain"), (5, tmp_path / "wide")):
        for method, shift in (("single", 0), ("deep-ensemble", 10), ("lora", 20)):
            for seed in (0, 1):
                predictions = splits(shift + seed, k=1 if method == "single" else 3)
                predictions = {name: {**split, "logits": padded(split["logits"], width)} for name, split in predictions.items()}
                Diagnosis(analyze_predictions(predictions), predictions, {name: name for name in predictions}).save(
                    folder, method, seed)
        report = make_report(folder, write=False)
        reports.append(json.loads(json.dumps({key: report[key] for key in ("tables", "verdict", "definitions")})))
    assert {table["id"] for table in reports[0]["tables"]} >= {"verdict", "id", "ood", "bvd", "calibration"}
    assert_same(reports[1], reports[0])


def ragged(seed, k=4, n=90):
    """Questions with 2 to 5 choices, member scores of one question as a [k, C] array each."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(2, 6, n)
    scores = [rng.normal(0, 2, (1, c)) + rng.normal(0, 1, (k, c)) for c in counts]
    labels = np.array([rng.integers(0, c) for c in counts])
    return [s.astype(np.float32).astype(np.float64) for s in scores], labels


def as_padded(scores) -> torch.Tensor:
    width = max(s.shape[1] for s in scores)
    out = torch.full((scores[0].shape[0], len(scores), width), PAD_LOGIT)
    for index, s in enumerate(scores):
        out[:, index, :s.shape[1]] = torch.from_numpy(s)
    return out


def test_mixed_choice_counts_give_every_metric_of_a_ragged_reference():
    scores, labels = ragged(1)
    val_scores, val_labels = ragged(2, n=60)
    ood_scores, _ = ragged(3, n=40)
    ood_scores = [s / 3 for s in ood_scores]
    predictions = {"id": {"logits": as_padded(scores), "labels": torch.from_numpy(labels)},
                   "val": {"logits": as_padded(val_scores), "labels": torch.from_numpy(val_labels)},
                   "ood": {"logits": as_padded(ood_scores), "labels": None}}
    width = max(split["logits"].shape[2] for split in predictions.values())
    predictions = {name: {**split, "logits": padded(split["logits"], width)} for name, split in predictions.items()}
    found = analyze_predictions(predictions)["analyzers"]
    value = lambda analyzer, key, split="id": found[analyzer]["splits"][split][key]["value"]  # noqa: E731

    member_p = [softmax(s, -1) for s in scores]  # per question: [k, C] over its own choices only
    mean_p = [p.mean(0) for p in member_p]
    confidence = np.array([p.max() for p in mean_p])
    correct = np.array([p.argmax() == y for p, y in zip(mean_p, labels)], dtype=float)
    k = scores[0].shape[0]
    votes = np.array([s.argmax(1) for s in scores]).T  # [k, N]
    assert value("calibration", "accuracy") == pytest.approx(correct.mean(), abs=1e-12)
    assert value("calibration", "nll") == pytest.approx(np.mean([-np.log(p[y]) for p, y in zip(mean_p, labels)]), abs=1e-9)
    assert value("calibration", "ece") == pytest.approx(dense_ece(confidence, correct), abs=1e-9)
    brier = np.mean([((p - np.eye(len(p))[y]) ** 2).sum() for p, y in zip(mean_p, labels)])
    assert value("calibration", "brier") == pytest.approx(brier, abs=1e-9)
    assert value("calibration", "member_accuracy") == pytest.approx((votes == labels).mean(1).tolist(), abs=1e-12)
    assert value("uncertainty", "entropy") == pytest.approx(np.mean([entropy(p) for p in mean_p]), abs=1e-9)
    jsd = np.mean([entropy(m) - entropy(p, axis=1).mean() for m, p in zip(mean_p, member_p)])
    assert value("uncertainty", "jsd") == pytest.approx(jsd, abs=1e-9)
    pairs = [(i, j) for i in range(k) for j in range(k) if i != j]
    assert value("disagreement", "mean") == pytest.approx(np.mean([(votes[i] != votes[j]).mean() for i, j in pairs]), abs=1e-12)
    # classwise ECE: choice positions as classes, each over the questions that have it
    choices = max(len(p) for p in mean_p)
    classwise = np.mean([dense_ece(np.array([p[c] if c < len(p) else 0.0 for p in mean_p]), (labels == c).astype(float))
                         for c in range(choices)])
    assert value("calibration", "ece_classwise") == pytest.approx(classwise, abs=1e-9)
    # OOD: 1 − MSP of the ragged questions, ranked by scikit-learn
    ood_msp = [1 - softmax(s, -1).mean(0).max() for s in ood_scores]
    auroc = roc_auc_score([0] * len(scores) + [1] * len(ood_scores), [*(1 - confidence), *ood_msp])
    assert found["ood"]["scores"]["msp"]["auroc"]["value"] == pytest.approx(auroc, abs=1e-12)
    # temperature scaling of the pooled prediction, fitted on the ragged validation questions by SciPy
    val_log_mean = [np.log(softmax(s, -1).mean(0)) for s in val_scores]
    fitted = minimize_scalar(lambda t: np.mean([logsumexp(z / t) - z[y] / t for z, y in zip(val_log_mean, val_labels)]),
                             bounds=(0.02, 50), method="bounded", options={"xatol": 1e-10})
    assert found["temperature"]["temperature_pooled"]["value"] == pytest.approx(fitted.x, rel=1e-5)
