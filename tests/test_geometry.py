"""Member geometry end to end: the model analyzers on every method, `--track-diversity`,
`ensdiag diversity` and the report's figures."""

import json

import pytest
import torch

from ensdiag.analysis import ANALYZERS, analyze_model, analyze_predictions
from ensdiag.analysis.geometry import ModelProbe
from ensdiag.data.registry import Split
from ensdiag.geometry.least import rule_for
from ensdiag.nn import METHODS, build_model
from tests.cli import assert_one_line_error, run_cli

MODEL_ANALYZERS = sorted(name for name, analyzer in ANALYZERS.items() if analyzer.needs == "model")


def _probe(method, arch="mlp", k=3, **options):
    shape, arch_options = ((1, 6, 6), {}) if arch == "mlp" else ((3, 8, 8), {"width": 4})
    fixed = METHODS[method].fixed_members
    model = build_model(arch, method, fixed or k, 4, shape, arch_options=arch_options, **options)
    generator = torch.Generator().manual_seed(0)
    test = Split(torch.rand(40, *shape, generator=generator), torch.randint(0, 4, (40,), generator=generator))
    ood = Split(torch.rand(30, *shape, generator=generator), None)
    return ModelProbe(model, {"id": test, "ood": ood}, lambda x: x, torch.rand(50, *shape, generator=generator),
                      train_labels=torch.randint(0, 4, (50,), generator=generator))


def test_the_geometry_analyzers_are_registered_as_model_analyzers():
    assert MODEL_ANALYZERS == ["alignment", "cka", "paths", "rank-structure"]
    logits = torch.randn(2, 5, 3)
    ran = analyze_predictions({"id": {"logits": logits, "labels": torch.tensor([0, 1, 2, 0, 1])}})["analyzers"]
    assert not set(MODEL_ANALYZERS) & set(ran)  # predictions alone cannot feed them


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_gets_a_result_or_a_reason(method):
    results = analyze_model(_probe(method))
    assert set(results) == set(MODEL_ANALYZERS)
    for name, result in results.items():
        assert result["status"] in ("ok", "skipped"), (name, result)
        if result["status"] == "skipped":
            assert result["reason"]
    shared = METHODS[method].one_weight_set
    assert (results["cka"]["status"] == "ok") != shared
    assert (results["alignment"]["status"] == "ok") == METHODS[method].own_weights


@pytest.mark.parametrize("arch", ["mlp", "resnet18"])
def test_deep_ensemble_results_on_both_architectures(arch):
    probe = _probe("deep-ensemble", arch)
    if arch == "resnet18":  # the barrier search's rule is tested in test_least_barrier.py; 3 restarts keep this fast
        probe.limits["restarts"] = 3
    results = analyze_model(probe)
    cka = results["cka"]["splits"]
    assert set(cka) == {"id", "ood"} and cka["id"]["n"] == 40 and cka["ood"]["n"] == 30
    for entry in cka["id"]["layers"].values():
        matrix = torch.tensor(entry["linear"]["value"])
        assert matrix.shape == (3, 3) and torch.allclose(matrix.diagonal(), torch.ones(3, dtype=matrix.dtype))
        assert torch.allclose(matrix, matrix.T)
    expected_layers = 4 if arch == "mlp" else 10  # mlp: 3 hidden + head; resnet: stem, 8 blocks, fc
    assert len(cka["id"]["layers"]) == expected_layers
    alignment = results["alignment"]
    assert alignment["max_output_change"]["value"] < 1e-4  # aligned members compute what they did
    assert alignment["aligned"]["mean"]["value"] >= alignment["raw"]["mean"]["value"] - 1e-9
    paths = results["paths"]
    assert len(paths["pairs"]) == 2 and all(len(pair["loss"]) == 11 for pair in paths["pairs"])
    assert ("recomputed" in paths["batchnorm"]) == (arch == "resnet18")
    assert paths["loss_barrier"]["value"] >= 0 and paths["train_loss_barrier"]["value"] >= 0 and paths["train_n"] == 50
    assert all(len(pair["train_loss"]) == 11 for pair in paths["pairs"])
    assert paths["restarts"]["per_pair"] == [pair["restarts_run"] for pair in paths["pairs"]]
    runs = [pair["restarts_run"] for pair in paths["pairs"]]
    quick = rule_for(detail=False)  # no intervals asked: the shorter search
    assert all(run == 3 for run in runs) if arch == "resnet18" else all(quick.minimum <= run <= quick.limit for run in runs)


