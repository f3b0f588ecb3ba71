"""Why an ensemble is or is not one: the diversity gap (train − test), disagreement over error, the
calibration/refinement split, EPKL and RMI beside entropy and MI, and ρ(AU, EU); each number against
a dense re-implementation written here (loops over members, examples and folds; scipy where it has
the statistic), their identities, their intervals against an explicit bootstrap on the same draws,
the training sample the core predicts, and what the report says of them."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax

import ensdiag
from ensdiag.analysis import analyze_predictions
from ensdiag.stats import bootstrap as B
from ensdiag.analysis import refinement as R
from ensdiag.stats import weighted as W
from ensdiag.stats import ordered as O
from ensdiag.analysis.diversity_gap import TRAINING_SAMPLE
from ensdiag.geometry.paths import seeded_sample
from ensdiag.stats.examples import Examples
from ensdiag.analysis.registry import without_ood_labels
from ensdiag.core.intervals import add_intervals

NEW = ["diversity-gap", "disagreement-error", "refinement", "uncertainty"]


def _split(generator, k, n, classes=5, scale=2.0, signal=2.0):
    labels = torch.randint(0, classes, (n,), generator=generator)
    logits = scale * torch.randn(k, n, classes, generator=generator) + signal * torch.nn.functional.one_hot(labels, classes)
    return {"logits": logits, "labels": labels}


def _predictions(k=4, seed=0, identical=False, sizes=(120, 90, 150)):
    g = torch.Generator().manual_seed(seed)
    found = {"id": _split(g, k, sizes[0]), "val": _split(g, k, sizes[1]), "train": _split(g, k, sizes[2], signal=4.0),
             "ood": {"logits": 2 * torch.randn(k, 80, 5, generator=g), "labels": None}}
    if identical:  # every member the first one
        found = {name: {**split, "logits": split["logits"][:1].expand(k, -1, -1).clone()} for name, split in found.items()}
    return found


def _analysed(predictions, detail=True):
    predictions = without_ood_labels(predictions)
    metrics = analyze_predictions(predictions, only=NEW)
    add_intervals(metrics, predictions, detail=detail)
    return metrics["analyzers"]


# ------------------------------------------------------------------ dense re-implementations

def dense_log_probs(logits):
    return log_softmax(logits.double().numpy(), axis=-1)  # [k, n, C]


def dense_disagreement(logits):
    predicted = logits.argmax(-1).numpy()
    k, n = predicted.shape
    return np.array([sum(predicted[i, x] != predicted[j, x] for i in range(k) for j in range(k) if i != j) / (k * (k - 1))
                     for x in range(n)])


def dense_kl_diversity(logits):
    """(1/k) Σ_i KL(q̄ ‖ p_i), q̄ the normalised geometric mean, one example at a time."""
    log_p = dense_log_probs(logits)
    k, n, _ = log_p.shape
    found = []
    for x in range(n):
        q = np.exp(log_p[:, x].mean(0))
        q /= q.sum()
        found.append(np.mean([np.sum(q * (np.log(q) - log_p[i, x])) for i in range(k)]))
    return np.array(found)


def dense_member_error(logits, labels):
    return (logits.argmax(-1).numpy() != labels.numpy()[None]).mean(0)


def dense_uncertainty(logits):
    """Per example: TU, AU, MI = (1/k) Σ KL(p_i ‖ p̄), EPKL = (1/k²) Σ_{i,j} KL(p_i ‖ p_j), RMI = (1/k) Σ KL(p̄ ‖ p_i)."""
    log_p = dense_log_probs(logits)
    p = np.exp(log_p)
    k = len(p)
    mean = p.mean(0)
    kl = lambda a, b: np.sum(a * (np.log(a) - np.log(b)), -1)  # noqa: E731
    return {"tu": -np.sum(mean * np.log(mean), -1), "au": np.mean([-np.sum(p[i] * log_p[i], -1) for i in range(k)], 0),
            "mi": np.mean([kl(p[i], mean) for i in range(k)], 0),
            "epkl": np.mean([kl(p[i], p[j]) for i in range(k) for j in range(k)], 0),
            "rmi": np.mean([kl(mean, p[i]) for i in range(k)], 0)}


def percentile_interval(values):
    return np.quantile(values, [0.025, 0.975])


# ------------------------------------------------------------------ the diversity gap and D/E

def test_identical_members_give_a_diversity_gap_of_zero_and_a_disagreement_to_error_ratio_of_zero():
    found = _analysed(_predictions(identical=True))
    gap = found["diversity-gap"]
    for key in ("disagreement_gap", "kl_diversity_gap"):
        assert gap[key]["value"] == pytest.approx(0, abs=1e-12)
        assert gap[key]["interval"]["low"] == pytest.approx(0, abs=1e-12) and gap[key]["interval"]["high"] == pytest.approx(0, abs=1e-12)
    for name in ("train", "val", "id"):
        assert gap["splits"][name]["disagreement"]["value"] == 0 and gap["splits"][name]["kl_diversity"]["value"] == 0
    ratios = found["disagreement-error"]["splits"]
    assert set(ratios) == {"id", "val", "train"}  # every labelled split, OOD never
    for name, entry in ratios.items():
        assert entry["member_error"]["value"] > 0 and entry["ratio"]["value"] == 0, name
    assert ratios["id"]["ratio"]["interval"]["low"] == 0 and ratios["id"]["ratio"]["interval"]["high"] == 0


def test_the_diversity_gap_equals_a_dense_computation_and_its_interval_an_explicit_stratified_bootstrap():
    predictions = _predictions()
    found = _analysed(predictions)["diversity-gap"]
    dense = {name: {"disagreement": dense_disagreement(predictions[name]["logits"]),
                    "kl_diversity": dense_kl_diversity(predictions[name]["logits"])} for name in ("train", "val", "id")}
    for name, terms in dense.items():
        for key, values in terms.items():
            assert found["splits"][name][key]["value"] == pytest.approx(values.mean(), abs=1e-12), (name, key)
    for key in ("disagreement", "kl_diversity"):
        entry = found[f"{key}_gap"]
        assert entry["value"] == pytest.approx(dense["train"][key].mean() - dense["id"][key].mean(), abs=1e-12)
        train_rows = B.draws("train", 150, B.RESAMPLES).numpy()  # the train and test examples drawn apart
        id_rows = B.draws("id", 120, B.RESAMPLES).numpy()
        resampled = dense["train"][key][train_rows].mean(1) - dense["id"][key][id_rows].mean(1)
        low, high = percentile_interval(resampled)
        assert entry["interval"]["low"] == pytest.approx(low, abs=1e-12)
        assert entry["interval"]["high"] == pytest.approx(high, abs=1e-12)
        assert entry["interval"]["strata"] == {"train": 150, "id": 120}


def test_the_disagreement_to_error_ratio_and_its_interval_are_one_ratio_of_means_per_resample():
    predictions = _predictions()
    found = _analysed(predictions)["disagreement-error"]["splits"]
    for name in ("id", "val", "train"):
        logits, labels = predictions[name]["logits"], predictions[name]["labels"]
        d, e = dense_disagreement(logits), dense_member_error(logits, labels)
        assert found[name]["ratio"]["value"] == pytest.approx(d.mean() / e.mean(), abs=1e-12)
        assert found[name]["disagreement"]["value"] == pytest.approx(d.mean(), abs=1e-12)
        assert found[name]["member_error"]["value"] == pytest.approx(e.mean(), abs=1e-12)
    d, e = dense_disagreement(predictions["id"]["logits"]), dense_member_error(predictions["id"]["logits"],
                                                                                predictions["id"]["labels"])
    rows = B.draws("id", 120, B.RESAMPLES).numpy()
    low, high = percentile_interval(d[rows].sum(1) / e[rows].sum(1))  # each resample's own two means
    assert found["id"]["ratio"]["interval"]["low"] == pytest.approx(low, abs=1e-12)
    assert found["id"]["ratio"]["interval"]["high"] == pytest.approx(high, abs=1e-12)


def test_no_member_error_leaves_the_ratio_undefined_and_says_why():
    labels = torch.arange(40) % 4
    logits = 5 * torch.nn.functional.one_hot(labels, 4).float().expand(3, -1, -1).clone()
    logits[1, :5] += torch.tensor([0.0, 0.0, 0.0, 0.0]) + 0.1 * torch.randn(5, 4)  # members differ, never err
    found = _analysed({"id": {"logits": logits, "labels": labels}})["disagreement-error"]["splits"]["id"]
    assert found["member_error"]["value"] == 0
    assert found["ratio"]["value"] is None and "no member errs" in found["ratio"]["note"]
    assert "interval" not in found["ratio"]


def test_a_ratio_of_means_over_resamples_without_any_error():
    drawn = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    disagreement, error = torch.tensor([0.5, 0.0, 1.0]), torch.tensor([0.25, 0.0, 0.0])
    found = W.ratio_of_means(disagreement, error, drawn)
    assert found[0] == pytest.approx(0.5 / 0.25) and found[1] == math.inf  # drew disagreement, no error
    assert math.isnan(found[2]) and found[3] == pytest.approx(2.0)  # drew neither: 0/0


# ------------------------------------------------------------------ calibration and refinement

def dense_folds(n, name="id", repeat=0):
    """The folds as docs/conventions.md defines them: the inputs in the order of a generator seeded by the split's
    draws' seed + 2 + 7919 × the assignment, the i-th in fold i mod 5."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(B.seed_of(name, n) + 2 + 7919 * repeat)).numpy()
    fold = np.empty(n, dtype=int)
    fold[order] = np.arange(n) % 5
    return fold


