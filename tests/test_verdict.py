"""The verdict: shares of the Deep Ensemble's gain, on constructed runs whose answer is known,
reproducible intervals, and the sentences in every report format."""

import json
import math

import pytest
import torch

from ensdiag.predictions import save_predictions
from ensdiag.report.load import load_runs
from ensdiag.report.verdict import verdict
from ensdiag.report.verdict_text import answer, sentence

from .cli import run_cli

N = 40


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
    found = verdict(root, load_runs(root)["runs"])
    entry = found["batch-ensemble"]
    assert entry["nll"]["value"] == pytest.approx(0.5) and entry["nll"]["interval"] == pytest.approx([0.5, 0.5])
    assert entry["seeds"] == 2
    assert entry["diversity"]["value"] is None  # identical members: the Deep Ensemble has no diversity to compare with
    assert verdict(root, load_runs(root)["runs"]) == found  # a fixed generator: the same intervals every time


def test_no_share_is_given_when_the_deep_ensemble_gains_nothing(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.7), "deep-ensemble": (3, 0.7), "batch-ensemble": (3, 0.8)})
    entry = verdict(root, load_runs(root)["runs"])["batch-ensemble"]
    assert entry["nll"]["value"] is None and entry["nll"]["reference_gain"] == pytest.approx(0.0)
    assert entry["nll"]["undetermined"] == "no gain"
    assert "not determined by these seeds (the Deep Ensemble gains nothing" in sentence("BatchEnsemble", entry)


def _t_interval(values):
    from scipy import stats
    mean, sd = sum(values) / len(values), torch.tensor(values, dtype=torch.float64).std().item()
    half = stats.t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    return mean - half, mean + half


def test_with_three_seeds_no_interval_is_narrower_than_the_t_interval_of_its_per_seed_shares(tmp_path):
    """Per-seed shares 4 %, 83 %, 83 % (the case a reviewer found): the bootstrap alone gave
    [4 %, 98 %]; the interval must hold Student-t's [−57 %, 169 %]-like spread, and then it is
    wider than 0–100 %, so the share is not determined."""
    single, deep = 0.6, 0.9
    shares = [0.04, 0.83, 0.83, 0.5, 0.6, 0.55]
    method = [math.exp(math.log(single) + share * (math.log(deep) - math.log(single))) for share in shares]
    for seeds, picked in (((1, 2, 3), method[:3]), ((1, 2, 3), method[3:])):
        root = write_run(tmp_path / f"run-{picked[0]:.4f}", {"single": (1, single), "deep-ensemble": (3, deep),
                                                           "batch-ensemble": (3, picked)}, seeds=seeds)
        entry = verdict(root, load_runs(root)["runs"])["batch-ensemble"]["nll"]
        per_seed = [(math.log(single) - math.log(p)) / (math.log(single) - math.log(deep)) for p in picked]
        low, high = _t_interval(per_seed)
        assert entry["interval"][0] <= low + 1e-6 and entry["interval"][1] >= high - 1e-6  # float32 logits
        if high - low > 1:
            assert entry["value"] is None and entry["undetermined"] == "wide"
        else:
            assert entry["value"] == pytest.approx(sum(per_seed) / 3, abs=0.02) and entry["undetermined"] is None


def test_shares_outside_0_to_100_percent_say_what_they_mean(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.6), "deep-ensemble": (3, 0.8), "batch-ensemble": (3, 0.5),
                                        "packed-ensemble": (3, 0.9)})
    found = verdict(root, load_runs(root)["runs"])
    worse, beyond = sentence("BatchEnsemble", found["batch-ensemble"]), sentence("Packed", found["packed-ensemble"])
    assert found["batch-ensemble"]["nll"]["value"] < 0 and "below 0 % is worse than the single model" in worse
    assert found["packed-ensemble"]["nll"]["value"] > 1 and "above 100 % is more than the Deep Ensemble gains" in beyond
    assert "the Deep Ensemble's gain: 0.288" in worse  # the Deep Ensemble's own NLL gain, log(0.8/0.6), printed with its share


def test_a_deep_ensemble_worse_than_the_single_model_gets_no_share(tmp_path):
    """Each seed's "Deep Ensemble" is worse than its single model: shares of a negative gain would
    print as nonsense (−1225 % in a reviewer's run), so none is given, and the reason is said."""
    root = write_run(tmp_path / "run", {"single": (1, [0.80, 0.82, 0.81]), "deep-ensemble": (3, [0.70, 0.72, 0.71]),
                                        "batch-ensemble": (3, 0.85)}, seeds=(1, 2, 3))
    entry = verdict(root, load_runs(root)["runs"])["batch-ensemble"]
    assert entry["nll"]["value"] is None and entry["nll"]["undetermined"] == "worse"
    assert entry["nll"]["reference_gain_interval"][1] < 0
    assert "the Deep Ensemble is worse than the single model" in sentence("BatchEnsemble", entry)


