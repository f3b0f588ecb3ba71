"""The effective ensemble size: the power law against SciPy, the temperatures, AUROC and calibrated
NLLs against dense re-implementations, the resamples against the loop over resamples, and on run
folders whose answer is known (a Deep Ensemble reads its own k; copies of one member read 1; j of its
members saved by `ensdiag analyze` as a method of the same folder read j)."""

import json
import math

import numpy as np
import pytest
import torch

from ensdiag.stats import scaling as S
from ensdiag.stats import weighted as W
from ensdiag.stats.examples import Examples
from ensdiag.predictions import save_predictions
from ensdiag.report.load import load_runs
from ensdiag.seeds import effective_size as E
from ensdiag.seeds.across import Seed, load_seeds

from .cli import run_cli


def sizes_of(root) -> dict:
    """The effective sizes of a run folder's methods, its predictions read as a report reads them."""
    return E.effective_sizes(load_seeds(load_runs(root)["runs"])[0])

K, CLASSES = 4, 5


def exchangeable(k, n, generator, noise=1.0, signal=1.5):
    """k members that are equally good by construction: member i predicts on example x what a base
    model predicts on another example of x's class (a permutation within each class), so every
    member holds the same (logits, label) pairs, and so the same calibrated NLL, while they disagree."""
    labels = torch.arange(n) % CLASSES
    base = noise * torch.randn(n, CLASSES, generator=generator) + signal * torch.nn.functional.one_hot(labels, CLASSES)
    members = []
    for _ in range(k):
        order = torch.arange(n)
        for c in range(CLASSES):
            where = (labels == c).nonzero().flatten()
            order[where] = where[torch.randperm(len(where), generator=generator)]
        members.append(base[order])
    return torch.stack(members), labels


