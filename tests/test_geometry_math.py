"""Member geometry's mathematics against independent references: CKA against a dense float64
implementation of the formulas on Gram matrices, weight matching against permutations made on
purpose, the rank check against constructed members, paths and BatchNorm recomputation by hand."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

from ensdiag.geometry.align import permutation_groups, permute_state, weight_matching
from ensdiag.geometry.cka import Moments
from ensdiag.geometry.paths import barrier, interpolate, recompute_batchnorm
from ensdiag.geometry.rank import defined_block, layer_structure, rank_structure
from ensdiag.nn import build_model


# ---------------------------------------------------------------- CKA


def linear_cka(x, y):
    """ensdiag's linear CKA of two representations held in memory (streamed moments of one batch)."""
    moments = Moments()
    moments.add([x, y])
    return float(moments.cka()[0][0, 1])


def debiased_cka(x, y):
    moments = Moments()
    moments.add([x, y])
    return float(moments.cka()[1][0, 1])


def dense_linear_cka(x, y):
    """Kornblith et al.'s definition on n×n Gram matrices: HSIC(K, L) = tr(KHLH) / (n − 1)²."""
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - 1.0 / n
    k, l = x @ x.T, y @ y.T
    hsic = lambda a, b: torch.trace(a @ h @ b @ h)  # noqa: E731
    return float(hsic(k, l) / torch.sqrt(hsic(k, k) * hsic(l, l)))


def dense_unbiased_hsic(k, l):
    """Song et al. (2012), eq. (5), written out on the Gram matrices."""
    n = k.shape[0]
    k, l = k.clone(), l.clone()
    k.fill_diagonal_(0)
    l.fill_diagonal_(0)
    ones = torch.ones(n, dtype=torch.float64)
    return (torch.trace(k @ l) + (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2))
            - 2.0 / (n - 2) * (ones @ k @ l @ ones)) / (n * (n - 3))


def dense_debiased_cka(x, y):
    k, l = x @ x.T, y @ y.T
    return float(dense_unbiased_hsic(k, l) / torch.sqrt(dense_unbiased_hsic(k, k) * dense_unbiased_hsic(l, l)))


def _related(n=60, d=7, d2=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator) + 3.0  # non-centred on purpose
    y = torch.tanh(x @ torch.randn(d, d2, dtype=torch.float64, generator=generator)) \
        + 0.5 * torch.randn(n, d2, dtype=torch.float64, generator=generator)
    return x, y


@pytest.mark.parametrize("seed", range(4))
def test_cka_matches_the_dense_formulas(seed):
    x, y = _related(seed=seed)
    assert linear_cka(x, y) == pytest.approx(dense_linear_cka(x, y), abs=1e-12)
    assert debiased_cka(x, y) == pytest.approx(dense_debiased_cka(x, y), abs=1e-12)


@pytest.mark.parametrize("batch", [1, 4, 7, 60])
def test_streamed_moments_give_the_same_cka_for_any_batching(batch):
    x, y = _related()
    z = x[:, :3] * 2 - 1
    moments = Moments()
    for start in range(0, len(x), batch):
        moments.add([x[start:start + batch], y[start:start + batch], z[start:start + batch]])
    linear, debiased = moments.cka()
    for (a, b), (u, v) in {(0, 1): (x, y), (0, 2): (x, z), (1, 2): (y, z)}.items():
        assert linear[a, b] == linear[b, a] == pytest.approx(dense_linear_cka(u, v), abs=1e-12)
        assert debiased[a, b] == pytest.approx(dense_debiased_cka(u, v), abs=1e-12)


