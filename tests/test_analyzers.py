"""The analyzer registry (contract over every analyzer, plug-ins) and the analysis CLI commands."""

import json
import math
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

import ensdiag
from ensdiag.analysis import ANALYZERS, Skip, all_analyzers, analyze_predictions, load_plugins
from ensdiag.predictions import save_predictions

from .cli import assert_one_line_error, run_cli


def predictions(k=3, with_ood=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    splits = {"id": {"logits": torch.randn(k, 40, 4, generator=g), "labels": torch.randint(0, 4, (40,), generator=g)},
              "shift/blur": {"logits": torch.randn(k, 30, 4, generator=g), "labels": torch.randint(0, 4, (30,), generator=g)}}
    if with_ood:
        splits["ood"] = {"logits": torch.randn(k, 25, 4, generator=g), "labels": None}
        splits["val"] = {"logits": torch.randn(k, 20, 4, generator=g), "labels": torch.randint(0, 4, (20,), generator=g)}
    return splits


STATUSES = {"ok", "n/a", "nan", "inf", "-inf", "non-finite", "empty", "omitted"}


def values_have_definitions(node):
    """Every metric (a dict with a value) has a definition and a status."""
    if isinstance(node, dict):
        if "value" in node:
            assert isinstance(node.get("definition"), str) and node["definition"], node
            assert node.get("status") in STATUSES, node
            assert (node["status"] == "ok") == (node["value"] is not None and "None" not in repr(node["value"])), node
        for child in node.values():
            values_have_definitions(child)
    elif isinstance(node, list):
        for child in node:
            values_have_definitions(child)


def model_probe(method, k):
    """A model analyzer's input: a model with labelled test images, OOD images and training images."""
    from ensdiag.analysis.geometry import ModelProbe
    from ensdiag.data.registry import Split
    model = ensdiag.build_model("mlp", method, k, 4, (1, 8, 8))
    test = Split(torch.rand(30, 1, 8, 8), torch.randint(0, 4, (30,)))
    return ModelProbe(model, {"id": test, "ood": Split(torch.rand(20, 1, 8, 8), None)}, lambda x: x, torch.rand(40, 1, 8, 8))


@pytest.mark.parametrize("name", sorted(all_analyzers()))
def test_analyzer_contract(name):
    analyzer = all_analyzers()[name]
    if analyzer.needs == "model":
        run = analyzer.function
        full, minimal_inputs = (model_probe("deep-ensemble", 3),), (model_probe("single", 1),)
    else:
        weights = ensdiag.build_model("mlp", "deep-ensemble", 3, 4, (1, 8, 8)).member_weights()
        run, full, minimal_inputs = analyzer, (predictions(), weights), (predictions(k=1, with_ood=False), None)
    result = run(*full)
    assert isinstance(result, dict) and result
    json.dumps(result, allow_nan=False)  # plain numbers only, no NaN
    values_have_definitions(result)
    assert analyzer.description
    # minimal inputs: one member, no ood split, no weights -> a result or a Skip with a reason
    try:
        minimal = run(*minimal_inputs)
        json.dumps(minimal, allow_nan=False)
        values_have_definitions(minimal)
    except Skip as reason:
        assert str(reason)


@pytest.mark.parametrize("k,stored", [(256, True), (257, False)])
def test_disagreement_stores_the_matrix_only_up_to_256_members(k, stored):
    from ensdiag.stats import metrics as M
    splits = predictions(k=k, with_ood=False)
    result = all_analyzers()["disagreement"](splits, None)
    entry = result["splits"]["id"]
    assert entry["mean"]["status"] == "ok"
    assert entry["mean"]["value"] == pytest.approx(M.mean_off_diagonal(M.disagreement_matrix(splits["id"]["logits"])))
    if stored:
        assert entry["matrix"]["status"] == "ok" and len(entry["matrix"]["value"]) == k and "note" not in result
    else:
        assert entry["matrix"]["value"] is None and entry["matrix"]["status"] == "omitted"
        assert "257" in result["note"] and "256" in entry["matrix"]["note"]
        assert len(json.dumps(result, allow_nan=False)) < 10_000  # the means, not 3 × 257² numbers


def test_missing_inputs_are_skipped_with_reasons():
    result = analyze_predictions(predictions(k=1, with_ood=False))
    status = {name: (r["status"], r.get("reason", "")) for name, r in result["analyzers"].items()}
    assert status["ood"][0] == "skipped" and "ood" in status["ood"][1]
    assert status["disagreement"][0] == "skipped" and "k = 1" in status["disagreement"][1]
    assert status["weight-similarity"][0] == "skipped"
    assert status["calibration"][0] == "ok"
    assert result["analyzers"]["uncertainty"]["splits"]["id"]["jsd"]["value"] is None
    assert result["schema"] == "ensdiag.metrics/2"


def install_plugin(folder, monkeypatch, distribution, entry_point, source=None, module=None):
    """A plug-in distribution in `folder`: its dist-info with one `ensdiag.analyzers` entry point
    (`name = module:function`), and the module's source if given; `folder` goes on sys.path."""
    if source is not None:
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
    dist = folder / f"{distribution.replace('-', '_')}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[ensdiag.analyzers]\n{entry_point}\n")
    monkeypatch.syspath_prepend(str(folder))