def grid_runs(seeds=(1, 2, 3), n=600, n_val=300, members=2 * K, ood=True):
    """{seed: {"test", "val", "ood"}}: a pool of exchangeable members per seed (a Deep Ensemble takes the first K)."""
    found = {}
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        test, val = exchangeable(members, n, generator), exchangeable(members, n_val, generator)
        found[seed] = {"test": test, "val": val,
                       "ood": 0.8 * torch.randn(members, n // 2, CLASSES, generator=generator) if ood else None}
    return found


def write_folder(root, methods: dict, pool: dict, validation=True):
    """A diagnosis run folder: {method: members of the pool (a list of indices)}."""
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps({
        "format": "ensdiag.experiment/1", "kind": "diagnosis",
        "config": {"preset": "custom", "methods": list(methods), "seeds": list(pool)},
        "splits": {"id": "test", "ood": "ood"}, "skipped": {"shift": "none"}}))
    for method, chosen in methods.items():
        for seed, data in pool.items():
            splits = {"id": {"logits": data["test"][0][chosen], "labels": data["test"][1]}}
            if validation:
                splits["val"] = {"logits": data["val"][0][chosen], "labels": data["val"][1]}
            if data["ood"] is not None:
                splits["ood"] = {"logits": data["ood"][chosen], "labels": None}
            folder = root / method / f"seed-{seed}"
            folder.mkdir(parents=True)
            save_predictions(splits, folder / "predictions.safetensors")
            (folder / "metrics.json").write_text(json.dumps({"analyzers": {}, "splits": {s: {"n": 1} for s in splits}}))
            (folder / "meta.json").write_text(json.dumps({"run": method, "seed": seed}))
    return root


# ---------------------------------------------------------------- the power law


def curve(sizes, a, b, c) -> torch.Tensor:
    """a + b·n^(−c) [B, len(sizes)] of fitted laws (a, b, c each [B])."""
    return a[:, None] + b[:, None] * torch.as_tensor(sizes, dtype=torch.float64)[None] ** -c[:, None]


@pytest.mark.parametrize("k", [3, 4, 5, 7])
def test_the_fit_is_scipys_least_squares_of_the_law_through_the_ends(k):
    from scipy.optimize import curve_fit
    rng = np.random.default_rng(k)
    sizes = np.arange(1, k + 1.0)
    for _ in range(4):
        a, b, c = rng.uniform(0.1, 0.5), rng.uniform(0.05, 0.3), rng.uniform(0.3, 2.5)
        y = a + b * sizes ** -c + rng.normal(0, 0.002, k)

        def law(n, exponent):  # a and b pinned by the ends, as the fit pins them
            slope = (y[0] - y[-1]) / (1 - k ** -exponent)
            return y[0] - slope + slope * n ** -exponent
        def error(exponent):
            return ((law(sizes, exponent) - y) ** 2).sum()
        (expected,), _ = curve_fit(law, sizes, y, p0=[c], bounds=(E.C_LOW, E.C_HIGH), xtol=1e-14, ftol=1e-14)
        fa, fb, fc = E.fit(torch.tensor(y)[None])
        assert error(fc.item()) <= error(expected) + 1e-15  # at least as good a least-squares fit as SciPy's
        assert law(sizes, fc.item()).tolist() == pytest.approx(law(sizes, expected).tolist(), abs=2e-5)  # (c is flat)
        assert curve([1, k], fa, fb, fc)[0].tolist() == pytest.approx([y[0], y[-1]], abs=1e-12)
        assert curve(sizes, fa, fb, fc)[0].tolist() == pytest.approx(law(sizes, fc.item()).tolist(), abs=1e-12)


def test_with_three_sizes_the_law_passes_through_all_three():
    from scipy.optimize import brentq
    y = np.array([0.5, 0.4, 0.37])
    ratio = (y[0] - y[1]) / (y[0] - y[2])  # = (1 − 2^−c) / (1 − 3^−c)
    expected = brentq(lambda c: (1 - 2 ** -c) / (1 - 3 ** -c) - ratio, E.C_LOW, E.C_HIGH, xtol=1e-14)
    a, b, c = E.fit(torch.tensor(y)[None])
    assert c.item() == pytest.approx(expected, rel=1e-6)


def test_two_sizes_fix_the_exponent_at_one_and_sizes_are_read_back():
    a, b, c = E.fit(torch.tensor([[0.5, 0.4]]))
    assert c.item() == 1.0 and (a + b).item() == pytest.approx(0.5) and (a + b / 2).item() == pytest.approx(0.4)
    a, b, c = E.fit(torch.tensor([[0.5, 0.42, 0.39, 0.375]]))
    for n in (1.0, 1.7, 3.2, 4.0, 9.5):
        assert E.size_at(curve([n], a, b, c)[:, 0], a, b, c).item() == pytest.approx(n, rel=1e-9)
    assert E.size_at(0.6, a, b, c).item() == 1.0  # worse than one member
    assert E.size_at(a - 0.01, a, b, c).item() == math.inf  # better than the curve's limit
    assert math.isnan(E.size_at(0.3, torch.tensor([0.3]), torch.tensor([-0.1]), c).item())  # a curve that rises


def test_solve_reads_the_mean_of_the_seeds_curves_at_the_mean_value():
    """Against SciPy's root finder on the equation written out."""
    from scipy.optimize import brentq
    rng = np.random.default_rng(0)
    a, b, c = rng.uniform(0.1, 0.2, 3), rng.uniform(0.1, 0.3, 3), rng.uniform(0.5, 1.5, 3)
    values = rng.uniform(0.25, 0.3, 3)
    expected = math.exp(brentq(lambda log_n: np.mean(a + b * np.exp(-c * log_n)) - values.mean(), 0, 30, xtol=1e-13))
    found = E.solve(torch.tensor(values)[None], torch.tensor(a)[None], torch.tensor(b)[None], torch.tensor(c)[None])
    assert found.item() == pytest.approx(expected, rel=1e-8)
    weights = torch.tensor([[2.0, 1.0, 0.0]])  # a resample that drew seed 0 twice, seed 1 once
    mean = lambda x: (2 * x[0] + x[1]) / 3  # noqa: E731
    expected = math.exp(brentq(lambda log_n: mean(a + b * np.exp(-c * log_n)) - mean(values), 0, 30, xtol=1e-13))
    found = E.solve(torch.tensor(values)[None], torch.tensor(a)[None], torch.tensor(b)[None], torch.tensor(c)[None],
                    weights)
    assert found.item() == pytest.approx(expected, rel=1e-8)


def test_the_seed_interval_is_where_scipys_paired_t_test_stops_rejecting():
    from scipy import stats
    from scipy.optimize import brentq

    from ensdiag.seeds.stats import t_quantile
    rng = np.random.default_rng(1)
    a, b, c = 0.1 + 0.01 * rng.standard_normal(4), 0.2 + 0.02 * rng.standard_normal(4), np.full(4, 0.9)
    values = a + b * 2.5 ** -c + 0.004 * rng.standard_normal(4)  # about 2.5 members, seed to seed

    def pvalue(n):
        return stats.ttest_1samp(values - a - b * n ** -c, 0.0).pvalue - 0.05
    low, high = E.seed_interval(values, a, b, c, t_quantile(4))
    point = E.solve(torch.tensor(values)[None], torch.tensor(a)[None], torch.tensor(b)[None], torch.tensor(c)[None]).item()
    assert low < point < high
    assert low == pytest.approx(brentq(pvalue, 1.0, point), rel=1e-6) if pvalue(1.0) < 0 else low == 1.0
    assert high == pytest.approx(brentq(pvalue, point, 1e4), rel=1e-6) if pvalue(1e4) < 0 else high == math.inf
    assert E.seed_interval(values[:1], a[:1], b[:1], c[:1], 12.7) is None  # one seed: no spread to test


# ---------------------------------------------------------------- the per-example pieces


def test_auroc_is_the_tables_auroc_and_scikit_learns_under_resample_weights():
    from sklearn.metrics import roc_auc_score

    from ensdiag.stats import bootstrap as B
    generator = torch.Generator().manual_seed(2)
    score_id = torch.randn(80, generator=generator).round(decimals=1)  # ties within and across the two sets
    score_ood = (torch.randn(50, generator=generator) + 0.7).round(decimals=1)
    w_id, w_ood = B.counts_of(B.draws("id", 80, 30), 80), B.counts_of(B.draws("ood", 50, 30), 50)
    found = W.auroc(score_id, score_ood, w_id, w_ood)
    assert torch.allclose(found, W.ood_metrics(score_id, score_ood, w_id, w_ood)["auroc"], atol=1e-12)  # the tie-group pass
    truth = np.r_[np.zeros(80), np.ones(50)]
    for r in range(0, 30, 7):
        expected = roc_auc_score(truth, np.r_[score_id, score_ood], sample_weight=np.r_[w_id[r], w_ood[r]])
        assert found[r].item() == pytest.approx(expected, abs=1e-12)
    assert W.auroc(score_id, score_ood).item() == pytest.approx(roc_auc_score(truth, np.r_[score_id, score_ood]))


def test_subsets_are_all_of_them_or_a_reproducible_sample():
    assert E.subsets(3) == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]
    sampled = E.subsets(10, limit=20)
    assert E.subsets(10, limit=20) == sampled
    by_size = {n: [s for s in sampled if len(s) == n] for n in range(1, 11)}
    assert [len(by_size[n]) for n in range(1, 11)] == [10, 20, 20, 20, 20, 20, 20, 20, 10, 1]
    assert all(len(set(chosen)) == len(chosen) for chosen in by_size.values())


