"""Each ensemble layer's vectorised forward equals plain F.linear / F.conv2d per member."""

import pytest
import torch
import torch.nn.functional as F

from ensdiag.errors import EnsdiagError
from ensdiag.nn.kits.batch_ensemble import BatchConv2d, BatchLinear, init_fast_weights_, parse_fast_weight_init
from ensdiag.nn.kits.deep_ensemble import EnsembleConv2d, EnsembleLinear

K, B = 3, 5


def member_major(xs):
    return xs.flatten(0, 1)


def channel_stacked(xs):
    return xs.transpose(0, 1).flatten(1, 2)


def from_channel_stacked(h):
    return h.unflatten(1, (K, -1)).transpose(0, 1).flatten(0, 1)


LAYERS = {
    "be-linear": (lambda: BatchLinear(7, 6, K), (7,), member_major, lambda h: h, F.linear),
    "be-conv-channel": (lambda: BatchConv2d(4, 6, 3, K, stride=2, padding=1, bias=True), (4, 9, 9),
                        member_major, lambda h: h, lambda x, w, b: F.conv2d(x, w, b, 2, 1)),
    "be-conv-kernel": (lambda: BatchConv2d(4, 6, 3, K, padding=1, bias=True, variant="kernel"), (4, 9, 9),
                       member_major, lambda h: h, lambda x, w, b: F.conv2d(x, w, b, 1, 1)),
    "de-linear": (lambda: EnsembleLinear(7, 6, K), (7,), member_major, lambda h: h, F.linear),
    "de-conv": (lambda: EnsembleConv2d(4, 6, 3, K, stride=2, padding=1, bias=True), (4, 9, 9),
                channel_stacked, from_channel_stacked, lambda x, w, b: F.conv2d(x, w, b, 2, 1)),
}


@pytest.mark.parametrize("kind", LAYERS)
def test_member_slice_equals_dense_reconstruction(kind):
    make, shape, enter, leave, dense = LAYERS[kind]
    layer = make()
    with torch.no_grad():  # make biases non-zero so they are checked too
        for name, param in layer.named_parameters():
            if name == "bias":
                param.normal_()
    xs = torch.randn(K, B, *shape)
    out = leave(layer(enter(xs))).unflatten(0, (K, B))
    for i in range(K):
        state = layer.member_state(i)
        expected = dense(xs[i], state["weight"], state.get("bias"))
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("input_grad", [True, False], ids=["hidden-layer", "first-layer"])
@pytest.mark.parametrize("kind", LAYERS)
def test_gradients_equal_dense_reconstruction(kind, input_grad):
    """Input and parameter gradients (whatever backward a layer uses) equal autograd's
    through plain F.linear / F.conv2d on each member's reconstructed weights."""
    make, shape, enter, leave, dense = LAYERS[kind]
    torch.manual_seed(0)
    layer = make().double()
    xs = torch.randn(K, B, *shape, dtype=torch.float64, requires_grad=input_grad)
    out = leave(layer(enter(xs))).unflatten(0, (K, B))
    states = [layer.member_state(i) for i in range(K)]
    expected = torch.stack([dense(xs[i], state["weight"], state.get("bias")) for i, state in enumerate(states)])
    upstream = torch.randn_like(out)
    inputs = [xs, *layer.parameters()] if input_grad else list(layer.parameters())
    got = torch.autograd.grad(out, inputs, upstream)
    want = torch.autograd.grad(expected, inputs, upstream)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_kernel_variant_reconstruction_is_rank_one_per_kernel():
    layer = BatchConv2d(2, 3, 3, K, variant="kernel")
    kernel = layer.member_state(1)["weight"]
    ratio = kernel / layer.weight  # r ⊗ s over the two spatial axes: rank 1 per (o, c)
    assert torch.linalg.matrix_rank(ratio.flatten(0, 1), rtol=1e-4).max() == 1
    expected = layer.weight[0, 1] * torch.outer(layer.r[1, 0, 1], layer.s[1, 0, 1])
    torch.testing.assert_close(kernel[0, 1], expected)


def mean_member_cosine(layer):
    w = torch.stack([layer.member_state(i)["weight"].flatten() for i in range(layer.num_members)])
    cos = F.cosine_similarity(w[:, None], w[None, :], dim=-1)
    return cos[~torch.eye(len(w), dtype=torch.bool)].mean().item()


def test_normal_init_cosine_matches_theory():
    sigma = 0.5
    layer = BatchLinear(1024, 1024, 4, init=f"normal:{sigma}")
    assert mean_member_cosine(layer) == pytest.approx(1 / (1 + sigma**2) ** 2, abs=0.02)


@pytest.mark.parametrize("init", ["ones", "random-sign:1.0"])
def test_identical_fast_weights_give_cosine_exactly_one(init):
    layer = BatchLinear(64, 32, 4, init=init)
    assert mean_member_cosine(layer) == pytest.approx(1.0, abs=1e-6)


def test_random_sign_init_draws_plus_minus_one_with_probability_p():
    values = init_fast_weights_(torch.empty(100_000), "random-sign:0.3")
    assert set(values.unique().tolist()) == {-1.0, 1.0}
    assert (values > 0).float().mean().item() == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize("bad", ["gaussian", "normal:x", "ones:2", "random-sign:1.5", "normal:-1"])
def test_bad_init_spec_is_a_clear_error(bad):
    with pytest.raises(EnsdiagError, match="init"):
        parse_fast_weight_init(bad)