# a permuted copy, a rescaled BatchEnsemble and independent seeds: tests/test_geometry_known.py


def test_batch_ensemble_members_are_rank_one_and_kernel_wise_ones_per_kernel():
    channel = analyze_model(_probe("batch-ensemble", "resnet18"), only=["rank-structure"])["rank-structure"]
    assert channel["rank_one"]["value"] == 1.0 and channel["summary"].startswith("rank 1 in every layer")
    assert channel["construction_check"] and "not evidence about their diversity" in channel["summary"]
    kernel = analyze_model(_probe("batch-ensemble", "resnet18", variant="kernel"), only=["rank-structure"])["rank-structure"]
    assert kernel["rank_one"]["value"] < 1.0 and kernel["summary"].startswith("rank 1 per kernel")
    deep = analyze_model(_probe("deep-ensemble"), only=["rank-structure"])["rank-structure"]
    assert deep["rank_one"]["value"] == 0.0 and deep["summary"].startswith("higher rank")
    assert not deep["construction_check"] and "construction" not in deep["summary"]


def test_an_analyzer_that_breaks_is_a_failed_result_not_a_lost_run(monkeypatch):
    from ensdiag.analysis import geometry

    def broken(*args, **kwargs):
        raise ValueError("matrix contains invalid numeric entries")
    monkeypatch.setattr(geometry.ModelProbe, "members", broken)
    results = analyze_model(_probe("deep-ensemble"))
    assert results["cka"] == {"status": "failed", "description": ANALYZERS["cka"].description,
                              "reason": "ValueError: matrix contains invalid numeric entries"}
    assert results["rank-structure"]["status"] == "ok"  # the others still ran
    json.dumps(results, allow_nan=False)


def test_cka_memory_is_bounded_by_skipping_layers_that_do_not_fit(monkeypatch):
    from ensdiag.geometry import representations
    monkeypatch.setattr(representations, "MAX_MOMENT_BYTES", 8 * 40 * 50)  # room for the narrow layers only
    result = analyze_model(_probe("deep-ensemble"), only=["cka"])["cka"]
    layers, skipped = result["splits"]["id"]["layers"], result["splits"]["id"]["skipped_layers"]
    assert skipped and layers and not set(layers) & set(skipped)
    assert "GiB of moments" in next(iter(skipped.values()))


# ---------------------------------------------------------------- train --track-diversity


@pytest.fixture(scope="module")
def tracked_runs(tmp_path_factory):
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    root = tmp_path_factory.mktemp("tracked")
    common = dict(methods=["mc-dropout", "deep-ensemble", "batch-ensemble"], seeds=[3], epochs=2, members=2)
    # with the detail catalogue: member geometry's paths and CKA (a grid leaves them out without it)
    run_experiment(preset_config("digits", track_diversity=True, detail=True, **common), root / "tracked", "data",
                   quiet=True)
    run_experiment(preset_config("digits", geometry=False, **common), root / "plain", "data", quiet=True)
    return root


def test_geometry_after_training_can_be_turned_off(tracked_runs):
    for name, expected in (("tracked", True), ("plain", False)):
        analyzers = json.loads((tracked_runs / name / "deep-ensemble" / "seed-3" / "metrics.json").read_text())["analyzers"]
        assert (set(MODEL_ANALYZERS) <= set(analyzers)) == expected and "disagreement" in analyzers