def test_a_sub_ensembles_per_example_quantities_are_those_of_its_members_alone():
    """The sizes read the tables' definitions (Examples): a sub-ensemble shares its split's log-probabilities
    and gives what its members' own logits give, NLL, Brier and confidence alike."""
    logits, labels = exchangeable(4, 50, torch.Generator().manual_seed(1))
    split = Examples(logits, labels)
    for members in E.subsets(4):
        part, alone = split.subset(members), Examples(logits[list(members)], labels)
        for name in ("log_mean", "nll", "brier", "confidence"):
            assert torch.equal(getattr(part, name), getattr(alone, name)), (members, name)
    assert E.per_example(Seed(split), [(0, 2)])["brier"][0].tolist() == pytest.approx(
        ((torch.softmax(logits[[0, 2]].double(), -1).mean(0) - torch.eye(CLASSES, dtype=torch.float64)[labels]) ** 2)
        .sum(-1).tolist(), abs=1e-12)


@pytest.mark.parametrize("validation", [True, False])
def test_calibrated_nll_of_each_sub_ensemble_is_the_dense_computation(validation):
    """T fitted on the validation split, or (without one) cross-fitted on the test set: each fold of each
    assignment scored with the T fitted on the other folds, the assignments averaged; the NLL of softmax(log p̄ / T)
    written out with torch's cross-entropy, one sub-ensemble and fold at a time."""
    generator = torch.Generator().manual_seed(4)
    (logits, labels), (val_logits, val_labels) = exchangeable(3, 120, generator), exchangeable(3, 60, generator)
    run = Seed(Examples(logits, labels), Examples(val_logits, val_labels) if validation else None)
    chosen = E.subsets(3)
    found = E.per_example(run, chosen)["cnll"]
    for index, members in enumerate(chosen):
        def pooled(z):
            return torch.log(torch.softmax(z[list(members)].double(), -1).mean(0))
        if validation:
            t = [torch.full((120,), S.fit_temperature(pooled(val_logits), val_labels))]
        else:
            t = []
            for repeat in range(S.REPEATS):
                fold, _ = S.folds("id", 120, repeat=repeat)
                t.append(torch.stack([torch.tensor(S.fit_temperature(pooled(logits)[fold != j], labels[fold != j]))
                                      for j in range(S.FOLDS)])[fold])
        expected = sum(torch.nn.functional.cross_entropy(pooled(logits) / each[:, None], labels, reduction="none")
                       for each in t) / len(t)
        assert torch.allclose(found[index], expected, atol=1e-6), members


