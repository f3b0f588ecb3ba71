"""The verdict: shares of the Deep Ensemble's gain, on constructed runs whose answer is known,
reproducible intervals, and the sentences in every report format."""

import json
import math

import pytest
import torch

from ensdiag.predictions import save_predictions
from ensdiag.report.load import load_runs
from ensdiag.seeds.across import load_seeds, read_seed
from ensdiag.seeds.verdict import verdict
from ensdiag.report.verdict_text import answer, sentence

from .cli import run_cli

N = 40


def verdict_of(root):
    return verdict(load_seeds(load_runs(root)["runs"])[0])


def constant_logits(k, p_label, classes=2):
    """k identical members giving the label (class 0) probability p_label on every example."""
    row = torch.tensor([math.log(p_label), math.log(1 - p_label)])
    return row.expand(k, N, classes).clone()


def write_run(root, methods, seeds=(1, 2)):
    """A run folder whose methods' predictions are given: {run name: (k, p_label)}, p_label one
    number for every seed or one per seed."""
    from ensdiag.config import preset_config
    config = preset_config("digits", methods=list(methods), seeds=list(seeds))
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps({"format": "ensdiag.experiment/1", "config": config.to_dict()}))
    for run, (k, p) in methods.items():
        for index, seed in enumerate(seeds):
            folder = root / run / f"seed-{seed}"
            folder.mkdir(parents=True)
            labels = torch.zeros(N, dtype=torch.long)
            p_seed = p[index] if isinstance(p, (list, tuple)) else p
            save_predictions({"id": {"logits": constant_logits(k, p_seed), "labels": labels}}, folder / "predictions.safetensors")
            (folder / "metrics.json").write_text(json.dumps({"analyzers": {}, "splits": {"id": {"n": N}}}))
            (folder / "meta.json").write_text(json.dumps({"run": run, "seed": seed}))
    return root


def test_a_method_halfway_between_single_and_deep_ensemble_gets_half_the_nll_gain(tmp_path):
    midway = math.sqrt(0.6 * 0.9)  # −log p halfway between −log 0.6 and −log 0.9
    root = write_run(tmp_path / "run", {"single": (1, 0.6), "deep-ensemble": (3, 0.9), "batch-ensemble": (3, midway)})
    found = verdict_of(root)
    entry = found["batch-ensemble"]
    assert entry["nll"]["value"] == pytest.approx(0.5) and entry["nll"]["interval"] == pytest.approx([0.5, 0.5])
    assert entry["seeds"] == 2
    assert entry["diversity"]["value"] is None  # identical members: the Deep Ensemble has no diversity to compare with
    assert verdict_of(root) == found  # a fixed generator: the same intervals every time


def test_no_share_is_given_when_the_deep_ensemble_gains_nothing(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.7), "deep-ensemble": (3, 0.7), "batch-ensemble": (3, 0.8)})
    entry = verdict_of(root)["batch-ensemble"]
    assert entry["nll"]["value"] is None and entry["nll"]["reference_gain"] == pytest.approx(0.0)
    assert entry["nll"]["undetermined"] == "no gain"
    assert "No share of the NLL and ECE gains: the Deep Ensemble gains nothing" in sentence("BatchEnsemble", entry)


def _fieller_by_inverting_the_paired_t_test(a, b, level=0.95):
    """The ρ where SciPy's paired t-test of a − ρ·b = 0 has p = 1 − level, found by root search on
    either side of mean(a)/mean(b): an independent computation of Fieller's interval."""
    from scipy import optimize, stats
    a, b = torch.tensor(a, dtype=torch.float64).numpy(), torch.tensor(b, dtype=torch.float64).numpy()
    estimate = a.mean() / b.mean()
    pvalue = lambda rho: stats.ttest_1samp(a - rho * b, 0.0).pvalue - (1 - level)  # noqa: E731
    step = 1.0
    while pvalue(estimate - step) > 0 or pvalue(estimate + step) > 0:
        step *= 2
        assert step < 1e6, "unbounded"
    return [optimize.brentq(pvalue, estimate - step, estimate, xtol=1e-12),
            optimize.brentq(pvalue, estimate, estimate + step, xtol=1e-12)]