def test_cka_of_a_representation_with_itself_is_one():
    x, _ = _related()
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert debiased_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling():
    x, y = _related(d=6)
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    for transformed in (x @ q, 7.5 * x, 0.01 * (x @ q)):
        assert linear_cka(transformed, y) == pytest.approx(linear_cka(x, y), abs=1e-10)
        assert debiased_cka(transformed, y) == pytest.approx(debiased_cka(x, y), abs=1e-10)
    stretched = x * torch.tensor([1.0, 5.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)  # not isotropic: it may change
    assert linear_cka(stretched, y) != pytest.approx(linear_cka(x, y), abs=1e-6)


def test_cka_is_exact_far_from_the_origin_and_undefined_for_constant_features():
    x, y = _related(n=300, d=8, d2=6)
    far_x, far_y = x + 1e4, y - 3e4  # sums of raw values would cancel catastrophically
    assert linear_cka(far_x, far_y) == pytest.approx(dense_linear_cka(x, y), abs=1e-9)
    assert debiased_cka(far_x, far_y) == pytest.approx(dense_debiased_cka(x, y), abs=1e-9)
    constant = torch.full((50, 3), 0.3, dtype=torch.float64)
    assert math.isnan(linear_cka(constant, x[:50])) and math.isnan(debiased_cka(constant, x[:50]))


def test_cka_needs_four_examples_for_the_debiased_estimator():
    x, y = _related(n=3)
    assert math.isnan(debiased_cka(x, y)) and not math.isnan(linear_cka(x, y))


# ---------------------------------------------------------------- alignment


def _plain(arch):
    shape, options = ((1, 6, 6), {}) if arch == "mlp" else ((3, 8, 8), {"width": 4})
    model = build_model(arch, "deep-ensemble", 2, 5, shape, arch_options=options)
    network = model.member_network(0).eval()
    for module in network.modules():  # BatchNorm statistics that are not the identity
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.normal_()
    return model, network, shape


@pytest.mark.parametrize("arch", ["mlp", "resnet18"])
def test_weight_matching_recovers_a_permutation_made_on_purpose(arch):
    model, network, shape = _plain(arch)
    groups = permutation_groups(network)
    state = network.state_dict()
    truth = {name: torch.randperm(state[keys[0][0]].shape[keys[0][1]]) for name, keys in groups.items()}
    shuffled = permute_state(state, groups, truth)
    assert any(not torch.equal(shuffled[key], state[key]) for key in state)
    other = model.member_network(0).eval()
    other.load_state_dict(shuffled)
    x = torch.randn(4, *shape)
    torch.testing.assert_close(other(x), network(x), rtol=0, atol=1e-5)  # the permutation kept the function

    perms = weight_matching(state, shuffled, groups)
    for name in groups:  # found: the inverse of the shuffle
        assert torch.equal(truth[name][perms[name]], torch.arange(len(perms[name])))
    aligned = permute_state(shuffled, groups, perms)
    assert all(torch.equal(aligned[key], state[key]) for key in state)


def test_resnet_groups_cover_every_channel_tensor_once_per_axis():
    _, network, _ = _plain("resnet18")
    seen = [entry for keys in permutation_groups(network).values() for entry in keys]
    assert len(seen) == len(set(seen))
    seen = set(seen)
    for key, tensor in network.state_dict().items():
        if not tensor.is_floating_point() or not tensor.dim():
            continue
        assert ((key, 0) in seen) == (not key.startswith("body.fc.")), key  # every channel; not the classes
        if tensor.dim() > 1:
            assert ((key, 1) in seen) == (key != "body.conv1.weight"), key  # every input but the image's


# ---------------------------------------------------------------- rank of W_i ⊘ W_j


@pytest.mark.parametrize("arch,variant,layout", [("mlp", "channel", "paper"), ("mlp", "channel", "original"),
                                                 ("resnet18", "channel", "paper"), ("resnet18", "channel", "original"),
                                                 ("resnet18", "kernel", "paper"), ("resnet18", "kernel", "original")])
def test_every_batch_ensemble_layer_ensdiag_builds_has_rank_one_ratios(arch, variant, layout):
    shape, options = ((1, 6, 6), {}) if arch == "mlp" else ((3, 8, 8), {"width": 4})
    model = build_model(arch, "batch-ensemble", 3, 5, shape, arch_options=options, variant=variant, layout=layout)
    found = rank_structure(model.member_weights())
    assert found["pairs"] == [[1, 0], [2, 0]] and found["layers"]
    for layer, entry in found["layers"].items():
        if variant == "channel" or "kernel_rank" not in entry:
            assert entry["rank"] == 1, layer
        else:  # kernel-wise fast weights: rank 1 inside each kernel, not across the layer
            assert entry["kernel_rank"] == 1, layer
    if variant == "kernel":
        assert any(entry["rank"] > 1 for entry in found["layers"].values())


def test_a_rank_two_perturbation_is_seen():
    torch.manual_seed(1)
    w = torch.randn(20, 12)
    r, s, u, v = torch.rand(20) + 0.5, torch.rand(12) + 0.5, torch.randn(20), torch.randn(12)
    rank_one = layer_structure(w * torch.outer(r, s), w)
    rank_two = layer_structure(w * (torch.outer(r, s) + 0.05 * torch.outer(u, v)), w)
    assert rank_one["rank"] == 1 and rank_one["singular_values"][1] < 1e-6
    assert rank_two["rank"] == 2 and rank_two["singular_values"][1] > 1e-3


def test_independent_members_have_full_rank_ratios():
    model = build_model("mlp", "deep-ensemble", 2, 5, (1, 6, 6))
    for entry in rank_structure(model.member_weights())["layers"].values():
        assert entry["rank"] == entry["max_rank"] > 1


def test_a_zero_fast_weight_on_each_side_leaves_the_rest_of_the_layer():
    w, r, s = torch.randn(6, 5), torch.rand(6) + 1, torch.rand(5) + 1
    r[1], s[3] = 0.0, 0.0  # a dead output row and a dead input column in member i
    found = layer_structure(w * torch.outer(r, s), w)
    assert found["rank"] == 1 and found["max_rank"] == 4 and found["entries_used"] == pytest.approx(20 / 30)


def test_layers_whose_ratio_has_one_row_tell_nothing():
    from ensdiag.analysis import analyze_model
    from ensdiag.analysis.geometry import ModelProbe
    from ensdiag.ensembles import as_ensemble

    def TwoMembers(weights):  # weights only: an ensemble that declares its members' effective weights
        return as_ensemble(lambda x: None, num_members=2, member_weights=lambda: weights)

    one_row = [{"a.weight": torch.randn(1, 5)}, {"a.weight": torch.randn(1, 5)}]  # independent, yet "rank 1 of 1"
    result = analyze_model(ModelProbe(TwoMembers(one_row), {}, None), only=["rank-structure"])["rank-structure"]
    assert result["rank_one"]["value"] is None and result["summary"].startswith("no layer")
    nan = [{"a.weight": torch.randn(4, 5)}, {"a.weight": torch.full((4, 5), float("nan"))}]
    result = analyze_model(ModelProbe(TwoMembers(nan), {}, None), only=["rank-structure"])["rank-structure"]
    assert result["status"] == "ok" and result["layers"]["a"]["rank"] is None and "non-finite" in result["layers"]["a"]["note"]


def test_weights_decayed_to_nothing_do_not_make_independent_members_look_rank_one():
    w_i, w_j = torch.randn(16, 12), torch.randn(16, 12)
    w_j[3, 5], w_j[7, 1] = 1e-31, -2e-35  # a ratio of 1e31 would be the only singular value that counts
    found = layer_structure(w_i, w_j)
    assert found["rank"] > 1 and found["entries_used"] < 1


def test_zeros_are_left_out_of_the_ratio():
    w = torch.randn(6, 5)
    w[2, 3] = 0.0
    found = layer_structure(w * torch.outer(torch.rand(6) + 1, torch.rand(5) + 1), w)
    assert found["rank"] == 1 and found["entries_used"] == pytest.approx(25 / 30)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.floats(0.0, 0.6), st.integers(0, 2**16))