def test_the_resampled_curves_are_the_loop_over_resamples(tmp_path):
    """Every resample's sub-ensemble means (weighted by the examples' counts) equal the plain mean
    over that resample's drawn examples, and the counts are the cells' draws (bootstrap.Draws)."""
    from ensdiag.stats import bootstrap as B
    data = grid_runs(seeds=(1,), n=90, n_val=40)[1]
    run = Seed(Examples(data["test"][0][:3], data["test"][1]), Examples(data["val"][0][:3], data["val"][1]),
               Examples(data["ood"][:3], None))
    values = E.per_example(run, E.subsets(3))
    draws = B.Draws()
    w_id, w_ood = draws.counts("id", 90, 0, 50), draws.counts("ood", 45, 0, 50)
    found = E._resampled(values, w_id, w_ood)
    rows, rows_ood = B.draws("id", 90, 50), B.draws("ood", 45, 50)
    for r in range(0, 50, 9):
        assert found["cnll"][r].tolist() == pytest.approx(values["cnll"][:, rows[r]].mean(1).tolist(), rel=1e-12)
        assert found["brier"][r].tolist() == pytest.approx(values["brier"][:, rows[r]].mean(1).tolist(), rel=1e-12)
        plain = [W.ood_metrics(i[rows[r]], o[rows_ood[r]], only=("auroc",))["auroc"].item()
                 for i, o in zip(values["id_score"], values["ood_score"])]
        assert (1 - found["auroc"][r]).tolist() == pytest.approx(plain, abs=1e-12)


# ---------------------------------------------------------------- run folders whose answer is known


@pytest.fixture(scope="module")
def pool():
    return grid_runs()


@pytest.fixture(scope="module")
def known(pool, tmp_path_factory):
    root = write_folder(tmp_path_factory.mktemp("sizes") / "run", {
        "deep-ensemble": list(range(K)), "copies": [0] * K, "other": list(range(K, 2 * K)),
        "eight": list(range(2 * K))}, pool)
    return sizes_of(root)


def test_a_deep_ensemble_reads_its_own_size_and_copies_of_one_member_read_one(known):
    deep, copies = known["deep-ensemble"]["cnll"], known["copies"]["cnll"]
    assert deep["value"] == pytest.approx(K, rel=1e-9) and deep["interval"][0] <= K <= deep["interval"][1]
    assert copies["value"] == pytest.approx(1.0, abs=1e-6) and copies["interval"][0] == 1.0
    assert f"{copies['value']:.2f}" == "1.00" and not copies["extrapolated"]
    assert known["deep-ensemble"]["temperature"] == "validation" and known["copies"]["members"] == K
    for metric in ("brier", "auroc"):  # the other scores read the same sizes
        assert known["deep-ensemble"][metric]["value"] == pytest.approx(K, rel=1e-9)
        assert known["copies"][metric]["value"] == pytest.approx(1.0, abs=0.05)