@pytest.mark.parametrize("seed", range(6))
def test_fieller_equals_the_inverted_paired_t_test(seed):
    from ensdiag.seeds.stats import fieller
    generator = torch.Generator().manual_seed(seed)
    n = 3 + seed
    b = (1.0 + 0.2 * torch.randn(n, generator=generator, dtype=torch.float64)).tolist()
    a = [0.4 * value + 0.1 * noise for value, noise in zip(b, torch.randn(n, generator=generator, dtype=torch.float64))]
    assert fieller(a, b) == pytest.approx(_fieller_by_inverting_the_paired_t_test(a, b), abs=1e-8)


def test_fieller_gives_no_interval_when_the_denominator_is_not_told_from_zero():
    from ensdiag.seeds.stats import fieller
    assert fieller([0.5, 0.4, 0.6], [0.3, -0.2, 0.1]) is None  # mean 0.067, t-interval holds 0: unbounded
    assert fieller([1.0], [2.0]) is None  # one pair: no spread to speak of
    assert fieller([1.0, 1.0], [2.0, 2.0]) == pytest.approx([0.5, 0.5])


def test_every_printed_share_interval_holds_fiellers_interval_for_the_ratio_of_means(tmp_path):
    """Per-seed shares 4 %, 83 %, 83 % (the case a reviewer found): the bootstrap alone gave
    [4 %, 98 %]; the interval printed must hold Fieller's for the printed ratio of means (here the
    Deep Ensemble's gain is the same every seed, so it is Student-t's over the per-seed shares), and
    an interval that straddles the lines answers nothing."""
    single, deep = 0.6, 0.9
    shares = [0.04, 0.83, 0.83, 0.5, 0.6, 0.55]
    method = [math.exp(math.log(single) + share * (math.log(deep) - math.log(single))) for share in shares]
    for seeds, picked in (((1, 2, 3), method[:3]), ((1, 2, 3), method[3:])):
        root = write_run(tmp_path / f"run-{picked[0]:.4f}", {"single": (1, single), "deep-ensemble": (3, deep),
                                                           "batch-ensemble": (3, picked)}, seeds=seeds)
        entry = verdict_of(root)["batch-ensemble"]["nll"]
        gain = math.log(deep) - math.log(single)
        mine = [math.log(p) - math.log(single) for p in picked]
        low, high = _fieller_by_inverting_the_paired_t_test(mine, [gain] * 3)
        assert entry["interval"][0] <= low + 1e-6 and entry["interval"][1] >= high - 1e-6  # float32 logits
        assert entry["value"] == pytest.approx(sum(mine) / 3 / gain, abs=1e-6)
        from ensdiag.seeds.stats import settles
        assert entry["answer"] == settles(entry["interval"])
        if low < 0.5 < high:
            assert entry["answer"] == "unsettled"


def _spread_logits(k, p_label, spread, n=N):
    """k members whose label probabilities are p_label ± spread (member i: evenly spaced), every example alike."""
    rows = []
    for i in range(k):
        p = p_label + spread * ((i - (k - 1) / 2) / max((k - 1) / 2, 1))
        rows.append(torch.tensor([math.log(p), math.log(1 - p)]).expand(n, 2))
    return torch.stack(rows).clone()


def write_spread_run(root, methods, seeds=(1, 2, 3)):
    """{run: (k, p_label or [p_label per seed], [spread per seed])}: members that disagree, by seed."""
    from ensdiag.config import preset_config
    config = preset_config("digits", methods=list(methods), seeds=list(seeds))
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps({"format": "ensdiag.experiment/1", "config": config.to_dict()}))
    for run, (k, p, spreads) in methods.items():
        for index, (seed, spread) in enumerate(zip(seeds, spreads)):
            folder = root / run / f"seed-{seed}"
            folder.mkdir(parents=True)
            p_seed = p[index] if isinstance(p, (list, tuple)) else p
            save_predictions({"id": {"logits": _spread_logits(k, p_seed, spread), "labels": torch.zeros(N, dtype=torch.long)}},
                             folder / "predictions.safetensors")
            (folder / "metrics.json").write_text(json.dumps({"analyzers": {}, "splits": {"id": {"n": N}}}))
            (folder / "meta.json").write_text(json.dumps({"run": run, "seed": seed}))
    return root