def test_a_deep_ensemble_gain_within_noise_gets_no_share(tmp_path):
    root = write_run(tmp_path / "run", {"single": (1, 0.8), "deep-ensemble": (3, [0.9, 0.7, 0.81]),
                                        "batch-ensemble": (3, 0.85)}, seeds=(1, 2, 3))
    entry = verdict(root, load_runs(root)["runs"])["batch-ensemble"]
    assert entry["nll"]["undetermined"] == "noise" and entry["nll"]["reference_gain_interval"][0] <= 0
    assert "the Deep Ensemble's own gain is within noise" in sentence("BatchEnsemble", entry)


def test_a_diversity_ratio_over_a_deep_ensemble_diversity_at_rounding_level_is_not_given(tmp_path):
    """Identical Deep Ensemble members: a KL diversity of float rounding would make any ratio huge."""
    root = write_run(tmp_path / "run", {"single": (1, 0.6), "deep-ensemble": (3, 0.9), "batch-ensemble": (3, 0.7)})
    entry = verdict(root, load_runs(root)["runs"])["batch-ensemble"]
    assert entry["diversity"]["value"] is None and entry["diversity"]["undetermined"] == "rounding"
    assert "the Deep Ensemble's own diversity is at rounding level" in sentence("BatchEnsemble", entry)


@pytest.fixture(scope="module")
def trio_run(tmp_path_factory):
    """single, Deep Ensemble and BatchEnsemble, two seeds, two epochs on the embedded digits."""
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    out = tmp_path_factory.mktemp("trio") / "run"
    run_experiment(preset_config("digits", methods=["single", "deep-ensemble", "batch-ensemble"], seeds=[1, 2], epochs=2,
                                 members=2), out, "data", quiet=True)
    return out


def test_the_sentences_appear_in_every_report_format_and_the_train_summary(trio_run, capsys):
    for fmt in ("table", "markdown", "html", "latex", "json"):
        code, text, err = run_cli(capsys, "report", trio_run, "--format", fmt, "--no-figures")
        assert code == 0, err
        text = " ".join(text.split())  # the terminal table wraps the note at its width
        assert "BatchEnsemble" in text and "Deep Ensemble" in text and "paired bootstrap" in text, fmt
    code, _, err = run_cli(capsys, "train", "--method", "single,deep-ensemble,batch-ensemble", "--seeds", "1,2",
                           "--epochs", "2", "--members", "2", "--out", trio_run)  # finished: only the summary
    assert code == 0 and "paired bootstrap" in " ".join(err.split())


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
    from ensdiag.report.verdict import answer

    def entry(**shares):
        found = {key: {"value": sum(bounds) / 2, "interval": bounds} for key, bounds in shares.items()}
        return {"seeds": 3, "diversity": found.pop("diversity", {"value": None, "interval": None}), **found}

    assert "behaves like an ensemble" in answer("X", entry(nll=(0.6, 0.9), diversity=(0.7, 1.1)))
    assert "behaves like a single model" in answer("X", entry(nll=(-0.1, 0.2), auroc=(0.0, 0.1)))
    assert "between a single model and an ensemble" in answer("X", entry(nll=(0.1, 0.9)))
    assert "not determined" in answer("X", {"seeds": 3, "diversity": {"value": None, "interval": None}})


def test_terminal_notes_never_split_an_interval_or_a_percentage():
    from ensdiag.console import wrapped
    text = "MC Dropout delivers 72 % [4 %, 98 %] of the gain; its diversity term is 0.55× [0.36, 0.78]."
    for width in range(20, 60):
        for line in wrapped(text, width).splitlines():
            assert line.count("[") == line.count("]") and not line.startswith(("%", "×"))


def test_the_vectorised_bootstrap_equals_the_loop_over_resamples(tmp_path):
    """Every resample's shares, computed at once from example counts, equal the plain loop that
    indexes each resample's examples (`_averaged`) on random predictions with ties and OOD data."""
    from ensdiag.report import verdict as V
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
            data[method][seed] = V._per_example(folder / "predictions.safetensors")
    trio = [data["single"], data["deep-ensemble"], data["batch-ensemble"]]
    chosen, examples, ood_examples = V._resamples(len(seeds), n, n_ood)
    fast = V._shares(*(V._bootstrap(group, list(seeds), chosen, examples, ood_examples) for group in trio))
    for r in range(0, V.RESAMPLES, 37):  # the loop, resample by resample
        picked = [seeds[i] for i in chosen[r]]
        slow = V._shares(*(V._averaged(group, picked, examples[r], ood_examples[r]) for group in trio))
        for key, value in slow.items():
            if math.isfinite(value):
                assert fast[key][r].item() == pytest.approx(value, rel=1e-9, abs=1e-12), (key, r)