def test_tracking_records_every_epoch_from_initialisation(tracked_runs):
    for method in ("mc-dropout", "deep-ensemble", "batch-ensemble"):
        rows = [json.loads(line) for line in (tracked_runs / "tracked" / method / "seed-3" / "diversity.jsonl").read_text().splitlines()]
        assert [row["epoch"] for row in rows] == [0, 1, 2]
        assert all(0 <= row["disagreement"] <= 1 and row["jsd"] >= 0 and row["seconds"] > 0 for row in rows)
        assert (rows[0]["weight_cosine"] is None) == (method == "mc-dropout")
        assert (rows[0]["aligned_weight_cosine"] is not None) == (method == "deep-ensemble")
    assert not (tracked_runs / "plain" / "deep-ensemble" / "seed-3" / "diversity.jsonl").exists()


def test_tracking_changes_nothing_that_is_trained(tracked_runs):
    from safetensors.torch import load_file
    for method in ("mc-dropout", "deep-ensemble", "batch-ensemble"):
        tracked = load_file(tracked_runs / "tracked" / method / "seed-3" / "model.safetensors")
        plain = load_file(tracked_runs / "plain" / method / "seed-3" / "model.safetensors")
        assert tracked.keys() == plain.keys() and all(torch.equal(tracked[k], plain[k]) for k in tracked)


def test_tracking_matches_a_direct_measurement_at_the_end(tracked_runs):
    """The last row's weight cosine equals the weight-similarity analyzer's on the saved model."""
    metrics = json.loads((tracked_runs / "tracked" / "deep-ensemble" / "seed-3" / "metrics.json").read_text())
    last = json.loads((tracked_runs / "tracked" / "deep-ensemble" / "seed-3" / "diversity.jsonl").read_text().splitlines()[-1])
    assert last["weight_cosine"] == pytest.approx(metrics["analyzers"]["weight-similarity"]["mean"]["value"], abs=1e-9)
    assert last["aligned_weight_cosine"] == pytest.approx(metrics["analyzers"]["alignment"]["aligned"]["mean"]["value"], abs=1e-9)


def test_an_interrupted_tracked_run_resumes_its_rows(tmp_path):
    from ensdiag.config import preset_config
    from ensdiag.data.batching import Normalize
    from ensdiag.data.sets.digits import Digits
    from ensdiag.geometry.tracking import DiversityTracker
    from ensdiag.train import FitData, fit
    config = preset_config("digits", epochs=3, members=2)
    train, test = Digits().load(split="train"), Digits().load(split="test")
    data = FitData(train.images[:300], train.labels[:300], test.images[:80], test.labels[:80],
                   Normalize(config.mean, config.std, torch.device("cpu")))

    def trained(state, stop_after=None):
        torch.manual_seed(0)
        model = build_model("mlp", "deep-ensemble", 2, 10, config.input_shape)

        def on_epoch(row):
            if row["epoch"] == stop_after:
                raise KeyboardInterrupt
        try:
            return fit(model, config, data, 0, state, torch.device("cpu"), on_epoch=on_epoch, tracker=DiversityTracker(model))
        except KeyboardInterrupt:
            return None

    whole = trained(tmp_path / "a.pt")
    assert trained(tmp_path / "b.pt", stop_after=2) is None
    resumed = trained(tmp_path / "b.pt")
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(resumed["tracking"]) == strip(whole["tracking"]) and len(whole["tracking"]) == 4


def test_track_diversity_needs_a_validation_split(capsys):
    assert_one_line_error(capsys, "train", "--preset", "digits", "--track-diversity", "--val-fraction", "0",
                          "--no-early-stopping", "--out", "unused", match="validation split")


# ---------------------------------------------------------------- diversity and report