def test_a_diversity_far_below_the_deep_ensembles_reads_like_a_single_model_while_its_gains_are_open(tmp_path):
    root = write_spread_run(tmp_path / "run", {"single": (1, 0.7, [0, 0, 0]),
                                               "deep-ensemble": (3, 0.75, [0.2, 0.21, 0.19]),
                                               "batch-ensemble": (3, [0.66, 0.8, 0.7], [0.05, 0.055, 0.05])})
    entry = verdict_of(root)["batch-ensemble"]
    diversity = entry["diversity"]
    assert diversity["answer"] == "single" and diversity["interval"][1] <= 0.25
    assert entry["nll"]["answer"] == "unsettled"
    kl = [float(-torch.logsumexp(torch.log_softmax(_spread_logits(3, p, s, 1), -1).mean(0), -1))
          for p, s in ((0.66, 0.05), (0.8, 0.055), (0.7, 0.05), (0.75, 0.2), (0.75, 0.21), (0.75, 0.19))]
    low, high = _fieller_by_inverting_the_paired_t_test(kl[:3], kl[3:])
    assert diversity["value"] == pytest.approx(sum(kl[:3]) / sum(kl[3:]), rel=1e-5)
    assert diversity["interval"][0] <= low + 1e-6 and diversity["interval"][1] >= high - 1e-6
    line = answer("BatchEnsemble", entry)
    assert line.startswith("BatchEnsemble: like a single model on diversity") and line.count("not settled") <= 1
    assert "Diversity: like a single model — " in sentence("BatchEnsemble", entry)


def test_a_diversity_interval_never_holds_negative_values(tmp_path):
    """Per-seed diversities that vary wildly: Fieller's lower bound would fall below 0, which a KL
    diversity ratio cannot take; the printed interval starts at 0 and still holds the rest."""
    root = write_spread_run(tmp_path / "run", {"single": (1, 0.7, [0, 0, 0]),
                                               "deep-ensemble": (3, 0.75, [0.2, 0.18, 0.22]),
                                               "mc-dropout": (3, 0.7, [0.01, 0.25, 0.002])})
    diversity = verdict_of(root)["mc-dropout"]["diversity"]
    assert diversity["interval"][0] == 0.0 and diversity["interval"][1] > diversity["value"] > 0


def test_a_diversity_above_the_deep_ensembles_says_what_drives_it(tmp_path):
    """Members that are individually worse (label probability 0.6 ± 0.3 against the Deep Ensemble's
    0.8 ± 0.15): more KL diversity, and the sentence says it comes from weaker members."""
    root = write_spread_run(tmp_path / "run", {"single": (1, 0.8, [0, 0, 0]),
                                               "deep-ensemble": (3, 0.8, [0.15, 0.16, 0.14]),
                                               "mc-dropout": (3, 0.6, [0.3, 0.31, 0.29])})
    entry = verdict_of(root)["mc-dropout"]
    assert entry["diversity"]["value"] > 1
    drivers = entry["diversity"]["drivers"]
    assert drivers["member_nll_difference"]["interval"][0] > 0
    assert drivers["member_nll"]["value"] - drivers["reference_member_nll"]["value"] == pytest.approx(
        drivers["member_nll_difference"]["value"])
    text = sentence("MC Dropout", entry)
    assert "its members are individually worse" in text and "makes up for weaker members" in text


