"""The baselines a weight cosine is read against: the cosine at initialisation (recorded at
training, rebuilt from any spec) and the aligned cosine of untrained, independent members."""

import json

import pytest
import torch

from ensdiag.checkpoint import load_model, save_model
from ensdiag.geometry.align import permutation_groups, permute_state, restarts
from ensdiag.geometry.baselines import aligned_null, initial_cosine, initial_cosine_of_spec, recorded_or_rebuilt
from ensdiag.nn import METHODS, build_model
from tests.cli import run_cli


def _model(method, arch="mlp", k=3):
    shape, arch_options = ((1, 6, 6), {}) if arch == "mlp" else ((3, 8, 8), {"width": 4})
    return build_model(arch, method, METHODS[method].fixed_members or k, 4, shape, arch_options=arch_options)


def _dense_cosine(weights) -> float:
    """Mean off-diagonal cosine of the flattened, concatenated member weights, in float64."""
    flat = torch.stack([torch.cat([w.double().flatten() for w in member.values()]) for member in weights])
    unit = flat / flat.norm(dim=1, keepdim=True)
    cosine = unit @ unit.T
    k = len(weights)
    return float((cosine.sum() - cosine.diagonal().sum()) / (k * (k - 1)))


@pytest.mark.parametrize("method", list(METHODS))
def test_the_initial_cosine_of_every_method_against_a_dense_computation(method):
    model = _model(method)
    found = initial_cosine(model)
    weights = model.member_weights()
    if len(weights) < 2:
        assert found is None  # one weight set: no pair to compare
        return
    assert found["mean"] == pytest.approx(_dense_cosine(weights), abs=1e-9)


def test_batch_ensemble_starts_far_from_independent_members():
    """One shared W with random-sign rank-1 factors: members start correlated; independent ones do not."""
    assert initial_cosine(_model("batch-ensemble", k=4))["mean"] > 0.3
    assert abs(initial_cosine(_model("deep-ensemble", k=4))["mean"]) < 0.1


def test_a_spec_rebuilds_the_recorded_value_and_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    model = _model("batch-ensemble")
    before = torch.get_rng_state()
    assert initial_cosine_of_spec(model.spec, 7)["mean"] == initial_cosine(model)["mean"]
    assert torch.equal(torch.get_rng_state(), before)
    assert initial_cosine_of_spec(model.spec, 8)["mean"] != initial_cosine(model)["mean"]


@pytest.mark.parametrize("arch", ["mlp", "resnet18"])
def test_the_aligned_null_is_weight_matching_of_untrained_independent_members(arch):
    model = _model("deep-ensemble", arch)
    null = aligned_null(model, seed=3)
    assert null["members"] == 3
    assert null["aligned"] > null["raw"] + 0.02  # matching alone raises the cosine of random members
    assert null == aligned_null(model, seed=3)  # seeded
    # the same numbers by hand: fresh plain networks under the same seed, aligned the same way
    with torch.random.fork_rng():
        torch.manual_seed(3)
        biases = model.member_state_dict(0)
        networks = [model.plain_network(biases_of=biases) for _ in range(3)]
    states = [network.state_dict() for network in networks]
    groups = permutation_groups(networks[0])  # each member permuted by its restart of highest objective
    aligned = [states[0]] + [permute_state(s, groups, restarts(states[0], s, groups)[0]["perms"]) for s in states[1:]]
    compared = [name for name, module in networks[0].body.named_modules() if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d))]
    keys = [f"body.{name}.{kind}" for name in compared for kind in ("weight", "bias") if f"body.{name}.{kind}" in states[0]]
    assert null["raw"] == pytest.approx(_dense_cosine([{k: s[k] for k in keys} for s in states]), abs=1e-9)
    assert null["aligned"] == pytest.approx(_dense_cosine([{k: s[k] for k in keys} for s in aligned]), abs=1e-9)


def test_the_alignment_analyzer_shows_the_null_next_to_the_trained_value():
    from tests.test_geometry import _probe
    from ensdiag.analysis import analyze_model
    result = analyze_model(_probe("deep-ensemble"), only=["alignment"])["alignment"]
    assert result["null"]["aligned"]["value"] > 0 and result["null"]["members"] == 3
    assert all("null_aligned" in entry for entry in result["layers"].values())


def test_training_records_the_initial_cosine_and_model_files_carry_it(finished_run, capsys):
    run = finished_run / "batch-ensemble" / "seed-1"
    metrics = json.loads((run / "metrics.json").read_text())["analyzers"]["weight-similarity"]
    assert metrics["initial"]["source"] == "recorded at training, seed 1"
    model = load_model(run / "model.safetensors")
    assert model.initial_cosine == {"mean": metrics["initial"]["value"], "seed": 1}
    assert initial_cosine_of_spec(model.spec, 1)["mean"] == metrics["initial"]["value"]  # rebuildable exactly
    code, out, _ = run_cli(capsys, "diversity", run / "model.safetensors", "--no-geometry")
    assert code == 0 and f"at initialisation {metrics['initial']['value']:.3f}, recorded at training, seed 1" in out
    single = json.loads((finished_run / "single" / "seed-1" / "metrics.json").read_text())["analyzers"]
    assert single["weight-similarity"]["status"] == "skipped"


@pytest.mark.parametrize("stored", ['{"mean": "0.5", "seed": 1}', '{"mean": 5.0, "seed": 1}', '{"mean": 0.5, "seed": true}',
                                   '{"mean": NaN, "seed": 1}', "[0.5]", "not json", '{"mean": 0.5}'])
def test_a_damaged_recorded_value_is_rebuilt_from_the_spec_instead(stored, tmp_path):
    model = _model("batch-ensemble")
    save_model(model, tmp_path / "m.safetensors", {"ensdiag.initial_cosine": stored})
    loaded = load_model(tmp_path / "m.safetensors")
    assert loaded.initial_cosine is None  # the damaged field does not count as recorded
    found = recorded_or_rebuilt(loaded, seed=0)
    assert found["source"] == "a fresh build of the model's spec, seed 0"
    assert found["mean"] == initial_cosine_of_spec(model.spec, 0)["mean"]


def test_the_report_table_has_both_baselines(finished_run):
    from ensdiag.report import make_report
    report = make_report(finished_run, write=False)
    diversity = next(table for table in report["tables"] if table["id"] == "diversity")
    labels = [column["name"] for column in diversity["columns"]]
    assert labels.index("weight cosine at init") == labels.index("weight cosine") + 1
    row = next(row for row in diversity["rows"] if row["method"] == "batch-ensemble")
    assert row["cells"][labels.index("weight cosine at init")]["mean"] > 0.3