def dense_refinement(logits, labels, name="id"):
    """{loss: (loss, calibration, refinement)}: in each of the 4 fold assignments, T fitted on the other folds by
    scipy's bounded search (T = 1 where they hold no error), each fold scored at its own T; the 4 averaged."""
    n = len(labels)
    log_p = dense_log_probs(logits)
    z = np.log(np.exp(log_p).mean(0))
    y = labels.numpy()
    score = {"nll": lambda b, at: -log_softmax(b * z[at], -1)[np.arange(len(at)), y[at]],
             "brier": lambda b, at: ((softmax(b * z[at], -1) - np.eye(z.shape[1])[y[at]]) ** 2).sum(-1)}
    found = {}
    for loss, of in score.items():
        refined = np.zeros(n)
        for repeat in range(4):
            fold = dense_folds(n, name, repeat)
            for j in range(5):
                fit, own = np.nonzero(fold != j)[0], np.nonzero(fold == j)[0]
                errors = z[fit].argmax(1) != y[fit]
                beta = minimize_scalar(lambda b: of(b, fit).mean(), bounds=(1 / 50, 50), method="bounded",
                                       options={"xatol": 1e-10}).x if errors.any() and not errors.all() else 1.0
                refined[own] += of(beta, own) / 4
        plain = of(1.0, np.arange(n)).mean()
        found[loss] = (plain, plain - refined.mean(), refined.mean())
    return found