def test_shares_outside_0_to_100_percent_say_what_they_mean(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.6), "deep-ensemble": (3, 0.8), "batch-ensemble": (3, 0.5),
                                        "packed-ensemble": (3, 0.9)})
    found = verdict_of(root)
    worse, beyond = sentence("BatchEnsemble", found["batch-ensemble"]), sentence("Packed", found["packed-ensemble"])
    assert found["batch-ensemble"]["nll"]["value"] < 0 and "Below 0 % is worse than the single model" in worse
    assert found["packed-ensemble"]["nll"]["value"] > 1 and "Above 100 % is more than the Deep Ensemble gains" in beyond
    assert "of the Deep Ensemble's (0.288" in worse  # the Deep Ensemble's own NLL gain, log(0.8/0.6), printed with its share


def test_a_deep_ensemble_worse_than_the_single_model_gets_no_share(tmp_path):
    """Each seed's "Deep Ensemble" is worse than its single model: shares of a negative gain would
    print as nonsense (−1225 % in a reviewer's run), so none is given, and the reason is said."""
    root = write_run(tmp_path / "run", {"single": (1, [0.80, 0.82, 0.81]), "deep-ensemble": (3, [0.70, 0.72, 0.71]),
                                        "batch-ensemble": (3, 0.85)}, seeds=(1, 2, 3))
    entry = verdict_of(root)["batch-ensemble"]
    assert entry["nll"]["value"] is None and entry["nll"]["undetermined"] == "worse"
    assert entry["nll"]["reference_gain_interval"][1] < 0
    assert "the Deep Ensemble is worse than the single model" in sentence("BatchEnsemble", entry)


def test_a_deep_ensemble_gain_within_noise_gets_no_share(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.8), "deep-ensemble": (3, [0.9, 0.7, 0.81]),
                                        "batch-ensemble": (3, 0.85)}, seeds=(1, 2, 3))
    entry = verdict_of(root)["batch-ensemble"]
    assert entry["nll"]["undetermined"] == "noise" and entry["nll"]["reference_gain_interval"][0] <= 0
    assert "the Deep Ensemble's own gain is within noise" in sentence("BatchEnsemble", entry)


def test_a_diversity_ratio_over_a_deep_ensemble_diversity_at_rounding_level_is_not_given(tmp_path):
    """Identical Deep Ensemble members: a KL diversity of float rounding would make any ratio huge."""
    root = write_run(tmp_path / "run", {"single": (1, 0.6), "deep-ensemble": (3, 0.9), "batch-ensemble": (3, 0.7)})
    entry = verdict_of(root)["batch-ensemble"]
    assert entry["diversity"]["value"] is None and entry["diversity"]["undetermined"] == "rounding"
    assert "the Deep Ensemble's own diversity is at rounding level" in sentence("BatchEnsemble", entry)


@pytest.mark.parametrize("same_images", [True, False])
def test_the_nll_under_shift_is_each_images_mean_over_the_corruptions_that_share_the_images(tmp_path, same_images):
    """Read once with the pooled shift split: corruptions of the same test images give each image's mean NLL over
    them (one sample, as the pooled split resamples it); corruptions of different images, every example."""
    generator = torch.Generator().manual_seed(5)
    labels = torch.randint(0, 3, (30,), generator=generator)
    shift = {f"shift/{name}": {"logits": torch.randn(2, 30, 3, generator=generator),
                               "labels": labels if same_images else torch.randint(0, 3, (30,), generator=generator)}
             for name in ("blur", "noise", "zoom")}
    save_predictions({"id": {"logits": torch.randn(2, 30, 3, generator=generator), "labels": labels}, **shift},
                     tmp_path / "predictions.safetensors")
    nll = [torch.nn.functional.cross_entropy(torch.softmax(split["logits"].double(), -1).mean(0).log(), split["labels"],
                                             reduction="none") for split in shift.values()]
    expected = torch.stack(nll).mean(0) if same_images else torch.cat(nll)
    assert read_seed(tmp_path).shift_nll.tolist() == pytest.approx(expected.tolist(), abs=1e-12)