def test_the_defined_block_is_full_and_maximal(rows, cols, missing, seed):
    defined = torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) >= missing
    kept_rows, kept_cols = defined_block(defined)
    block = defined[kept_rows][:, kept_cols]
    assert block.all()  # every kept entry carries a ratio
    assert (block.numel() > 0) == (kept_rows.any() and kept_cols.any())
    if block.numel():  # no dropped row or column could be added back
        assert not any(defined[i, kept_cols].all() for i in torch.nonzero(~kept_rows).flatten())
        assert not any(defined[kept_rows, j].all() for j in torch.nonzero(~kept_cols).flatten())
    if defined.all():
        assert kept_rows.all() and kept_cols.all()


def test_scattered_dead_inputs_cost_their_columns_not_every_row():
    """An MNIST-like input layer: 150 of 784 inputs have decayed weights in some of the 64 units,
    and 3 units are half dead. Whole rows or whole columns would keep about 1/8 of the layer
    (every column meets a dead entry of a half-dead unit); the block drops those 3 units and the
    dead inputs' columns, and still finds the rank-1 ratio."""
    generator = torch.Generator().manual_seed(0)
    w, r, s = torch.randn(64, 784, generator=generator), torch.rand(64, generator=generator) + 1, torch.rand(784, generator=generator) + 1
    dead = torch.randperm(784, generator=generator)[:150]
    w[:, dead] *= torch.where(torch.rand(64, 150, generator=generator) < 0.3, 1e-30, 1.0)
    w[:3] *= torch.where(torch.rand(3, 784, generator=generator) < 0.5, 1e-30, 1.0)
    found = layer_structure(w * torch.outer(r, s), w)
    assert found["rank"] == 1 and found["max_rank"] == 61
    defined = w.abs() > 1e-3 * w.abs().median()
    whole_lines = max(defined.all(1).sum() * 784, defined.all(0).sum() * 64) / w.numel()
    assert whole_lines < 0.15 and found["entries_used"] > 0.7


