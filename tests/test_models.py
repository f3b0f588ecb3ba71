"""Whole models: members rebuilt as plain networks, vectorised vs separate, parameter counts."""

import math

import pytest
import torch
from torch import nn

import ensdiag
from ensdiag.errors import EnsdiagError
from ensdiag.nn import ARCHITECTURES, METHODS

# architectures written against the kits (not torchvision's whole networks, which are imported)
KIT_ARCHITECTURES = [name for name, builder in ARCHITECTURES.items() if not builder.whole_networks]

SHAPES = {"mlp": (1, 8, 8), "resnet18": (3, 16, 16)}  # small inputs keep the suite fast
K = 3


def build(arch, method, **options):
    k = 1 if method == "single" else K
    return ensdiag.build_model(arch, method, num_members=k, num_classes=5, input_shape=SHAPES[arch], **options)


def plain_member(model, i):
    return model.member_network(i)


def randomise_batchnorm(model):
    """Non-trivial running statistics and affine terms, so eval mode really uses them."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.normal_(1, 0.1)
                module.bias.normal_(0, 0.1)


@pytest.mark.parametrize("arch", KIT_ARCHITECTURES)
@pytest.mark.parametrize("method,options", [("deep-ensemble", {}), ("batch-ensemble", {"variant": "channel"}),
                                            ("batch-ensemble", {"variant": "kernel"}), ("single", {}),
                                            ("batch-ensemble", {"variant": "channel", "layout": "paper"}),
                                            ("batch-ensemble", {"variant": "kernel", "layout": "paper"}),
                                            ("packed-ensemble", {}), ("packed-ensemble", {"alpha": 3.0, "gamma": 2}),
                                            ("packed-ensemble", {"alpha": 2.0, "gamma": 5, "head_subgroups": True}),
                                            ("mimo", {})])
def test_member_rebuilt_as_plain_network_gives_its_logits(arch, method, options):
    if options.get("variant") == "kernel" and not ARCHITECTURES[arch].convolutional:
        pytest.skip("kernel-wise BatchEnsemble needs convolutions (refused on this architecture)")
    model = build(arch, method, **options)
    with torch.no_grad():  # BatchEnsemble biases start at zero: make them matter
        for name, param in model.named_parameters():
            if name.endswith("bias") and param.dim() == 2:
                param.normal_(0, 0.1)
    randomise_batchnorm(model)
    model.eval()
    x = torch.randn(4, *SHAPES[arch])
    logits = model(x)
    for i in range(model.num_members):
        torch.testing.assert_close(logits[i], plain_member(model, i).eval()(x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", KIT_ARCHITECTURES)
def test_deep_ensemble_vectorised_equals_members_run_separately_in_training(arch):
    """Own inputs per member and per-member BatchNorm batch statistics, in train mode."""
    model = build(arch, "deep-ensemble").train()
    members = [plain_member(model, i).train() for i in range(K)]
    xs = torch.randn(K, 6, *SHAPES[arch])
    out = model.forward_members(xs)
    for i, member in enumerate(members):
        torch.testing.assert_close(out[i], member.forward_members(xs[i:i + 1])[0], rtol=1e-4, atol=1e-4)
    for i, member in enumerate(members):  # running statistics were updated per member
        for key, value in model.member_state_dict(i).items():
            if "running" in key:
                torch.testing.assert_close(value, member.state_dict()[f"body.{key}"])


def test_deep_ensemble_members_have_their_own_initialisation():
    weights = build("mlp", "deep-ensemble").member_weights()
    assert not torch.equal(weights[0]["hidden.0.weight"], weights[1]["hidden.0.weight"])
    bound = 1 / math.sqrt(64)  # nn.Linear's default init bound for fan-in 64
    assert weights[0]["hidden.0.weight"].abs().max() <= bound


@pytest.mark.parametrize("arch", KIT_ARCHITECTURES)
def test_mc_dropout_draws_independent_masks_per_pass_even_in_eval(arch):
    model = build(arch, "mc-dropout", dropout=0.3).eval()
    x = torch.randn(2, *SHAPES[arch])
    logits = model(x)
    for i in range(K):
        for j in range(i):
            assert not torch.allclose(logits[i], logits[j])
    torch.manual_seed(1)
    again = model(x)
    torch.manual_seed(1)
    torch.testing.assert_close(again, model(x))


def test_mc_dropout_at_rate_zero_is_the_plain_network():
    model = build("mlp", "mc-dropout", dropout=0.0).eval()
    x = torch.randn(3, *SHAPES["mlp"])
    torch.testing.assert_close(model(x)[1], plain_member(model, 0).eval()(x)[0])


def count(module):
    return sum(p.numel() for p in module.parameters())


def batch_ensemble_extra(single, k, variant):
    """Parameters BatchEnsemble adds to the single model: fast weights r, s and per-member biases."""
    extra = 0
    for module in single.modules():
        if isinstance(module, nn.Conv2d):
            per_member = (module.in_channels + module.out_channels if variant == "channel"
                          else 2 * module.out_channels * module.in_channels * module.kernel_size[0])
            extra += k * per_member
        elif isinstance(module, nn.Linear):
            extra += k * (module.in_features + module.out_features) + (k - 1) * module.out_features
    return extra


@pytest.mark.parametrize("arch,shape,single_count", [("resnet18", (3, 32, 32), 11_173_962),
                                                     ("mlp", (1, 28, 28), 784 * 64 + 64 + 64 * 32 + 32
                                                      + 32 * 16 + 16 + 16 * 10 + 10)])
def test_parameter_counts(arch, shape, single_count):
    def make(method, **options):
        return ensdiag.build_model(arch, method, num_classes=10, input_shape=shape, **options)
    single = make("single")
    counts = {"single": count(single), "mc-dropout": count(make("mc-dropout")),
              "deep-ensemble": count(make("deep-ensemble")),
              "batch-ensemble (channel)": count(make("batch-ensemble"))}
    assert counts["single"] == counts["mc-dropout"] == single_count
    assert counts["deep-ensemble"] == 4 * single_count
    assert counts["batch-ensemble (channel)"] == single_count + batch_ensemble_extra(single, 4, "channel")
    if arch == "resnet18":
        assert count(make("batch-ensemble", variant="kernel")) == single_count + batch_ensemble_extra(single, 4, "kernel")
    else:
        with pytest.raises(EnsdiagError, match="kernel-wise BatchEnsemble perturbs convolution kernels and mlp has none"):
            make("batch-ensemble", variant="kernel")


def test_paper_batch_ensemble_layout_has_the_papers_parameter_count():
    """Random per-member biases, per-member biases on the blocks' convolutions, unperturbed shortcuts."""
    paper = ensdiag.build_model("resnet18", "batch-ensemble", 4, 10, (3, 32, 32), layout="paper")
    original = ensdiag.build_model("resnet18", "batch-ensemble", 4, 10, (3, 32, 32))
    assert count(original) == 11_210_652 and count(paper) == 11_220_636  # paper Table 4: 11.22 M
    assert round(count(paper) / 1e6, 2) == 11.22
    body = paper.body
    assert isinstance(body.layer2[0].shortcut[0], nn.Conv2d) and not hasattr(body.layer2[0].shortcut[0], "r")
    assert body.layer1[0].conv1.bias.shape == (4, 64) and body.conv1.bias is None
    bound = 1 / math.sqrt(64 * 9)  # nn.Conv2d's bias init: uniform ±1/√fan_in, independently per member
    assert body.layer1[0].conv1.bias.abs().max() <= bound and body.layer1[0].conv1.bias.std() > bound / 4
    assert not torch.equal(body.fc.bias[0], body.fc.bias[1])
    assert torch.count_nonzero(original.body.fc.bias) == 0