@pytest.mark.parametrize("seed", [0, 1])
def test_the_calibration_and_refinement_parts_add_up_to_the_loss_and_equal_a_dense_cross_fit(seed):
    predictions = _predictions(seed=seed, sizes=(300, 50, 50))
    found = _analysed(predictions)
    calibration = analyze_predictions(predictions, only=["calibration"])["analyzers"]["calibration"]["splits"]["id"]
    dense = dense_refinement(predictions["id"]["logits"], predictions["id"]["labels"])
    for loss in ("nll", "brier"):
        entry = found["refinement"]["splits"]["id"][loss]
        assert entry["calibration"]["value"] + entry["refinement"]["value"] == pytest.approx(entry["loss"]["value"], abs=1e-12)
        assert entry["loss"]["value"] == pytest.approx(calibration[loss]["value"], abs=1e-12)
        for index, part in enumerate(("loss", "calibration", "refinement")):
            assert entry[part]["value"] == pytest.approx(dense[loss][index], abs=1e-8), (loss, part)  # scipy: β to ~1e-8
        assert "interval" in entry["refinement"] and entry["refinement"]["interval"]["low"] < entry["refinement"]["value"]
    split = Examples.of(without_ood_labels(predictions)["id"])
    counts = B.counts_of(B.draws("id", 300, 50), 300)
    for loss in ("nll", "brier"):  # every resample's parts add up too
        parts = R.parts("id", split, loss, counts)
        torch.testing.assert_close(parts["calibration"] + parts["refinement"], parts["loss"], rtol=0, atol=1e-12)