# ---------------------------------------------------------------- paths


def test_barrier_by_hand():
    ts = [0.0, 0.5, 1.0]
    assert barrier(ts, [1.0, 3.0, 2.0]) == pytest.approx(1.5)  # 3 − (1 + 2)/2
    assert barrier(ts, [1.0, 1.2, 2.0]) == pytest.approx(0.0)  # below the line: the ends count
    assert barrier(ts, [0.9, 0.6, 0.8], higher_is_worse=False) == pytest.approx(0.25)


def test_interpolation_ends_are_the_members():
    a, b = {"w": torch.zeros(3), "n": torch.tensor(5)}, {"w": torch.ones(3), "n": torch.tensor(9)}
    assert torch.equal(interpolate(a, b, 0.0)["w"], a["w"]) and torch.equal(interpolate(a, b, 1.0)["w"], b["w"])
    assert torch.equal(interpolate(a, b, 0.25)["w"], torch.full((3,), 0.25)) and interpolate(a, b, 0.5)["n"] == 5


def test_batchnorm_recomputation_is_the_training_images_statistics():
    _, network, shape = _plain("resnet18")
    images = torch.rand(37, *shape)
    assert recompute_batchnorm(network, images, lambda x: x, batch_size=10)
    with torch.no_grad():
        stem = network.body.conv1(images)
    # momentum=None: the plain average over near-equal batches (10, 9, 9, 9) of each one's mean and unbiased variance
    batches = torch.tensor_split(stem, 4)
    means = torch.stack([batch.mean(dim=(0, 2, 3)) for batch in batches]).mean(0)
    variances = torch.stack([batch.var(dim=(0, 2, 3)) for batch in batches]).mean(0)
    torch.testing.assert_close(network.body.bn1.running_mean, means, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(network.body.bn1.running_var, variances, rtol=1e-4, atol=1e-6)
    assert not network.training and network.body.bn1.momentum == 0.1
    for count in (2, 501):  # no batch of a single image, whatever the count (an 8-pixel ResNet ends in 1×1 maps)
        assert recompute_batchnorm(network, torch.rand(count, *shape), lambda x: x)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(2, 4), st.sampled_from(["random", "zeros", "one_zero_row",
                                                                                   "tiny", "rank_one", "constant"]),
       st.integers(0, 2**16))