def test_member_weights_cover_every_conv_and_linear_layer():
    model = build("resnet18", "batch-ensemble")
    weights = model.member_weights()
    assert len(weights) == K
    single = plain_member(model, 0)
    layers = [f"{name}.weight"[len("body."):] for name, m in single.named_modules()
              if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert sorted(key for key in weights[0] if key.endswith("weight")) == sorted(layers)
    assert len(build("mlp", "mc-dropout").member_weights()) == 1


def test_forward_members_checks_member_count():
    with pytest.raises(ValueError, match="members"):
        build("mlp", "deep-ensemble").forward_members(torch.randn(K + 1, 2, *SHAPES["mlp"]))


@pytest.mark.parametrize("call,message", [
    (lambda: ensdiag.build_model("vgg", "single"), "unknown architecture"),
    (lambda: ensdiag.build_model("mlp", "bagging"), "unknown method"),
    (lambda: ensdiag.build_model("mlp", "single", num_members=4), "exactly 1 member, not 4"),
    (lambda: ensdiag.build_model("mlp", "deep-ensemble", variant="kernel"), "takes no option"),
    (lambda: ensdiag.build_model("mlp", "batch-ensemble", variant="row"), "variant"),
    (lambda: ensdiag.build_model("mlp", "batch-ensemble", layout="mine"), "layout"),
    (lambda: ensdiag.build_model("mlp", "mc-dropout", dropout=1.5), "dropout"),
])
def test_bad_build_arguments_are_clear_errors(call, message):
    with pytest.raises(EnsdiagError, match=message):
        call()


def test_every_method_is_registered():
    assert set(METHODS) == {"single", "mc-dropout", "deep-ensemble", "batch-ensemble", "packed-ensemble", "mimo",
                            "snapshot-ensemble", "checkpoint-ensemble"}


def test_the_conv_bias_layout_gives_every_count_of_the_papers_table_4():
    """torch-uncertainty's ResNet-18 with a bias on every convolution: 4,800 conv biases on top of the
    default layout; the paper's 11.17 M / 44.71 M / 11.22 M are these counts cut to 0.01 M, which the
    default Deep Ensemble (44,695,848: 44.69 M) cannot give. Built on the meta device: no memory."""
    import math

    from ensdiag.cli.catalog import PAPER_TABLE_4, paper_layout_counts
    counts = paper_layout_counts()
    assert counts == {"single": 11_178_762, "mc-dropout": 11_178_762, "deep-ensemble": 44_715_048,
                      "batch-ensemble": 11_221_532}
    conv_outputs = 64 + 4 * 64 + (4 * 128 + 128) + (4 * 256 + 256) + (4 * 512 + 512)  # stem, blocks, shortcuts
    assert counts["single"] == 11_173_962 + conv_outputs and counts["deep-ensemble"] == 4 * counts["single"]
    for method, count in counts.items():
        assert math.floor(count / 1e4) / 100 == PAPER_TABLE_4[method], method
    assert math.floor(44_695_848 / 1e4) / 100 != PAPER_TABLE_4["deep-ensemble"]
    with torch.device("meta"):
        with pytest.raises(EnsdiagError, match="conv_bias: packed-ensemble builds its convolutions' biases"):
            ensdiag.build_model("resnet18", "packed-ensemble", 4, 10, (3, 32, 32), arch_options={"conv_bias": True})


def test_a_deep_ensemble_member_with_conv_biases_is_its_own_plain_network():
    model = ensdiag.build_model("resnet18", "deep-ensemble", 2, 10, (3, 32, 32), arch_options={"conv_bias": True,
                                                                                                "width": 4}).eval()
    x = torch.randn(2, 3, 32, 32)
    assert model.body.conv1.bias is not None
    torch.testing.assert_close(model.forward_members(torch.stack([x, x]))[1], model.member_network(1).eval()(x)[0])