def test_a_resample_refits_the_fold_temperatures_to_second_order():
    """Each resample's refinement is that of temperatures refitted on its own counts (dense: scipy on the
    weighted losses), to second order in the refit; holding the fitted temperatures would be off far more."""
    predictions = _predictions(seed=3, sizes=(600, 50, 50))
    split = Examples.of(without_ood_labels(predictions)["id"])
    logits, labels = predictions["id"]["logits"], predictions["id"]["labels"]
    counts = B.counts_of(B.draws("id", 600, 6), 600)
    z = np.log(np.exp(dense_log_probs(logits)).mean(0))
    y = labels.numpy()
    fitted = R.fit("id", split)
    nll = lambda b, at: -log_softmax(b * z[at], -1)[np.arange(len(at)), y[at]]  # noqa: E731
    newton, held = [], []
    fast = R.parts("id", split, "nll", counts)["refinement"]
    for row in range(len(counts)):
        w = counts[row].numpy()
        refit, kept = 0.0, 0.0
        for repeat in range(4):
            fold = dense_folds(600, repeat=repeat)
            for j in range(5):
                fit, own = np.nonzero(fold != j)[0], np.nonzero(fold == j)[0]
                beta = minimize_scalar(lambda b: (w[fit] * nll(b, fit)).sum(), bounds=(1 / 50, 50), method="bounded",
                                       options={"xatol": 1e-10}).x
                refit += (w[own] * nll(beta, own)).sum() / 4
                kept += (w[own] * nll(float(fitted["nll"]["beta"][5 * repeat + j]), own)).sum() / 4
        newton.append(abs(float(fast[row]) - refit / w.sum()))
        held.append(abs(kept / w.sum() - refit / w.sum()))
    assert max(newton) < 2e-3 and np.mean(newton) < np.mean(held) / 3


def _population(temperature, n, rng):
    """n examples of a known population: 4 members' logits around shared base logits (10 classes), labels drawn from
    softmax(log p̄ / T): T = 1 is calibrated (its calibration part is 0), T > 1 over-confident."""
    base = 2.5 * rng.standard_normal((n, 10))
    logits = base[None] + 0.5 * rng.standard_normal((4, n, 10))
    z = np.log(softmax(logits, -1).mean(0))
    q = softmax(z / temperature, -1)
    labels = (q.cumsum(1) > rng.random((n, 1))).argmax(1)
    return torch.tensor(logits, dtype=torch.float32), torch.tensor(labels), z


@pytest.mark.parametrize("temperature", [1.0, 1.4])
def test_the_calibration_part_on_a_small_test_set_covers_the_populations_and_averages_its_fold_assignments(temperature):
    """On 359 examples (the digits test set) one fold assignment moves the calibration part by about its own interval;
    the part printed is the mean over 4 assignments (each kept in `assignments`), and its interval holds the
    population's calibration part — 0 for a calibrated population, E NLL(p̄) − min_T E NLL(p̄ at T) for an
    over-confident one, both on 200,000 examples — in at least 90 % of 30 test sets."""
    from ensdiag.stats.scaling import fit_temperature
    rng = np.random.default_rng(5)
    _, labels, z = _population(temperature, 200_000, rng)
    z, labels = torch.tensor(z), labels.clone()
    truth = (torch.nn.functional.cross_entropy(z, labels) - torch.nn.functional.cross_entropy(
        z / fit_temperature(z, labels), labels)).item()
    held, spread = 0, []
    for _ in range(30):
        logits, labels, _ = _population(temperature, 359, rng)
        predictions = {"id": {"logits": logits, "labels": labels}}
        metrics = analyze_predictions(predictions, only=["refinement"])
        add_intervals(metrics, predictions, only=["refinement"], detail=True)
        found = metrics["analyzers"]["refinement"]["splits"]["id"]["nll"]["calibration"]
        assert found["value"] == pytest.approx(np.mean(found["assignments"]), abs=1e-12)
        held += found["interval"]["low"] <= truth <= found["interval"]["high"]
        spread.append(np.ptp(found["assignments"]))
    assert held >= 27, (held, truth)
    assert np.mean(spread) > 0  # the assignments differ: one alone would print one of them


# ------------------------------------------------------------------ EPKL, RMI and ρ(AU, EU)