def test_per_layer_rank_fields_never_contradict_each_other(rows, cols, members, kind, seed):
    """Over random and degenerate layers: a rank is null exactly where no entry carries a ratio,
    never above max_rank, and the pairs' min ≤ median ≤ max = rank."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, cols, generator=generator)
    weights = []
    for _ in range(members):
        w = torch.randn(rows, cols, generator=generator)
        if kind == "zeros":
            w = torch.zeros(rows, cols)
        elif kind == "one_zero_row":
            w[0] = 0.0
        elif kind == "tiny":
            w = w * torch.where(torch.rand(rows, cols, generator=generator) < 0.3, 1e-30, 1.0)
        elif kind == "rank_one":
            w = base * torch.outer(torch.rand(rows, generator=generator) + 0.5, torch.rand(cols, generator=generator) + 0.5)
        elif kind == "constant":
            w = torch.ones(rows, cols)
        weights.append({"layer.weight": w})
    entry = rank_structure(weights)["layers"]["layer"]
    assert 0.0 <= entry["entries_used"] <= 1.0
    if entry["rank"] is None:
        assert entry["max_rank"] is None and entry["note"]
        return
    assert 0 <= entry["rank"] <= entry["max_rank"] <= min(rows, cols)
    assert entry["entries_used"] > 0
    pair = entry["pair_ranks"]
    assert pair["min"] <= pair["median"] <= pair["max"] == entry["rank"]
    if kind in ("rank_one", "constant"):
        assert entry["rank"] == 1


def test_the_training_loss_is_read_along_the_path_on_the_training_sample():
    """Ainsworth et al.'s barrier: the same path evaluated on a fixed labelled training sample;
    each end's training loss is that network's own cross-entropy on it."""
    from ensdiag.data.registry import Split
    from ensdiag.geometry.paths import path
    a, b = build_model("mlp", "single", 1, 3, (1, 4, 4)), build_model("mlp", "single", 1, 3, (1, 4, 4))
    generator = torch.Generator().manual_seed(0)
    test = Split(torch.rand(20, 1, 4, 4, generator=generator), torch.randint(0, 3, (20,), generator=generator))
    train = Split(torch.rand(30, 1, 4, 4, generator=generator), torch.randint(0, 3, (30,), generator=generator))
    scratch = build_model("mlp", "single", 1, 3, (1, 4, 4)).member_network(0)
    ends = [model.member_network(0).state_dict() for model in (a, b)]
    found = path(scratch, ends[0], ends[1], test, lambda x: x, None, 5, train)
    assert len(found["train_loss"]) == 5 and len(found["loss"]) == 5
    for state, at in ((ends[0], 0), (ends[1], -1)):
        scratch.load_state_dict(state)
        with torch.no_grad():  # each end's own cross-entropy, by torch (its one member: [1, B, C])
            assert found["train_loss"][at] == pytest.approx(F.cross_entropy(scratch(train.images)[0], train.labels).item())
            assert found["loss"][at] == pytest.approx(F.cross_entropy(scratch(test.images)[0], test.labels).item())
    assert "train_loss" not in path(scratch, ends[0], ends[1], test, lambda x: x, None, 3)


def _two_mlps():
    from ensdiag.data.registry import Split
    generator = torch.Generator().manual_seed(0)
    test = Split(torch.rand(40, 1, 4, 4, generator=generator), torch.randint(0, 3, (40,), generator=generator))
    ends = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        ends.append(build_model("mlp", "single", 1, 3, (1, 4, 4)).member_network(0).state_dict())
    return build_model("mlp", "single", 1, 3, (1, 4, 4)).member_network(0), ends, test


def test_an_adaptive_path_evaluates_a_flat_curve_on_six_points_of_the_full_grid():
    from ensdiag.geometry.paths import path
    scratch, ends, test = _two_mlps()
    full = path(scratch, ends[0], ends[0], test, lambda x: x, None, 11)
    adaptive = path(scratch, ends[0], ends[0], test, lambda x: x, None, "adaptive")
    assert adaptive["t"] == full["t"][::2]
    assert adaptive["loss"] == pytest.approx(full["loss"][::2], abs=1e-12)


def test_an_adaptive_path_adds_exactly_the_midpoints_next_to_a_bend():
    """Every value equals the full grid's at the same t; a midpoint is evaluated iff a second
    difference of the coarse curve at either of its ends passes the tolerance."""
    from ensdiag.geometry.paths import FLAT_ACCURACY, FLAT_LOSS, barrier, path
    scratch, ends, test = _two_mlps()
    full = path(scratch, ends[0], ends[1], test, lambda x: x, None, 11)
    adaptive = path(scratch, ends[0], ends[1], test, lambda x: x, None, "adaptive")
    coarse = list(range(0, 11, 2))
    bends = set()
    for key, tolerance in (("loss", FLAT_LOSS), ("accuracy", FLAT_ACCURACY)):
        values = [full[key][i] for i in coarse]
        bends |= {j for j in range(1, 5) if abs(values[j - 1] - 2 * values[j] + values[j + 1]) > tolerance}
    expected = sorted(coarse + [2 * j + 1 for j in range(5) if j in bends or j + 1 in bends])
    assert bends, "the two random members should bend the loss somewhere"
    assert adaptive["t"] == [full["t"][i] for i in expected]
    assert adaptive["loss"] == pytest.approx([full["loss"][i] for i in expected], rel=1e-6)
    assert barrier(adaptive["t"], adaptive["loss"]) <= barrier(full["t"], full["loss"]) + 1e-9


@pytest.mark.parametrize("value", ["1", "0", "102", "x", "-3", "2.5"])
def test_path_points_other_than_an_integer_or_adaptive_are_refused(value, capsys, tmp_path):
    from .cli import assert_one_line_error
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"")  # refused for its option before it is read
    assert_one_line_error(capsys, "diversity", model, "--path-points", value, match="^error: --path-points must be")


def test_the_rank_tolerance_is_float_rounding_not_a_fixed_fraction():
    """A ratio whose smallest singular value is 5e-6 of the largest (independent members can give
    that) has full rank: float32 rounding can add only ~δ‖R‖_F ≈ 3e-7; the rank-1 ratio of a rebuilt
    float32 BatchEnsemble weight stays rank 1; and the tolerance is recorded per layer."""
    generator = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(6, 6, generator=generator, dtype=torch.float64))
    sigma = torch.tensor([1.0, 0.5, 0.2, 0.1, 0.01, 5e-6], dtype=torch.float64)
    ratio = u @ torch.diag(sigma) @ v.T
    w_j = (1 + torch.rand(6, 6, generator=generator, dtype=torch.float64)) * torch.sign(torch.randn(6, 6, generator=generator))
    found = layer_structure((ratio * w_j).float(), w_j.float())
    assert found["rank"] == 6 and found["singular_values"][0] == 1.0
    delta = 4 * torch.finfo(torch.float32).eps / 2
    assert found["tolerance"] == pytest.approx(delta * float(sigma.pow(2).sum().sqrt()) / 1.0, rel=0.01)
    r, s = torch.rand(6, generator=generator) + 0.5, torch.rand(6, generator=generator) + 0.5
    w = torch.randn(6, 6, generator=generator)
    rebuilt = w * r[:, None] * s[None, :]  # float32: each entry rounded twice, as a member's effective weight
    assert layer_structure(rebuilt, w)["rank"] == 1
    assert layer_structure(rebuilt.half(), w.half())["tolerance"] > 1000 * layer_structure(rebuilt, w)["tolerance"]
