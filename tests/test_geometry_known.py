"""Member geometry on ensembles whose answers are known without ensdiag (issue 47, item 7).

- **A permuted copy**: member 1 is member 0 with its hidden units (channels) shuffled — one
  function, one solution. Aligned weight cosine 1 in every layer, the aligned member computes what
  it did, CKA 1 in every layer and split (a permutation is an orthogonal transform), every barrier
  0 (the path joins a network to itself), with its interval holding 0. The raw cosine and the
  rank of W_1 ⊘ W_0 read the shuffled order and have no known value here.
- **A rescaled BatchEnsemble**: r_i → r_i ∘ a and s_i → s_i ∘ b for every member with the shared
  weight W → W ⊘ (a bᵀ): every member's effective weight W ∘ r_i s_iᵀ, hence its function, is
  unchanged, so every geometry number (weight cosine, CKA, paths, rank of the ratios) is too.
- **Independent seeds** (the null): freshly initialised members, drawn as the null baseline draws
  its own, read a raw and an aligned weight cosine within the spread of such draws around the
  null baseline the result prints. (CKA and barriers of untrained networks have no known value.)
"""

import math

import pytest
import torch

from ensdiag.analysis import ANALYZERS, analyze_model, analyze_predictions
from ensdiag.analysis.geometry import ModelProbe
from ensdiag.data.registry import Split
from ensdiag.nn import build_model

GEOMETRY = sorted(name for name, analyzer in ANALYZERS.items() if analyzer.needs == "model")
ARCHES = {"mlp": ((1, 6, 6), {}), "resnet18": ((3, 8, 8), {"width": 4})}


def _data(shape):
    generator = torch.Generator().manual_seed(0)
    test = Split(torch.rand(40, *shape, generator=generator), torch.randint(0, 4, (40,), generator=generator))
    ood = Split(torch.rand(30, *shape, generator=generator), None)
    return {"id": test, "ood": ood}, torch.rand(50, *shape, generator=generator), torch.randint(0, 4, (50,), generator=generator)


def _probe(ensemble, shape, **options):
    splits, train, labels = _data(shape)
    return ModelProbe(ensemble, splits, lambda x: x, train, train_labels=labels, **options)


def _numbers(value, path=()):
    """Every number of a result, by its path: {("cka", "splits", …): float}."""
    if isinstance(value, dict):
        return {key: number for name, item in value.items() for key, number in _numbers(item, (*path, name)).items()}
    if isinstance(value, (list, tuple)):
        return {key: number for index, item in enumerate(value) for key, number in _numbers(item, (*path, index)).items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {path: float(value)}
    return {}


# ------------------------------------------------------------------ a permuted copy

def _permuted_copy(arch):
    """A Deep Ensemble of two whose member 1 is member 0 with every permutation group shuffled, and its shape."""
    from ensdiag.geometry.align import permutation_groups, permute_state
    from ensdiag.nn.members import stacked_state
    shape, options = ARCHES[arch]
    torch.manual_seed(1)
    model = build_model(arch, "deep-ensemble", 2, 4, shape, arch_options=options).eval()
    first = model.member_network(0)
    groups = permutation_groups(first)
    generator = torch.Generator().manual_seed(2)
    perms = {name: torch.randperm(first.state_dict()[keys[0][0]].shape[keys[0][1]], generator=generator)
             for name, keys in groups.items()}
    views = stacked_state(model)  # member-first views of the stacked tensors
    with torch.no_grad():
        for key, value in permute_state(first.state_dict(), groups, perms).items():
            if value.dim():
                views[key.removeprefix("body.")][1].copy_(value)
    return model, shape


@pytest.mark.parametrize("arch", list(ARCHES))
def test_a_permuted_copy_is_one_solution_in_every_geometry_number(arch):
    model, shape = _permuted_copy(arch)
    with torch.no_grad():
        outputs = model(_data(shape)[0]["id"].images)
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)  # the copy computes what member 0 does
    probe = _probe(model, shape, detail=True)
    if arch == "resnet18":
        probe.limits["restarts"] = 3  # the search's rule is tested in test_least_barrier.py; the least is 0 at once
    results = analyze_model(probe)
    assert set(results) == set(GEOMETRY)
    alignment = results["alignment"]
    assert alignment["raw"]["mean"]["value"] < 0.9  # the shuffle is real
    assert alignment["aligned"]["mean"]["value"] == pytest.approx(1.0, abs=1e-9)
    assert all(layer["aligned"] == pytest.approx(1.0, abs=1e-9) for layer in alignment["layers"].values())
    assert alignment["max_output_change"]["value"] < 1e-4
    for split in ("id", "ood"):
        layers = results["cka"]["splits"][split]["layers"]
        assert layers and all(entry["mean_linear"]["value"] == pytest.approx(1.0, abs=1e-6) for entry in layers.values())
    paths = results["paths"]
    for key in ("loss_barrier", "accuracy_barrier", "train_loss_barrier"):
        entry = paths[key]
        assert entry["value"] == pytest.approx(0.0, abs=1e-6), key
        assert entry["interval"]["low"] <= 1e-6 and entry["interval"]["high"] >= -1e-9, (key, entry["interval"])
    pair = paths["pairs"][0]
    assert max(abs(a - b) for a, b in zip(pair["loss"], [pair["loss"][0]] * len(pair["loss"]))) < 1e-5  # a flat path