def test_epkl_rmi_and_the_uncertainty_identities_against_dense_sums():
    predictions = _predictions(k=5)
    found = _analysed(predictions)
    for name in ("id", "ood"):
        entry, dense = found["uncertainty"]["splits"][name], dense_uncertainty(predictions[name]["logits"])
        assert np.max(np.abs(dense["tu"] - (dense["au"] + dense["mi"]))) < 1e-12  # TU = AU + EU per example
        assert np.max(np.abs(dense["epkl"] - (dense["mi"] + dense["rmi"]))) < 1e-12  # EPKL = MI + RMI
        assert np.all(dense["epkl"] >= dense["mi"] - 1e-15)
        for key, dense_key in (("entropy", "tu"), ("expected_entropy", "au"), ("jsd", "mi"), ("epkl", "epkl"),
                               ("rmi", "rmi")):
            assert entry[key]["value"] == pytest.approx(dense[dense_key].mean(), abs=1e-12), (name, key)
        assert entry["entropy"]["value"] == pytest.approx(entry["expected_entropy"]["value"] + entry["jsd"]["value"],
                                                          abs=1e-12)
        assert entry["rmi"]["value"] == pytest.approx(entry["epkl"]["value"] - entry["jsd"]["value"], abs=1e-12)
        assert entry["spearman_au_eu"]["value"] == pytest.approx(stats.spearmanr(dense["au"], dense["mi"]).statistic,
                                                                 abs=1e-12)
    k = 5  # the member-pairs KL is the mean over i ≠ j of the same KL(p_i ‖ p_j): k/(k − 1) times EPKL
    pairs = analyze_predictions(predictions, only=["member-pairs"])["analyzers"]["member-pairs"]["splits"]["id"]["kl"]
    assert pairs["mean"]["value"] == pytest.approx(k / (k - 1) * found["uncertainty"]["splits"]["id"]["epkl"]["value"],
                                                   abs=1e-12)


def test_rank_correlation_of_resampled_examples_is_spearmans_of_the_repeated_examples():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 12, (200,), generator=g).double()  # ties
    y = x + 4 * torch.randn(200, generator=g, dtype=torch.float64)
    counts = B.counts_of(B.draws("id", 200, 5), 200)
    found = O.rank_correlation(x, y, counts)
    for row in range(5):
        repeat = counts[row].long().numpy()
        expected = stats.spearmanr(np.repeat(x.numpy(), repeat), np.repeat(y.numpy(), repeat)).statistic
        assert float(found[row]) == pytest.approx(expected, abs=1e-12)
    assert math.isnan(float(O.rank_correlation(torch.ones(10), y[:10])))  # one value: no ranking


def test_the_note_says_when_aleatoric_and_epistemic_parts_do_not_separate():
    g = torch.Generator().manual_seed(0)
    scale = torch.linspace(0.05, 4, 200)  # small: every member near uniform (high AU, no EU); large: confident, apart
    logits = scale[None, :, None] * torch.randn(4, 200, 5, generator=g)
    result = analyze_predictions({"id": {"logits": logits, "labels": torch.zeros(200, dtype=torch.long)}},
                                 only=["uncertainty"])["analyzers"]["uncertainty"]
    rho = result["splits"]["id"]["spearman_au_eu"]["value"]
    assert abs(rho) >= 0.8 and "do not separate" in result["note"] and f"id ρ = {rho:.2f}" in result["note"]
    apart = torch.randn(4, 200, 5, generator=g) * torch.rand(200, generator=g)[None, :, None] * 3 \
        + 3 * torch.randn(1, 200, 5, generator=g) * torch.rand(200, generator=g)[None, :, None]
    result = analyze_predictions({"id": {"logits": apart, "labels": None}}, only=["uncertainty"])["analyzers"]["uncertainty"]
    rho = result["splits"]["id"]["spearman_au_eu"]["value"]
    assert (abs(rho) >= 0.8) == ("note" in result)


def test_one_member_has_no_epistemic_part_to_split():
    g = torch.Generator().manual_seed(0)
    result = analyze_predictions({"id": _split(g, 1, 30)}, only=NEW)["analyzers"]
    assert all(result["uncertainty"]["splits"]["id"][key]["value"] is None for key in ("jsd", "epkl", "rmi", "spearman_au_eu"))
    assert result["diversity-gap"]["status"] == "skipped" and result["disagreement-error"]["status"] == "skipped"
    assert result["refinement"]["status"] == "ok"  # a single model's loss splits too


# ------------------------------------------------------------------ the training sample the core predicts