def test_plugin_registers_through_an_entry_point(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "tiny-plugin", "sample-count = tiny_plugin:count_samples", '''
        def count_samples(predictions, weights=None):
            """How many samples each split has."""
            from ensdiag.analysis import metric
            return {"splits": {n: metric(s["logits"].shape[1], "number of samples") for n, s in predictions.items()}}
    ''', "tiny_plugin")
    try:
        assert load_plugins(force=True) == {}
        assert "sample-count" in ANALYZERS and ANALYZERS["sample-count"].source.startswith("plug-in")
        result = analyze_predictions(predictions())["analyzers"]["sample-count"]
        assert result["status"] == "ok" and result["splits"]["id"]["value"] == 40
    finally:
        ANALYZERS.pop("sample-count", None)
        sys.modules.pop("tiny_plugin", None)


def write_predictions(path, splits):
    save_predictions(splits, path)
    return path


def test_analyze_cli_json_matches_library(tmp_path, capsys):
    path = write_predictions(tmp_path / "p.safetensors", predictions())
    code, out, _ = run_cli(capsys, "analyze", path, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert "shift" in data["splits"]  # pooled from shift/<corruption>
    expected = analyze_predictions(ensdiag.predictions.load_predictions(path)[0])
    assert data["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"] == pytest.approx(
        expected["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"])


@pytest.mark.parametrize("make,match", [
    (lambda: {"id/logits": torch.tensor([[[math.nan, 0.0]]]), "id/labels": torch.tensor([0])}, "NaN or infinite"),
    (lambda: {"id/logits": torch.zeros(2, 3, 4), "id/labels": torch.zeros(5, dtype=torch.int64)}, r"labels must be \[N=3\]"),
    (lambda: {"id/logits": torch.zeros(2, 3, 4), "id/labels": torch.tensor([0, 1, 7])}, "out of range 0..3"),
    (lambda: {"id/logits": torch.zeros(2, 3, 4), "ood/logits": torch.zeros(3, 3, 4)}, "splits disagree on members"),
    (lambda: {"id/logits": torch.zeros(3, 4)}, r"must be float \[k, N, C\]"),
])
def test_bad_predictions_files(tmp_path, capsys, make, match):
    path = tmp_path / "bad.safetensors"
    save_file(make(), str(path))
    assert_one_line_error(capsys, "analyze", path, match=match)


def test_model_commands_reject_files_without_ensdiag_metadata(tmp_path, capsys):
    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    for command in ("evaluate", "diversity"):
        assert_one_line_error(capsys, command, path, match="no ensdiag model file and holds one network")
    assert_one_line_error(capsys, "analyze", tmp_path / "missing.safetensors", match="does not exist")


def test_diversity_without_data_still_shows_weight_similarity(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "batch-ensemble", 3, 10, (1, 28, 28), init="ones")
    path = ensdiag.save_model(model, tmp_path / "be.safetensors")
    code, out, err = run_cli(capsys, "diversity", path, "--data-dir", tmp_path / "nothing", "--format", "json")
    assert code == 0
    report = json.loads(out)
    assert report["analyzers"]["weight-similarity"]["mean"]["value"] == pytest.approx(1.0)
    assert set(report["skipped_splits"]) == {"id", "shift", "ood"} and "MNIST" in report["skipped_splits"]["id"]


def test_diversity_and_evaluate_on_the_embedded_default(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    code, out, _ = run_cli(capsys, "diversity", path, "--plot", tmp_path / "d.png", "--format", "json")
    report = json.loads(out)
    assert code == 0 and set(report["analyzers"]["disagreement"]["splits"]) >= {"id", "shift", "ood"}
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, _ = run_cli(capsys, "evaluate", path, "--out", tmp_path / "eval")
    assert code == 0 and "Acc" in out
    assert (tmp_path / "eval" / "metrics.json").exists() and (tmp_path / "eval" / "predictions.safetensors").exists()


def test_mc_dropout_masks_follow_the_seed_option(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "mc-dropout", 4, 10, (1, 8, 8), dropout=0.3)
    path = ensdiag.save_model(model, tmp_path / "mcd.safetensors")

    def disagreement(seed):
        code, out, _ = run_cli(capsys, "diversity", path, "--seed", seed, "--format", "json")
        assert code == 0
        return json.loads(out)["analyzers"]["disagreement"]

    assert disagreement(1) == disagreement(1)
    assert disagreement(1) != disagreement(2)


def test_diversity_with_a_preset_of_other_inputs_is_an_error_not_a_degraded_report(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))  # a digits-sized model
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    assert_one_line_error(capsys, "diversity", path, "--preset", "mnist", "--data-dir", tmp_path,
                          match=r"does not run on the mnist preset's \(1, 28, 28\) inputs")


def test_ood_labels_a_foreign_file_carries_are_never_used(tmp_path, capsys):
    splits = predictions()
    splits["ood"]["labels"] = torch.randint(0, 4, (25,))
    path = tmp_path / "p.safetensors"
    save_file({f"{name}/{kind}": tensor for name, split in splits.items()
               for kind, tensor in split.items() if tensor is not None}, str(path))
    code, out, _ = run_cli(capsys, "analyze", path, "--format", "json")
    metrics = json.loads(out)
    assert code == 0 and metrics["splits"]["ood"]["labelled"] is False
    assert "ood" not in metrics["analyzers"]["calibration"]["splits"]
    assert "normalized" not in metrics["analyzers"]["disagreement"]["splits"]["ood"]
    assert "normalized" in metrics["analyzers"]["disagreement"]["splits"]["id"]
    direct = analyze_predictions(splits)  # the library drops them too
    assert "ood" not in direct["analyzers"]["calibration"]["splits"]


def test_mnist_preset_loads_fashion_mnist_unlabelled_and_writes_no_ood_labels(tmp_path, capsys):
    from safetensors.torch import load_file

    from .formats import write_mnist_layout
    write_mnist_layout(tmp_path, "MNIST")
    write_mnist_layout(tmp_path, "FashionMNIST", seed=1)
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 10, (1, 28, 28))
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    code, out, _ = run_cli(capsys, "evaluate", path, "--data-dir", tmp_path, "--out", tmp_path / "eval", "--format", "json")
    metrics = json.loads(out)
    assert code == 0 and set(metrics["analyzers"]["calibration"]["splits"]) == {"id"}
    stored = load_file(tmp_path / "eval" / "predictions.safetensors")
    assert "ood/logits" in stored and "ood/labels" not in stored
    code, out, _ = run_cli(capsys, "diversity", path, "--data-dir", tmp_path, "--format", "json")
    splits = json.loads(out)["analyzers"]["disagreement"]["splits"]
    assert code == 0 and "normalized" in splits["id"] and "normalized" not in splits["ood"]