# ------------------------------------------------------------------ a rescaled BatchEnsemble

def _rescale(model, seed=3):
    """r_i ∘ a, s_i ∘ b in every BatchEnsemble layer, W ⊘ (a bᵀ) (broadcast as the layer's own
    `dense_weights` broadcasts r and s); a, b positive, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for layer in model.modules():
            effective = getattr(layer, "dense_weights", None)
            if not (hasattr(layer, "r") and hasattr(layer, "s") and effective):
                continue
            a = 0.5 + 1.5 * torch.rand(layer.r.shape[1:], generator=generator, dtype=layer.r.dtype)
            b = 0.5 + 1.5 * torch.rand(layer.s.shape[1:], generator=generator, dtype=layer.s.dtype)
            weight, r, s = layer.weight.clone(), layer.r.clone(), layer.s.clone()
            layer.weight.fill_(1.0)  # the layer's own broadcast of one member's a, b: the factor a bᵀ
            layer.r.copy_(a.expand_as(r))
            layer.s.copy_(b.expand_as(s))
            factor = effective()[0].clone()
            layer.weight.copy_(weight / factor)
            layer.r.copy_(r * a)
            layer.s.copy_(s * b)
            changed += 1
    return changed


def _weight_cosine(probe):
    logits = {"id": {"logits": torch.zeros(probe.ensemble.num_members, 1, 4), "labels": torch.zeros(1, dtype=torch.long)}}
    return analyze_predictions(logits, weights=probe.ensemble.member_weights(), only=["weight-similarity"])["analyzers"]


@pytest.mark.parametrize("arch, variant", [("mlp", None), ("resnet18", "channel"), ("resnet18", "kernel")])
def test_batch_ensemble_fast_weights_rescaled_into_the_shared_weight_change_no_geometry_number(arch, variant):
    shape, options = ARCHES[arch]
    torch.manual_seed(4)
    model = build_model(arch, "batch-ensemble", 3, 4, shape, arch_options=options,
                        **({"variant": variant} if variant else {})).eval()
    before = _probe(model, shape, detail=True)
    effective = [{name: w.clone() for name, w in member.items()} for member in before.ensemble.member_weights()]
    found = {**analyze_model(before), **_weight_cosine(before)}
    assert _rescale(model) >= 2
    after = _probe(model, shape, detail=True)
    for member, was in zip(after.ensemble.member_weights(), effective, strict=True):  # the same W ∘ r_i s_iᵀ …
        assert member.keys() == was.keys()
        assert all(torch.allclose(member[name], was[name], rtol=1e-5, atol=1e-6) for name in was)
    assert any(not torch.allclose(layer.r, layer.r * 0 + 1) for layer in model.modules() if hasattr(layer, "r"))
    again = {**analyze_model(after), **_weight_cosine(after)}
    assert {name: result["status"] for name, result in again.items()} == {name: result["status"] for name, result in found.items()}
    assert found["weight-similarity"]["status"] == "ok" and found["cka"]["status"] == "ok"
    assert found["paths"]["status"] == "ok" and found["rank-structure"]["status"] == "ok"
    numbers, numbers_again = _numbers(found), _numbers(again)
    assert numbers.keys() == numbers_again.keys() and len(numbers) > 50
    for key, value in numbers.items():  # … so the same cosine, CKA, paths and ratios' ranks
        if key[-1] == "seconds" or "singular_values" in key or any(isinstance(part, str) and "tolerance" in part for part in key):
            continue  # timings, and what float rounding alone sets (the ratio's trailing singular values)
        assert numbers_again[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    rank, rank_again = found["rank-structure"], again["rank-structure"]
    assert rank["summary"] == rank_again["summary"]
    assert rank["summary"].startswith("rank 1 per kernel" if variant == "kernel" else "rank 1 in every layer")


# ------------------------------------------------------------------ independent seeds: the null

@pytest.mark.parametrize("arch", list(ARCHES))
def test_independent_members_read_the_null_weight_cosines(arch):
    """Deep Ensembles of freshly initialised members (five seeds): each one's raw and aligned weight
    cosine lies within the spread of these draws (four standard deviations) around the null baseline
    the alignment prints, and the raw one's null is near 0."""
    shape, options = ARCHES[arch]
    raw, aligned, nulls = [], [], []
    for seed in range(5):
        torch.manual_seed(100 + seed)
        model = build_model(arch, "deep-ensemble", 3, 4, shape, arch_options=options).eval()
        probe = _probe(model, shape)
        result = analyze_model(probe, only=["alignment"])["alignment"]
        raw.append(result["raw"]["mean"]["value"])
        aligned.append(result["aligned"]["mean"]["value"])
        nulls.append((result["null"]["raw"]["value"], result["null"]["aligned"]["value"]))
        assert _weight_cosine(probe)["weight-similarity"]["mean"]["value"] == pytest.approx(raw[-1], abs=1e-12)
    assert len(set(nulls)) == 1  # the null is drawn from a fixed seed: the same for every model of this shape
    null_raw, null_aligned = nulls[0]
    assert abs(null_raw) < 0.05
    for values, null in ((raw, null_raw), (aligned, null_aligned)):
        mean = sum(values) / len(values)
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        assert all(abs(v - null) <= 4 * spread + 1e-3 for v in values), (values, null, spread)
    assert min(aligned) > max(raw)  # matching raises the cosine of unrelated members: why the null is printed