@pytest.mark.parametrize("damage, reason", [
    (lambda path: path.write_bytes(path.read_bytes()[:100]), "is not a readable safetensors file"),
    (lambda path: save_predictions({"id": {"logits": torch.full((3, N, 2), math.nan),
                                           "labels": torch.zeros(N, dtype=torch.long)}}, path), "contains NaN"),
    (lambda path: save_predictions({"ood": {"logits": _spread_logits(3, 0.8, 0.1), "labels": None}}, path),
     "holds no labelled in-distribution (id) split")], ids=["truncated", "NaN logits", "no test split"])
def test_a_damaged_seed_is_named_with_its_reason_and_left_out_of_every_statistic(tmp_path, damage, reason):
    """One read of the predictions serves the verdict, the effective size and the bias–variance decomposition;
    a run whose file cannot be used is left out of all three, and the data and the report name it and why."""
    from ensdiag.report import make_report
    from ensdiag.seeds.across import across_seeds
    root = write_spread_run(tmp_path / "run", {"single": (1, 0.6, [0, 0, 0]), "deep-ensemble": (3, 0.9, [0.05, 0.06, 0.04]),
                                               "batch-ensemble": (3, 0.8, [0.03, 0.02, 0.04])})
    damage(root / "batch-ensemble" / "seed-2" / "predictions.safetensors")
    found = across_seeds(load_runs(root)["runs"])
    assert list(found.damaged) == ["batch-ensemble"] and list(found.damaged["batch-ensemble"]) == [2]
    assert reason in found.damaged["batch-ensemble"][2] and "seed-2/predictions.safetensors" in found.damaged["batch-ensemble"][2]
    assert [found.verdict["batch-ensemble"]["seeds"], found.effective_size["batch-ensemble"]["seeds"],
            found.bvd["batch-ensemble"]["seeds"], found.bvd["deep-ensemble"]["seeds"]] == [2, 2, 2, 3]
    report = make_report(root, write=False)
    assert report["damaged_runs"] == {"batch-ensemble": {"2": found.damaged["batch-ensemble"][2]}}
    note = next(table for table in report["tables"] if table["id"] == "verdict")["note"]
    assert f"BatchEnsemble seed 2: left out of the verdict, effective size and bias–variance — {found.damaged['batch-ensemble'][2]}" in note


@pytest.fixture(scope="module")
def trio_run(tmp_path_factory):
    """single, Deep Ensemble and BatchEnsemble, two seeds, two epochs on the embedded digits."""
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    out = tmp_path_factory.mktemp("trio") / "run"
    run_experiment(preset_config("digits", methods=["single", "deep-ensemble", "batch-ensemble"], seeds=[1, 2], epochs=2,
                                 members=2, detail=True), out, "data", quiet=True)
    return out


def test_the_sentences_appear_in_every_report_format_and_the_train_summary(trio_run, capsys):
    for fmt in ("table", "markdown", "html", "latex", "json"):
        code, text, err = run_cli(capsys, "report", trio_run, "--format", fmt, "--no-figures")
        assert code == 0, err
        text = " ".join(text.split())  # the terminal table wraps the note at its width
        assert "BatchEnsemble" in text and "Deep Ensemble" in text and "paired bootstrap" in text, fmt
    arguments = ("train", "--method", "single,deep-ensemble,batch-ensemble", "--seeds", "1,2", "--epochs", "2",
                 "--members", "2", "--detail", "--out", trio_run)  # finished: only what follows training
    code, _, err = run_cli(capsys, *arguments, "--verbose")
    assert code == 0 and "paired bootstrap" in " ".join(err.split())
    code, _, err = run_cli(capsys, *arguments)  # by default: where the answer and the tables are, no tables
    assert code == 0 and "paired bootstrap" not in err and "--format summary" in " ".join(err.split())


def test_bias_variance_diversity_table_for_methods_with_two_seeds(trio_run, capsys):
    code, text, err = run_cli(capsys, "report", trio_run, "--format", "markdown", "--no-figures")
    assert code == 0, err
    assert "Bias, variance and diversity over seeds" in text and "CE diversity" in text and "Brier variance" in text