def test_the_core_predicts_a_seeded_training_sample_where_labelled_training_data_are_given():
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 4, (1, 6, 6))
    g = torch.Generator().manual_seed(0)
    test = (torch.rand(60, 1, 6, 6, generator=g), torch.randint(0, 4, (60,), generator=g))
    train = (torch.rand(1300, 1, 6, 6, generator=g), torch.randint(0, 4, (1300,), generator=g))
    diagnosis = ensdiag.diagnose(model, test=test, train=train, measure=ensdiag.Measure(geometry=False))
    assert diagnosis.metrics["splits"]["train"]["n"] == TRAINING_SAMPLE
    assert "1,000 training examples (a seeded sample" in diagnosis.metrics["split_titles"]["train"]
    pick = seeded_sample(1300, TRAINING_SAMPLE)
    assert len(pick) == TRAINING_SAMPLE and torch.equal(diagnosis.predictions["train"]["labels"], train[1][pick])
    direct = ensdiag.diagnose(model, test=(train[0][pick], train[1][pick]), measure=ensdiag.Measure(geometry=False))  # the same examples as a test set
    found = diagnosis.metrics["analyzers"]["diversity-gap"]["splits"]["train"]["disagreement"]["value"]
    assert found == pytest.approx(direct.metrics["analyzers"]["diversity-gap"]["splits"]["id"]["disagreement"]["value"])
    without = ensdiag.diagnose(model, test=test, measure=ensdiag.Measure(geometry=False))
    assert "train" not in without.metrics["splits"]
    gap = without.metrics["analyzers"]["diversity-gap"]
    assert gap["disagreement_gap"]["value"] is None and "no training sample" in gap["disagreement_gap"]["note"]
    small = ensdiag.diagnose(model, test=test, train=(train[0][:70], train[1][:70]),
                             measure=ensdiag.Measure(geometry=False))
    assert small.metrics["splits"]["train"]["n"] == 70  # fewer than the sample: all of them


# ------------------------------------------------------------------ the report

@pytest.fixture
def three_methods(tmp_path):
    from ensdiag.config import preset_config
    from ensdiag.experiment import prepare_run_dir
    from ensdiag.io import atomic_write_json
    from ensdiag.predictions import save_predictions, with_pooled_shift
    config = preset_config("digits", methods=["single", "deep-ensemble", "batch-ensemble"], seeds=[1, 2, 3], epochs=2)
    out = tmp_path / "run"
    prepare_run_dir(out, config, ["ensdiag", "train"])
    for method, k in (("single", 1), ("deep-ensemble", 3), ("batch-ensemble", 3)):
        for seed in (1, 2, 3):
            folder = out / method / f"seed-{seed}"
            predictions = _predictions(k=k, seed=seed)
            if method == "batch-ensemble":  # members diverse on their training data only
                train = predictions["train"]["logits"]
                predictions["train"]["logits"] = train + 6 * torch.randn(train.shape, generator=torch.Generator().manual_seed(seed))
            save_predictions(predictions, folder / "predictions.safetensors")
            metrics = analyze_predictions(with_pooled_shift(predictions))
            atomic_write_json(folder / "metrics.json", metrics)
            atomic_write_json(folder / "meta.json", {"parameters": 1000 * k, "train_seconds": 2.0})
            (folder / "history.jsonl").write_text(json.dumps({"epoch": 1, "loss": 1.0}) + "\n")
    return out


def _table(report, table_id):
    return next(table for table in report["tables"] if table["id"] == table_id)


def _seed_values(run_dir, method, *path):
    return [json.loads((run_dir / method / f"seed-{seed}" / "metrics.json").read_text())["analyzers"] for seed in (1, 2, 3)]


def test_the_report_flags_a_gap_above_the_deep_ensembles_and_splits_each_gain(three_methods):
    from ensdiag.report import make_report
    report = make_report(three_methods, write=False)
    gap = _table(report, "diversity-gap")
    assert "Flagged" in gap["note"] and "BatchEnsemble: disagreement gap" in gap["note"]
    assert "learner collusion" in gap["note"]
    gain = _table(report, "refinement-gain")
    names = [column["name"] for column in gain["columns"]]
    assert [row["method"] for row in gain["rows"]] == ["deep-ensemble", "batch-ensemble"]
    for row in gain["rows"]:
        runs = {method: _seed_values(three_methods, method) for method in ("single", row["method"])}
        for label, loss, part in (("NLL: from calibration", "nll", "calibration"), ("Brier: from refinement", "brier",
                                                                                       "refinement")):
            expected = np.mean([runs["single"][s]["refinement"]["splits"]["id"][loss][part]["value"]
                                - runs[row["method"]][s]["refinement"]["splits"]["id"][loss][part]["value"] for s in range(3)])
            assert row["cells"][names.index(label)]["mean"] == pytest.approx(expected, abs=1e-12)
        for loss in ("NLL", "Brier"):  # the gain splits exactly into its two parts, seed by seed and so in the mean
            whole, parts = (row["cells"][names.index(f"{loss} gain")]["mean"],
                            sum(row["cells"][names.index(f"{loss}: from {part}")]["mean"] for part in ("calibration", "refinement")))
            assert whole == pytest.approx(parts, abs=1e-12)
    assert _table(report, "disagreement-error")["note"].startswith("D/E")
    for table_id in ("refinement", "uncertainty"):
        assert _table(report, table_id)["rows"]


