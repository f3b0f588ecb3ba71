"""The detail catalogue left out where it is not read (a training grid without --detail): its
analyzers skipped, saying why, the calibration table N/A, and every headline number as it was."""

import pytest
import torch

from ensdiag.analysis import CATALOGUE_LEFT_OUT, all_analyzers, analyze_predictions
from ensdiag.analysis.registry import Column, register_analyzer
from ensdiag.layout import HEADLINE_TABLES

DETAIL = sorted(name for name, analyzer in all_analyzers().items() if analyzer.detail)


def predictions():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (300,), generator=g)
    logits = torch.randn(3, 300, 5, generator=g) + 2 * torch.nn.functional.one_hot(labels, 5)
    return {"id": {"logits": logits[:, :200], "labels": labels[:200]},
            "val": {"logits": logits[:, 200:], "labels": labels[200:]},
            "ood": {"logits": torch.randn(3, 80, 5, generator=g), "labels": None}}


def test_the_catalogue_is_the_issues_list_and_fills_no_headline_table():
    assert DETAIL == ["cka", "conformal", "debiased-ece", "member-pairs", "paths", "selective", "temperature"]
    for name in DETAIL:
        assert not {table for column in all_analyzers()[name].columns for table in column.tables} & set(HEADLINE_TABLES)
    with pytest.raises(ValueError, match="headline table"):
        register_analyzer("headline-detail", detail=True, columns=[Column("x", ("x",), None, "x", ("id",))])(
            lambda predictions, weights=None: {})
    assert "headline-detail" not in all_analyzers()


def test_without_the_catalogue_its_numbers_say_why_and_the_rest_are_unchanged():
    everything = analyze_predictions(predictions())["analyzers"]
    lean = analyze_predictions(predictions(), catalogue=False)["analyzers"]
    assert everything.keys() == lean.keys()
    for name in everything:
        if name in DETAIL:
            assert everything[name]["status"] == "ok"
            assert lean[name]["status"] == "skipped" and lean[name]["reason"] == CATALOGUE_LEFT_OUT
        elif name != "calibration":
            assert lean[name] == everything[name], name
    full, kept = everything["calibration"]["splits"], lean["calibration"]["splits"]
    assert full.keys() == kept.keys() and full["val"] == kept["val"]
    for key, entry in full["id"].items():
        if isinstance(entry, dict) and kept["id"][key].get("note") == CATALOGUE_LEFT_OUT:
            assert kept["id"][key]["value"] is None and entry["value"] is not None, key
        else:
            assert kept["id"][key] == entry, key
    assert kept["id"]["smooth_ece"]["value"] is None and kept["id"]["ece"] == full["id"]["ece"]


def test_a_grid_begun_before_the_catalogue_was_optional_keeps_computing_it(tmp_path):
    """A stored config without the fields (ensdiag before 0.8) resumes with the catalogue, as its first
    runs were diagnosed, and with the short barrier search they had; a rerun into it need not say so."""
    from ensdiag.config import TrainConfig, preset_config
    from ensdiag.experiment import prepare_run_dir, stored_config
    old = {key: value for key, value in preset_config("digits").to_dict().items() if key not in ("detail", "catalogue")}
    config = TrainConfig.from_dict(old)
    assert config.catalogue and not config.detail
    out = tmp_path / "run"
    prepare_run_dir(out, config, ["ensdiag", "train"])
    kept = stored_config(out, preset_config("digits", seeds=[1, 2, 3, 4]))  # a rerun adding a seed, no --detail
    assert kept.catalogue and not kept.detail and 4 in kept.seeds


def test_a_grids_run_leaves_member_geometrys_paths_and_cka_out_unless_asked(tmp_path):
    """The geometry table (barriers, CKA) is no headline table: a training grid's run measures it with
    `train --detail` only, and says why it is missing otherwise; the aligned cosine (headline) is always there."""
    import json

    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    for detail in (False, True):
        config = preset_config("digits", methods=["deep-ensemble"], seeds=[1], epochs=2, members=2, detail=detail)
        run_experiment(config, tmp_path / str(detail), "data", quiet=True)
        found = json.loads((tmp_path / str(detail) / "deep-ensemble" / "seed-1" / "metrics.json").read_text())["analyzers"]
        assert found["alignment"]["status"] == "ok"
        for name in ("paths", "cka"):
            assert found[name]["status"] == ("ok" if detail else "skipped"), (name, detail)
            assert detail or "ensdiag train --detail" in found[name]["reason"]