@pytest.mark.slow
def test_diversity_shows_member_geometry_for_deep_and_batch_ensembles(tracked_runs, capsys, tmp_path):
    for method, expected in (("deep-ensemble", ["CKA between members per layer", "weight cosine per layer",
                                                "paths between members", "rank of W_i ⊘ W_0", "higher rank"]),
                             ("batch-ensemble", ["CKA between members per layer", "alignment: batch-ensemble members share",
                                                 "paths between members", "rank 1 in every layer"])):
        model = tracked_runs / "tracked" / method / "seed-3" / "model.safetensors"
        code, out, err = run_cli(capsys, "diversity", model, "--plot", tmp_path / f"{method}.png")
        assert code == 0, err
        for text in expected + ["normalised: divided by the ensemble's error rate", "weight cosine: ⟨θ_i, θ_j⟩"]:
            assert text in out, text  # every printed quantity is defined where it appears
        assert (tmp_path / f"{method}-cka-layers.png").is_file() and (tmp_path / f"{method}-paths.png").is_file()
        code, out, _ = run_cli(capsys, "diversity", model, "--format", "json", "--max-examples", "50")
        geometry = json.loads(out)["analyzers"]
        assert set(geometry) - {"disagreement", "member-pairs", "weight-similarity"} == set(MODEL_ANALYZERS)
        assert geometry["cka"]["splits"]["id"]["n"] == 50
    code, out, _ = run_cli(capsys, "diversity", model, "--no-geometry", "--format", "json")
    assert code == 0 and "cka" not in json.loads(out)["analyzers"]


@pytest.mark.slow
def test_the_report_draws_geometry_in_markdown_and_html(tracked_runs, capsys):
    from ensdiag.report import make_report, render
    report = make_report(tracked_runs / "tracked", detail=True)
    names = {figure["name"] for figure in report["figures"]}
    assert {"cka-layers", "cka-heatmaps", "alignment", "paths", "tracking"} <= names
    markdown = render(report, "markdown")
    assert "figures/tracking.png" in markdown and "figures/cka-layers.png" in markdown
    assert "## Member geometry" in markdown and "test-loss barrier" in markdown and "train-loss barrier" in markdown
    html = render(report, "html")
    assert html.count("<img") == len(report["figures"]) and "Member geometry" in html