def test_the_new_numbers_are_exported_by_their_flat_names(three_methods):
    from ensdiag.export import flat_metrics
    metrics = json.loads((three_methods / "deep-ensemble" / "seed-1" / "metrics.json").read_text())
    found = flat_metrics(metrics)
    for name in ("diversity-gap/disagreement_gap", "diversity-gap/train/kl_diversity", "disagreement-error/id/ratio",
                 "refinement/id/nll/calibration", "refinement/id/brier/refinement", "uncertainty/id/epkl",
                 "uncertainty/ood/rmi", "uncertainty/shift/spearman_au_eu"):
        assert name in found, name
    assert found["diversity-gap/disagreement_gap"] == pytest.approx(
        metrics["analyzers"]["diversity-gap"]["disagreement_gap"]["value"])


def test_the_gap_flag_needs_intervals_wholly_above_the_deep_ensembles():
    """Hand-made cells: flagged only where the low end passes the Deep Ensemble's high end (strictly);
    touching or overlapping intervals are not flagged; a cell with no interval is named as not compared."""
    from ensdiag.report.diagnostics import gap_flags
    columns = [{"name": "disagreement gap (train − test)"}, {"name": "KL gap (train − test)"}]
    rows = [{"method": "deep-ensemble", "label": "Deep Ensemble",
             "cells": [{"mean": 0.02, "ci": 0.01}, {"mean": 0.01, "ci": 0.005}]},  # [0.01, 0.03], [0.005, 0.015]
            {"method": "batch-ensemble", "label": "BatchEnsemble",  # [0.04, 0.06] above; [0.01, 0.03] overlaps
             "cells": [{"mean": 0.05, "ci": 0.01}, {"mean": 0.02, "ci": 0.01}]},
            {"method": "mimo", "label": "MIMO",  # one seed: its run's interval [0.03, 0.05] touches 0.03; KL: none
             "cells": [{"mean": 0.04, "example": {"low": 0.03, "high": 0.05}}, {"mean": 0.3}]}]
    words = gap_flags({"columns": columns, "rows": rows})
    flagged, _, rest = words.partition("Not compared")
    assert "BatchEnsemble: disagreement gap (train − test) 0.050 [0.040, 0.060] against the Deep Ensemble's " \
           "[0.010, 0.030]" in flagged
    assert "KL gap" not in flagged and "MIMO" not in flagged and "Deep Ensemble:" not in flagged
    assert "MIMO (KL)" in rest
    rows[1]["cells"][0] = {"mean": 0.035, "ci": 0.01}  # [0.025, 0.045]: overlaps the Deep Ensemble's
    assert gap_flags({"columns": columns, "rows": rows}).startswith("No method's train − test gap exceeds")
    assert gap_flags({"columns": columns, "rows": rows[1:]}).startswith("No Deep Ensemble")


def test_no_training_sample_is_predicted_where_no_analyzer_asked_for_reads_it():
    from ensdiag.core.inspection import Measure, inspect
    from ensdiag.data.registry import Split
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 3, (1, 4, 4))
    g = torch.Generator().manual_seed(1)
    test = Split(torch.rand(30, 1, 4, 4, generator=g), torch.randint(0, 3, (30,), generator=g), "test")
    train = Split(torch.rand(50, 1, 4, 4, generator=g), torch.randint(0, 3, (50,), generator=g), "train")
    measured = {only: inspect(model, {"id": test}, train=train, measure=Measure(geometry=False, only=only))
                for only in (("calibration",), ("calibration", "diversity-gap"))}
    assert "train" not in measured[("calibration",)].predictions
    assert measured[("calibration", "diversity-gap")].predictions["train"]["logits"].shape[1] == 50