def test_another_deep_ensemble_reads_about_its_size_and_a_larger_one_is_extrapolated(known):
    """Another Deep Ensemble of K reads about K; one of 2K reads beyond K, said to be extrapolated, and
    on the Brier score (whose law a + b/n is exact for members alike given the input) about 2K."""
    other, eight = known["other"]["cnll"], known["eight"]["brier"]
    assert other["interval"][0] <= K <= other["interval"][1] and abs(other["value"] - K) < 1.0
    assert eight["extrapolated"] and eight["value"] > K and eight["interval"][0] <= 2 * K <= eight["interval"][1]
    assert known["eight"]["cnll"]["extrapolated"] and known["eight"]["cnll"]["value"] > K


@pytest.mark.parametrize("j", [2, 3])
def test_j_of_the_deep_ensembles_members_saved_by_analyze_read_j(pool, tmp_path, capsys, j):
    """The Deep Ensemble's predictions and a file holding j of its members, each saved with
    `ensdiag analyze --method NAME --seed N --out FOLDER` as a method of one run folder; the report's
    effective size of the j members is j ± 0.2, and its JSON and summary carry it."""
    root = tmp_path / "run"
    for seed, data in pool.items():
        for method, chosen in (("deep-ensemble", list(range(K))), ("subset", list(range(j)))):
            path = tmp_path / f"{method}-{seed}.npz"
            np.savez(path, **{"id/logits": data["test"][0][chosen].numpy(), "id/labels": data["test"][1].numpy(),
                              "val/logits": data["val"][0][chosen].numpy(), "val/labels": data["val"][1].numpy()})
            code, _, err = run_cli(capsys, "analyze", path, "--method", method, "--seed", seed, "--out", root)
            assert code == 0, err
    code, out, err = run_cli(capsys, "report", root, "--format", "json", "--no-figures")
    assert code == 0, err
    found = json.loads(out)["effective_size"]["subset"]
    assert found["members"] == j and abs(found["cnll"]["value"] - j) <= 0.2, found["cnll"]
    table = next(table for table in json.loads(out)["tables"] if table["id"] == "effective-size")
    assert [row["method"] for row in table["rows"]] == ["deep-ensemble", "subset"]
    code, out, err = run_cli(capsys, "report", root, "--format", "summary", "--no-figures")
    assert code == 0 and f"subset (k = {j}) ≡ a Deep Ensemble of {found['cnll']['value']:.1f} [" in out


def test_without_a_validation_split_the_test_set_fits_the_temperature_and_the_report_says_so(pool, tmp_path):
    from ensdiag.report import make_report
    root = write_folder(tmp_path / "run", {"deep-ensemble": list(range(K)), "copies": [1] * K}, pool, validation=False)
    report = make_report(root, write=False)
    assert report["effective_size"]["copies"]["temperature"] == "cross-validation"
    assert report["effective_size"]["copies"]["cnll"]["value"] == pytest.approx(1.0, abs=0.1)
    note = next(table for table in report["tables"] if table["id"] == "effective-size")["note"]
    assert "cross-fitted on the test set" in note


def test_a_member_without_an_error_on_the_folds_its_temperature_is_fitted_on_keeps_its_predictions(pool, tmp_path):
    """A member that makes one error on the whole test set: in every fold assignment, the fold holding that error is
    scored with a T fitted on examples without any error, whose minimum runs to T = 0.02 (every prediction sharpened
    to certainty) and turns that one error's loss into ~50 times itself. Such a fit keeps T = 1 and the report says
    so; the member's calibrated NLL stays its plain NLL there, and the Deep Ensemble still gets its size."""
    from ensdiag.report import make_report
    sharp = {}
    for seed, data in pool.items():
        logits, labels = data["test"]
        member = 6 * torch.nn.functional.one_hot(labels, CLASSES).float() + 0.3 * logits[0]
        member[0] = 6 * torch.nn.functional.one_hot((labels[0] + 1) % CLASSES, CLASSES).float()  # its one error
        sharp[seed] = {**data, "test": (torch.cat([logits, member[None]]), labels),
                       "ood": torch.cat([data["ood"], data["ood"][:1]])}
    last = len(pool[1]["test"][0])  # the sharp member's place in the pool
    root = write_folder(tmp_path / "run", {"deep-ensemble": list(range(K)), "sharp": [last]}, sharp, validation=False)
    report = make_report(root, write=False)
    found = report["effective_size"]["sharp"]
    assert "had no error (or no correct prediction) to fit a temperature on: T = 1 there" in found["temperature_note"]
    assert report["effective_size"]["deep-ensemble"]["cnll"]["value"] == pytest.approx(K, rel=1e-6)
    run = Seed(Examples(sharp[1]["test"][0][last:], sharp[1]["test"][1]))
    cnll = E.per_example(run, [(0,)])["cnll"][0]
    plain = torch.nn.functional.cross_entropy(run.id.logits[0].double(), run.id.labels, reduction="none")
    assert cnll[0].item() == pytest.approx(plain[0].item(), rel=1e-9) and cnll.mean() < 2 * plain.mean()