def test_a_damaged_geometry_result_or_tracking_file_is_a_clear_error(tracked_runs, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(tracked_runs / "tracked", run)
    seed = run / "deep-ensemble" / "seed-3"
    (seed / "diversity.jsonl").write_text('{"epoch": 0, "jsd": "lots"}\n')
    assert_one_line_error(capsys, "report", run, "--format", "markdown", match="diversity.jsonl is damaged")
    (seed / "diversity.jsonl").unlink()
    metrics = json.loads((seed / "metrics.json").read_text())
    metrics["analyzers"]["paths"]["pairs"] = "not a list"
    (seed / "metrics.json").write_text(json.dumps(metrics))
    assert_one_line_error(capsys, "report", run, "--format", "markdown", match="paths result is not of the expected layout")


def test_path_and_tracking_figures_name_the_seed_and_member_pair_of_every_line():
    from ensdiag.report.geometry_figures import paths_figure, tracking_figure
    pair = lambda j: {"members": [0, j], "t": [0.0, 0.5, 1.0], "loss": [0.2, 0.5, 0.3], "accuracy": [0.9, 0.7, 0.9]}  # noqa: E731
    figure = paths_figure({"deep-ensemble, seed 7": {"pairs": [pair(1), pair(2)]}})
    loss_ax = figure.axes[0]
    assert [text.get_text() for text in figure.legends[0].get_texts()] == [
        "deep-ensemble, seed 7: members 0–1", "deep-ensemble, seed 7: members 0–2"]
    assert len({line.get_linestyle() for line in loss_ax.get_lines()}) == 2
    rows = [{"epoch": e, "disagreement": 0.1, "jsd": 0.01, "weight_cosine": 0.5, "aligned_weight_cosine": 0.6} for e in (0, 1)]
    figure = tracking_figure({"batch-ensemble": {42: rows, 69: rows}})
    assert [text.get_text() for text in figure.legends[0].get_texts()] == [
        "batch-ensemble, seed 42", "batch-ensemble, seed 69"]
    assert len({line.get_marker() for line in figure.axes[0].get_lines()}) == 2


def test_train_diversity_and_diagnose_report_the_same_barrier_for_the_same_weights(tracked_runs, capsys):
    """Alignment restarts from fixed group orders and the training sample is drawn from a fixed seed,
    so the barrier training recorded (run seed 3), `ensdiag diversity` (seed 0) and `ensdiag.diagnose()`
    agree; each reads the training split without its validation examples and says so."""
    import ensdiag
    from ensdiag.checkpoint import load_model
    from ensdiag.data.preset import holdout
    from ensdiag.data.sets.digits import Digits
    folder = tracked_runs / "tracked" / "deep-ensemble" / "seed-3"
    trained = json.loads((folder / "metrics.json").read_text())["analyzers"]
    code, out, err = run_cli(capsys, "diversity", folder / "model.safetensors", "--format", "json", "--seed", "0",
                             "--detail")  # the grid was trained with --detail: the same, longer restart search
    assert code == 0, err
    measured = json.loads(out)["analyzers"]
    train, test = Digits().load(split="train"), Digits().load(split="test")
    kept, held = holdout(len(train), 0.1, 3)
    diagnosed = ensdiag.diagnose(load_model(folder / "model.safetensors"), test=(test.images, test.labels),
                                 train=(train.images[kept], train.labels[kept]), measure=ensdiag.Measure(detail=True),
                                 context=ensdiag.Context(progress=False)).metrics["analyzers"]
    for key in ("loss_barrier", "train_loss_barrier", "accuracy_barrier", "loss_barrier_max"):
        values = [found["paths"][key]["value"] for found in (trained, measured, diagnosed)]
        assert values[0] is not None and values == pytest.approx([values[0]] * 3, abs=1e-9), key
    assert [found["alignment"]["aligned"]["mean"]["value"] for found in (measured, diagnosed)] == \
        pytest.approx([trained["alignment"]["aligned"]["mean"]["value"]] * 2, abs=1e-12)
    paths = trained["paths"]
    assert f"without its {len(held)} validation examples" in paths["train_examples"]
    assert f"without its {len(held)} validation examples" in measured["paths"]["train_examples"]
    assert paths["train_n"] == len(kept) and all(len(pair["restarts"]) >= 1 for pair in paths["pairs"])
    assert all(pair["loss_barrier"] == min(r["loss_barrier"] for r in pair["restarts"]) for pair in paths["pairs"])


# --- weight cosine over the weights that carry the function (normalisation layers left out) ------

def _cnn():
    from torch import nn
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def test_independent_networks_with_batchnorm_read_a_weight_cosine_near_zero():
    """Four independently initialised CNNs with BatchNorm, as a user writes them: their γ = 1 and β = 0
    vectors would dominate a small network's norm (0.7 with them); without them the cosine is the
    null's, near 0, and the result says what was left out."""
    import ensdiag
    torch.manual_seed(0)
    members = [_cnn() for _ in range(4)]
    x, y = torch.rand(64, 1, 8, 8), torch.randint(0, 10, (64,))
    weights = ensdiag.diagnose(members, test=(x, y), measure=ensdiag.Measure(geometry=False),
                               context=ensdiag.Context(progress=False)).metrics["analyzers"]["weight-similarity"]
    assert abs(weights["mean"]["value"]) < 0.1 and "normalisation layers' scales and shifts left out" in weights["scope"]
    with_norm = torch.stack([torch.cat([p.flatten() for p in m.parameters()]) for m in members])
    unit = torch.nn.functional.normalize(with_norm.double(), dim=1)
    assert (unit @ unit.T)[0, 1] > 0.5  # what counting them would have read


def test_the_headline_weight_cosine_is_the_alignment_analyzers_raw_cosine():
    """The same members, the same weights compared: the diversity table's cosine and the alignment's
    raw one are one number, on a ResNet with BatchNorm (untrained: both the null's, near 0)."""
    probe = _probe("deep-ensemble", arch="resnet18")
    results = analyze_model(probe, only=["alignment"])
    similarity = analyze_predictions({"id": {"logits": torch.zeros(3, 1, 4), "labels": torch.zeros(1, dtype=torch.long)}},
                                     weights=probe.ensemble.member_weights(), only=["weight-similarity"])
    raw = results["alignment"]["raw"]["mean"]["value"]
    assert similarity["analyzers"]["weight-similarity"]["mean"]["value"] == pytest.approx(raw, abs=1e-12)
    assert abs(raw) < 0.05