def test_a_plugin_that_fails_to_import_is_reported_not_dropped(tmp_path, monkeypatch, capsys):
    install_plugin(tmp_path, monkeypatch, "broken-plugin", "broken = broken_plugin_missing:function")
    try:
        assert "ModuleNotFoundError" in load_plugins(force=True)["broken"]
        result = analyze_predictions(predictions())["analyzers"]["broken"]
        assert result["status"] == "failed" and "failed to import" in result["reason"]
        path = write_predictions(tmp_path / "p.safetensors", predictions())
        code, _, err = run_cli(capsys, "analyze", path)
        assert code == 0 and "broken: failed — plug-in failed to import" in err
    finally:
        monkeypatch.undo()
        load_plugins(force=True)  # back to the installed plug-ins only
        assert "broken" not in analyze_predictions(predictions())["analyzers"]


@pytest.mark.parametrize("name", sorted(all_analyzers()))
def test_every_declared_report_column_exists_in_the_analyzers_result(name):
    from ensdiag.analysis import SPLIT_TABLES
    analyzer = all_analyzers()[name]
    k = 1 if name == "weight-similarity" else 3
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 4, (1, 2, 2))
    from ensdiag.predictions import with_pooled_shift
    if analyzer.needs == "model":
        result = analyzer.function(model_probe("deep-ensemble", 3))
    else:
        result = analyzer(with_pooled_shift(predictions(k=k)), model.member_weights())
    for column in analyzer.columns:
        for split in [s for s in SPLIT_TABLES if s in column.tables] or [None]:
            node = result
            for key in column.key_path(split):
                if split == "ood" and name == "calibration":
                    break
                assert isinstance(node, dict) and key in node, f"{name}: {column.label} at {column.key_path(split)}"
                node = node[key]


def test_a_plugin_with_bad_column_declarations_is_a_failed_analyzer(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "badcols-plugin", "badcols = badcols_plugin:f",
                   "def f(predictions, weights=None):\n    return {}\nf.columns = [{'label': 'x', 'path': ['a']}]\n",
                   "badcols_plugin")
    try:
        assert "must be a Column" in load_plugins(force=True)["badcols"]
        assert analyze_predictions(predictions())["analyzers"]["badcols"]["status"] == "failed"
    finally:
        monkeypatch.undo()
        sys.modules.pop("badcols_plugin", None)
        load_plugins(force=True)