def test_no_size_without_a_deep_ensemble_or_where_its_curve_does_not_fall(pool, tmp_path):
    root = write_folder(tmp_path / "a", {"copies": [0] * K}, pool)
    assert sizes_of(root) == {}
    root = write_folder(tmp_path / "b", {"deep-ensemble": [0] * K, "copies": [0] * K}, pool)  # identical members
    found = sizes_of(root)["copies"]["cnll"]
    assert found["value"] is None and "does not improve with every member" in found["reason"]


def test_on_ensdiags_own_training_a_single_run_is_not_told_from_one_deep_ensemble_member(tmp_path):
    """A known answer on real training: a `single` run is distributed as one Deep-Ensemble member (each member
    stops on its own, as the single run does), so its effective size's interval holds 1."""
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    from ensdiag.report import make_report
    config = preset_config("digits", methods=["single", "deep-ensemble"], seeds=[1, 2], epochs=10, members=3)
    run_experiment(config, tmp_path / "run", "data", quiet=True)
    found = make_report(tmp_path / "run", write=False)["effective_size"]["single"]["cnll"]
    assert found["interval"][0] <= 1.0 <= found["interval"][1], found


@pytest.mark.slow
def test_a_deep_ensemble_of_independent_single_runs_saved_by_analyze_gets_its_size(tmp_path, capsys):
    """The population the effective size assumes, made by ensdiag's own training: each Deep-Ensemble seed is K
    independent `single` runs, and the single model another one; each saved with `ensdiag analyze --method`
    from its test predictions alone (no validation split: T is cross-fitted on the test set, where an accurate
    sub-ensemble's fit set can hold no error). The Deep Ensemble reads K and the single run's interval holds 1."""
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    from ensdiag.io import read_safetensors
    seeds = list(range(1, 3 * (K + 1) + 1))
    run_experiment(preset_config("digits", methods=["single"], seeds=seeds), tmp_path / "singles", "data", quiet=True)
    logits = {seed: read_safetensors(tmp_path / "singles" / "single" / f"seed-{seed}" / "predictions.safetensors",
                                     "predictions")[0] for seed in seeds}
    root = tmp_path / "assembled"
    for group in range(3):
        first = 1 + group * (K + 1)
        for method, chosen in (("deep-ensemble", range(first, first + K)), ("single", [first + K])):
            path = tmp_path / f"{method}-{group}.npz"
            np.savez(path, **{"id/logits": torch.cat([logits[seed]["id/logits"] for seed in chosen]).numpy(),
                              "id/labels": logits[first]["id/labels"].numpy()})
            code, _, err = run_cli(capsys, "analyze", path, "--method", method, "--seed", group, "--out", root)
            assert code == 0, err
    code, out, err = run_cli(capsys, "report", root, "--format", "json", "--no-figures")
    assert code == 0, err
    sizes = json.loads(out)["effective_size"]
    assert sizes["deep-ensemble"]["temperature"] == "cross-validation"
    assert sizes["deep-ensemble"]["cnll"]["value"] == pytest.approx(K, rel=1e-6), sizes["deep-ensemble"]["cnll"]
    single = sizes["single"]["cnll"]
    low, high = single["interval"]  # an open upper end (∞) is null in the JSON
    assert single["value"] is not None and low <= 1.0 and (high is None or 1.0 <= high), single