def test_members_table_and_analyzer_notes_in_the_report(trio_run, tmp_path, capsys):
    import shutil

    from ensdiag.report import make_report
    run = tmp_path / "run"
    shutil.copytree(trio_run, run)
    metrics_path = run / "deep-ensemble" / "seed-1" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["analyzers"]["temperature"]["note"] = "every fitted temperature is within 0.01 of 1"
    metrics_path.write_text(json.dumps(metrics))
    report = make_report(run, write=False)
    members = next(t for t in report["tables"] if t["id"] == "members")
    for row in members["rows"]:
        worst, best = row["cells"][0]["mean"], row["cells"][1]["mean"]
        assert worst <= best
    temperature = next(t for t in report["tables"] if t["id"] == "temperature")
    assert "Deep Ensemble (seed 1): every fitted temperature is within 0.01 of 1." in temperature["note"]


def test_the_one_line_answer_follows_the_intervals():

    def entry(**shares):
        from ensdiag.seeds.stats import settles
        found = {key: {"value": sum(bounds) / 2, "interval": bounds, "answer": settles(bounds)}
                 for key, bounds in shares.items()}
        return {"seeds": 3, "diversity": found.pop("diversity", {"value": None, "interval": None}), **found}

    assert answer("X", entry(nll=(0.6, 0.9), diversity=(0.7, 1.1))) == "X: like an ensemble on NLL and diversity."
    assert answer("X", entry(nll=(-0.1, 0.2), auroc=(0.0, 0.1))) == "X: like a single model on NLL and OOD AUROC."
    assert answer("X", entry(nll=(0.1, 0.9), diversity=(0.0, 0.1))) == \
        "X: like a single model on diversity; NLL not settled by 3 seeds."
    assert answer("X", entry(nll=(0.6, 0.9), diversity=(0.0, 0.1))) == \
        "X: mixed — like an ensemble on NLL; like a single model on diversity."
    assert answer("X", entry(ece=(0.3, 0.45))) == "X: between a single model and an ensemble on ECE."
    assert answer("X", {"seeds": 3, "diversity": {"value": None, "interval": None}}) == \
        "X: not settled by 3 seeds on any question."


def test_terminal_notes_never_split_an_interval_or_a_percentage():
    from ensdiag.console import wrapped
    text = "MC Dropout delivers 72 % [4 %, 98 %] of the gain; its diversity term is 0.55× [0.36, 0.78]."
    for width in range(20, 60):
        for line in wrapped(text, width).splitlines():
            assert line.count("[") == line.count("]") and not line.startswith(("%", "×"))


def test_the_verdicts_resamples_are_the_cells_draws_and_equal_the_loop_over_resamples(tmp_path):
    """Every resample's shares, computed at once from the examples' counts, equal the plain loop that
    indexes each resample's examples on random predictions with ties and OOD data; and the test-set
    counts are the very draws behind the cells' intervals (bootstrap.Draws)."""
    from ensdiag.stats import bootstrap as B
    from ensdiag.seeds import verdict as V
    generator = torch.Generator().manual_seed(3)
    seeds, n, n_ood = (1, 2, 3), 60, 40
    data = {}
    for method, k in (("single", 1), ("deep-ensemble", 3), ("batch-ensemble", 3)):
        data[method] = {}
        for seed in seeds:
            logits = (torch.randn(k, n, 4, generator=generator) * 2).round()  # rounding makes tied scores
            ood = (torch.randn(k, n_ood, 4, generator=generator)).round()
            labels = torch.randint(0, 4, (n,), generator=generator)
            folder = tmp_path / method / f"seed-{seed}"
            folder.mkdir(parents=True)
            save_predictions({"id": {"logits": logits, "labels": labels}, "ood": {"logits": ood, "labels": None}},
                             folder / "predictions.safetensors")
            data[method][seed] = V._per_example(read_seed(folder))
    trio = [data["single"], data["deep-ensemble"], data["batch-ensemble"]]
    counts, chosen = V.example_counts(trio[0][1], B.Draws()), V.chosen_seeds(len(seeds))
    rows = B.draws("id", n, V.RESAMPLES), B.draws("ood", n_ood, V.RESAMPLES)  # the cells' draws, as indices
    assert torch.equal(counts[0], B.counts_of(rows[0], n)) and torch.equal(counts[1], B.counts_of(rows[1], n_ood))
    fast = V._shares(*(V._bootstrap(V._per_seed_resampled(group, list(seeds), counts), chosen) for group in trio))
    for r in range(0, V.RESAMPLES, 97):  # the loop, resample by resample: index the examples, average the seeds
        picked = [seeds[i] for i in chosen[r]]
        resampled = [{seed: {key: values[rows[1][r]] if key == "ood_score" else values[rows[0][r]]
                             for key, values in group[seed].items() if key != "classes"} for seed in seeds} for group in trio]
        slow = V._shares(*(V._averaged(group, picked) for group in resampled))
        for key, value in slow.items():
            if math.isfinite(value):
                assert fast[key][r].item() == pytest.approx(value, rel=1e-9, abs=1e-12), (key, r)


@pytest.mark.parametrize("members, ensemble, ending", [
    ((0.1, -0.2, 0.4), (0.02, -0.05, 0.09), "what drives it is not settled by these seeds."),
    ((0.1, -0.2, 0.4), (-0.05, -0.09, -0.01), "the extra diversity buys a better ensemble."),
    ((0.3, 0.1, 0.5), (0.02, -0.05, 0.09), "makes up for weaker members, it is not a better ensemble."),
])
def test_what_drives_a_higher_diversity_follows_which_differences_are_settled(members, ensemble, ending):
    """The conclusion names only what the intervals settle: an unsettled ensemble difference is
    never read as a better ensemble (the words 'no better' once ended in 'better')."""
    from ensdiag.report.verdict_text import drivers

    def difference(value, low, high):
        return {"value": value, "interval": [low, high]}
    found = {"member_nll_difference": difference(*members), "geometric_nll_difference": difference(*ensemble),
             "member_nll": {"value": 0.5}, "reference_member_nll": {"value": 0.4},
             "geometric_nll": {"value": 0.3}, "reference_geometric_nll": {"value": 0.28}}
    text = drivers(found)
    assert text.endswith(ending), text
    assert text.count("better ensemble") <= 1


@pytest.mark.parametrize("other, named", [
    ({"logits": torch.cat([_spread_logits(3, 0.8, 0.1), torch.full((3, N, 2), -30.0)], -1)}, "2 classes against 4"),
    ({"labels": torch.ones(N, dtype=torch.long)}, "other labels: example 0 is class 0 against 1"),
    ({"logits": _spread_logits(3, 0.8, 0.1, N - 1), "labels": torch.zeros(N - 1, dtype=torch.long)},
     f"{N} examples against {N - 1}")])
def test_runs_measured_on_another_test_set_are_never_compared_and_the_report_says_why(tmp_path, other, named):
    from ensdiag.report import make_report
    root = write_spread_run(tmp_path / "run", {"single": (1, 0.6, [0, 0, 0]), "deep-ensemble": (3, 0.9, [0.05] * 3),
                                               "batch-ensemble": (3, 0.8, [0.03] * 3)})
    found = {"logits": _spread_logits(3, 0.8, 0.1), "labels": torch.zeros(N, dtype=torch.long), **other}
    save_predictions({"id": found}, root / "batch-ensemble" / "seed-2" / "predictions.safetensors")  # (hand-made)
    report = make_report(root, write=False)
    assert "batch-ensemble" not in report["verdict"] and "deep-ensemble" in report["effective_size"]
    assert f"measured on different test sets ({named})" in json.dumps(report)  # the verdict's reason
    assert report["effective_size"]["batch-ensemble"] == {"reason": f"its test set and the Deep Ensemble's differ ({named})"}
    bvd = next(table for table in report["tables"] if table["id"] == "bvd")
    assert [row["method"] for row in bvd["rows"]] == ["deep-ensemble"] and \
        f"BatchEnsemble: left out, its seeds were measured on different test sets ({named})" in bvd["note"]
