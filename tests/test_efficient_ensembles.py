"""Packed-Ensembles and MIMO (nn/kits/): parameter counts re-derived from the papers' layer
formulas, independent members (Packed) and a shared body (MIMO), MIMO's training batches,
`--option`, and the whole train -> diversity -> report path on the embedded default and the
paper presets. (Exact member rebuilds are in test_models.py, parametrised with the others.)"""

import json
from pathlib import Path

import pytest
import torch

import ensdiag
from ensdiag.nn.kits.mimo import mimo_rows

from .cli import assert_one_line_error, run_cli
from .formats import write_cifar10_layout, write_mnist_layout

RESNET18_STAGES = [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]


def count(model):
    return sum(p.numel() for p in model.parameters())


def conv_weights(c_in, c_out, kernel, groups=1):
    return c_out * (c_in // groups) * kernel * kernel


def packed_resnet18_parameters(alpha, gamma, m, classes, channels=3):
    """Laurent et al.: a layer of width c holds α·c channels in M·γ groups, (α·c_in)(α·c_out)k²/(M·γ)
    weights; the first layer reads the whole image, a block's first convolution and the head have no
    subgroups, and (torch-uncertainty) a convolution drops subgroups while a group reads < 64 channels."""
    def wide(c):
        return int(alpha * c)

    def subgroups(c_in):
        g = gamma
        while g > 1 and wide(c_in) // (g * m) < 64:
            g -= 1
        return g

    total = conv_weights(channels, wide(64), 3) + 2 * wide(64)  # stem (dense over the image) + BatchNorm
    c_in = 64
    for width, stride in RESNET18_STAGES:
        total += conv_weights(wide(c_in), wide(width), 3, m) + 2 * wide(width)
        total += conv_weights(wide(width), wide(width), 3, m * subgroups(width)) + 2 * wide(width)
        if stride != 1 or c_in != width:
            total += conv_weights(wide(c_in), wide(width), 1, m * subgroups(c_in)) + 2 * wide(width)
        c_in = width
    return total + wide(512) // m * classes * m + classes * m  # head: M groups, C outputs each


@pytest.mark.parametrize("alpha,gamma,m", [(2.0, 2, 4), (2.0, 1, 4), (4.0, 2, 2), (1.0, 1, 4)])
def test_packed_resnet18_parameter_count_follows_the_papers_formula(alpha, gamma, m):
    model = ensdiag.build_model("resnet18", "packed-ensemble", m, 10, (3, 32, 32), alpha=alpha, gamma=gamma)
    assert count(model) == packed_resnet18_parameters(alpha, gamma, m, 10)


def test_packed_mlp_parameter_count_follows_the_papers_formula():
    alpha, gamma, m, pixels, classes = 2.0, 2, 4, 28 * 28, 10
    widths = [int(alpha * w) for w in (64, 32, 16)]
    expected = pixels * widths[0] + widths[0]  # first layer: dense over the input
    expected += sum(a // (m * gamma) * b + b for a, b in zip(widths, widths[1:]))  # hidden: M·γ groups
    expected += widths[-1] // m * classes * m + classes * m
    assert count(ensdiag.build_model("mlp", "packed-ensemble", m, classes, (1, 28, 28), alpha=alpha, gamma=gamma)) == expected


@pytest.mark.parametrize("arch,shape", [("mlp", (1, 8, 8)), ("resnet18", (3, 16, 16))])
def test_packed_with_alpha_m_and_no_subgroups_is_a_deep_ensemble_in_size(arch, shape):
    """α = M, γ = 1: every member has the full architecture's width (the paper's remark)."""
    packed = ensdiag.build_model(arch, "packed-ensemble", 3, 5, shape, alpha=3.0, gamma=1)
    assert count(packed) == count(ensdiag.build_model(arch, "deep-ensemble", 3, 5, shape))
    assert count(packed.member_network(0)) == count(ensdiag.build_model(arch, "single", 1, 5, shape))


@pytest.mark.parametrize("arch,shape,first,head", [("mlp", (1, 28, 28), 28 * 28 * 64, 16 * 10 + 10),
                                                   ("resnet18", (3, 32, 32), 3 * 64 * 9, 512 * 10 + 10)])
def test_mimo_parameter_count_is_a_single_model_with_m_inputs_and_m_heads(arch, shape, first, head):
    m = 3
    single = count(ensdiag.build_model(arch, "single", 1, 10, shape))
    assert count(ensdiag.build_model(arch, "mimo", m, 10, shape)) == single + (m - 1) * (first + head)


@pytest.mark.parametrize("arch,shape", [("mlp", (1, 8, 8)), ("resnet18", (3, 16, 16))])
def test_packed_members_are_independent_networks(arch, shape):
    """Changing member 1's input changes member 1's logits only, in training mode too (BatchNorm
    statistics are per channel, hence per member)."""
    model = ensdiag.build_model(arch, "packed-ensemble", 3, 5, shape, gamma=2).train()
    xs = torch.randn(3, 6, *shape)
    changed = xs.clone()
    changed[1] = torch.randn(6, *shape)
    before, after = model.forward_members(xs), model.forward_members(changed)
    torch.testing.assert_close(before[[0, 2]], after[[0, 2]])
    assert not torch.allclose(before[1], after[1])


def test_packed_subgroups_split_each_member_into_independent_paths():
    """γ = 2: the grouped forward of a hidden layer lets a subgroup's outputs read only its own
    inputs, and equals the member's dense (block-diagonal) weight applied to the member's slice."""
    model = ensdiag.build_model("mlp", "packed-ensemble", 2, 5, (1, 8, 8), alpha=2.0, gamma=2)
    layer = model.body.hidden[1]  # 64 -> 32 at α = 2: 128 -> 64 channels, member 1 owns 64:128 -> 32:64
    x = torch.randn(3, 128)
    changed = x.clone()
    changed[:, 96:] = torch.randn(3, 32)  # member 1's second subgroup of inputs
    before, after = layer(x), layer(changed)
    torch.testing.assert_close(before[:, :48], after[:, :48])  # member 0, and member 1's first subgroup
    assert not torch.allclose(before[:, 48:], after[:, 48:])
    dense = model.member_state_dict(1)
    torch.testing.assert_close(before[:, 32:], x[:, 64:] @ dense["hidden.1.weight"].T + dense["hidden.1.bias"])


def test_packed_widths_round_up_to_whole_groups():
    """int(α·c) channels, rounded up to a multiple of M·γ where it is not one."""
    model = ensdiag.build_model("mlp", "packed-ensemble", 3, 5, (1, 8, 8), alpha=1.3, gamma=2)
    assert [layer.weight.shape[0] for layer in model.body.hidden] == [84, 42, 24]  # 83 -> 84, 41 -> 42, 20 -> 24
    assert model.kit.member_width(64) == 28


@pytest.mark.parametrize("arch,shape", [("mlp", (1, 8, 8)), ("resnet18", (3, 16, 16))])
def test_packed_member_networks_match_with_own_inputs_in_training_mode(arch, shape):
    model = ensdiag.build_model(arch, "packed-ensemble", 3, 5, shape, gamma=2).train()
    xs = torch.randn(3, 6, *shape)
    logits = model.forward_members(xs)
    for i in range(3):
        plain = model.member_network(i).train()
        torch.testing.assert_close(plain.forward_members(xs[i:i + 1])[0], logits[i], rtol=1e-4, atol=1e-4)


def test_packed_weight_cosine_equals_the_dense_members_cosine():
    from ensdiag.stats.metrics import weight_cosine
    model = ensdiag.build_model("resnet18", "packed-ensemble", 3, 5, (3, 16, 16), alpha=3.0, gamma=2)
    compact, _ = weight_cosine(model.member_weights())
    dense = [{k: v for k, v in model.member_state_dict(i).items() if "bn" not in k and "shortcut.1" not in k}
             for i in range(3)]
    expected, _ = weight_cosine(dense)
    torch.testing.assert_close(compact, expected, rtol=1e-5, atol=1e-6)


def test_mimo_rows_follow_the_input_and_batch_repetition_rule():
    generator = torch.Generator().manual_seed(0)
    batch, r = 8, 3
    rows = mimo_rows(batch, 4, 0.0, r, generator, "cpu")
    assert rows.shape == (4, batch * r)
    for member in rows:  # every example r times per member, in the member's own order
        assert sorted(member.tolist()) == sorted(list(range(batch)) * r)
    assert len({tuple(member.tolist()) for member in rows}) == 4
    same = mimo_rows(batch, 4, 1.0, r, generator, "cpu")
    assert (same == same[0]).all()
    half = mimo_rows(batch, 4, 0.5, 1, generator, "cpu")
    assert (half[:, 4:] == half[0, 4:]).all()  # the last ρ·r·B rows: one order for every member
    for member in half:  # before them, each member's own order of the same rows
        assert sorted(member[:4].tolist()) == sorted(half[0, :4].tolist())


def test_mimo_step_draws_batch_over_r_examples_so_an_epoch_has_r_times_the_steps():
    from unittest import mock

    from ensdiag.config import preset_config
    from ensdiag.data.batching import Normalize
    from ensdiag.train import FitData, make_optimizer, train_epoch
    config = preset_config("digits", batch_size=8)
    model = ensdiag.build_model("mlp", "mimo", 3, 10, (1, 8, 8), batch_repetition=4)
    images, labels = torch.rand(40, 1, 8, 8), torch.randint(0, 10, (40,))
    data = FitData(images, labels, images[:0], labels[:0], Normalize((0.5,), (0.25,), "cpu"))
    generator = torch.Generator().manual_seed(0)
    with mock.patch.object(model.kit, "member_batch", wraps=model.kit.member_batch) as batches:
        train_epoch(model, make_optimizer(model, config)[0], data, torch.randperm(40)[None], config, generator)
    assert batches.call_count == 20  # 40 examples, 8 // 4 = 2 per step
    x, y = model.kit.member_batch(images[None, :2], labels[None, :2], generator=generator)
    assert x.shape[:2] == y.shape == (3, 8)  # each step still has --batch-size rows per member


def test_mimo_batch_keeps_images_and_labels_together():
    model = ensdiag.build_model("mlp", "mimo", 3, 10, (1, 2, 2), batch_repetition=2)
    labels = torch.arange(5)
    images = labels.float()[:, None, None, None].expand(5, 1, 2, 2)
    x, y = model.kit.member_batch(images[None], labels[None], generator=torch.Generator().manual_seed(1))
    assert x.shape == (3, 10, 1, 2, 2) and y.shape == (3, 10)
    assert (x[..., 0, 0, 0] == y.float()).all()


def test_mimo_weight_similarity_compares_only_what_members_own():
    from ensdiag.analysis.diversity import weight_similarity
    model = ensdiag.build_model("resnet18", "mimo", 3, 10, (3, 16, 16))
    weights = model.member_weights()
    assert set(weights[0]) == {"conv1.weight", "fc.weight", "fc.bias"}
    torch.testing.assert_close(weights[2]["conv1.weight"], model.body.conv1.weight[:, 6:9])
    torch.testing.assert_close(weights[1]["fc.weight"], model.body.fc.weight[10:20])
    result = weight_similarity(None, weights)
    assert "input and output layers only" in result["scope"] and result["scope"] in result["matrix"]["definition"]


def test_option_flag_sets_method_options_and_refuses_bad_ones(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--method", "packed-ensemble,mimo", "--seeds", "1", "--epochs", "1",
                           "--members", "2", "-O", "packed-ensemble.gamma=2", "--option", "mimo.input_repetition=0.5",
                           "-O", "mimo.batch_repetition=2", "--out", out, "--quiet")
    assert code == 0, err
    config = json.loads((out / "experiment.json").read_text())["config"]
    assert config["method_options"] == {"packed-ensemble": {"gamma": 2}, "mimo": {"input_repetition": 0.5,
                                                                                 "batch_repetition": 2}}
    spec = json.loads((out / "mimo" / "seed-1" / "meta.json").read_text())["spec"]
    assert spec["options"] == {"input_repetition": 0.5, "batch_repetition": 2}
    for option, message in [("gamma=2", "METHOD.NAME=VALUE"), ("bagging.size=2", "unknown method 'bagging'"),
                            ("mimo.rho=0.5", "has no option 'rho'"), ("mimo.batch_repetition=two", "whole number"),
                            ("mimo.input_repetition=1.5", r"\[0, 1\]"), ("packed-ensemble.alpha=nan", "finite")]:
        assert_one_line_error(capsys, "train", "-O", option, "--out", tmp_path / "refused", match=message)
    assert not (tmp_path / "refused").exists()


def test_cifar10_preset_builds_the_papers_packed_resnet18():
    from ensdiag.config import preset_config
    config = preset_config("cifar10", methods=["packed-ensemble"])
    method, options = config.model_options("packed-ensemble")
    assert options == {"alpha": 2.0, "gamma": 2}
    merged = preset_config("cifar10", method_options={"packed-ensemble": {"alpha": 4.0}})
    assert merged.method_options == {"packed-ensemble": {"alpha": 4.0, "gamma": 2}}


def test_train_diagnose_and_report_both_methods_on_the_embedded_default(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--method", "single,packed-ensemble,mimo", "--seeds", "1,2",
                           "--epochs", "2", "--members", "3", "--out", out, "--quiet")
    assert code == 0, err
    for method in ("packed-ensemble", "mimo"):
        model_path = out / method / "seed-1" / "model.safetensors"
        code, text, _ = run_cli(capsys, "diversity", model_path, "--format", "json")
        diversity = json.loads(text)
        assert code == 0 and diversity["ensemble"]["method"] == method and diversity["ensemble"]["num_members"] == 3
        assert 0 <= diversity["analyzers"]["disagreement"]["splits"]["id"]["mean"]["value"] <= 1
        assert -1 <= diversity["analyzers"]["weight-similarity"]["mean"]["value"] <= 1
        model = ensdiag.load_model(model_path)  # the saved model rebuilds to the trained one
        assert model.method == method and model.num_members == 3
    labels = ("Packed-Ensembles", "MIMO")
    for fmt in ("table", "markdown", "html", "latex", "json"):
        code, text, err = run_cli(capsys, "report", out, "--format", fmt, "--no-figures")
        assert code == 0, err
        assert all(label in text for label in labels), fmt
    code, text, _ = run_cli(capsys, "report", out, "--format", "markdown", "--no-figures")
    assert "MIMO: weight cosine on the input and output layers only; the members share the body." in text


@pytest.mark.parametrize("preset,writer", [("mnist", write_mnist_layout), ("cifar10", write_cifar10_layout)])
def test_both_methods_train_on_the_paper_presets(preset, writer, tmp_path, capsys):
    """The presets' architectures (mlp on MNIST, ResNet-18 on CIFAR-10) on tiny files in the
    distributed formats; shift and OOD data are missing and skipped."""
    writer(tmp_path / "data")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--preset", preset, "--method", "packed-ensemble,mimo", "--seeds", "1",
                           "--epochs", "1", "--members", "2", "--batch-size", "4", "--data-dir", tmp_path / "data",
                           "--out", out, "--quiet", *(["--no-early-stopping"] if preset == "mnist" else ["--no-geometry"]))
    assert code == 0, err
    for method in ("packed-ensemble", "mimo"):
        meta = json.loads((out / method / "seed-1" / "meta.json").read_text())
        assert meta["spec"]["arch"] == ("mlp" if preset == "mnist" else "resnet18") and meta["epochs_run"] == 1


def test_no_file_outside_the_methods_own_modules_names_them():
    """Adding a method is one module: only it, its tests and the presets that list it name it."""
    root = Path(ensdiag.__file__).parent
    # (and the importer that maps torch-uncertainty's checkpoints of these methods onto them, and names.py,
    # generated from the registries)
    allowed = {"packed-ensemble": {"nn/kits/packed_ensemble.py", "config.py", "foreign/torch_uncertainty.py", "names.py"},
               "mimo": {"nn/kits/mimo.py", "foreign/torch_uncertainty.py", "names.py"}}
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".json", ".md", ".txt", ".html"):
            text, name = path.read_text().lower(), path.relative_to(root).as_posix()
            for method, modules in allowed.items():
                if name not in modules:
                    assert method not in text and method.replace("-", " ") not in text, f"{name} names {method}"


def test_models_lists_the_papers_packed_resnet18_and_the_docs_quote_that_count(capsys):
    code, out, _ = run_cli(capsys, "models", "--arch", "resnet18")
    expected = f"{packed_resnet18_parameters(2.0, 2, 4, 10):,}"
    assert code == 0 and expected in out and "mimo" in out
    conventions = Path(__file__).parents[1] / "docs" / "conventions.md"
    assert expected in conventions.read_text()  # the number in the docs is the code's


def test_run_folders_from_before_method_options_still_load_and_resume(tmp_path, capsys):
    """experiment.json written by ensdiag 0.2 has no method_options: it is the preset's."""
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out, "-q")
    assert code == 0, err
    experiment = json.loads((out / "experiment.json").read_text())
    del experiment["config"]["method_options"]
    (out / "experiment.json").write_text(json.dumps(experiment))
    code, _, err = run_cli(capsys, "report", out, "--format", "json", "--no-figures")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out, "-q")
    assert code == 0, err  # the same experiment: nothing to redo, no "different experiment" refusal


@pytest.mark.parametrize("options,message", [({"mimo": {"input_repetition": 10 ** 400}}, "finite number, got 1000"),
                                             ({"packed-ensemble": {"gamma": 10 ** 400}}, r"1\.\.64, got 1000"),
                                             ({"mimo": [1]}, "must map option names to values"),
                                             ({"bagging": {}}, "unknown method 'bagging'")])
def test_hostile_method_options_in_a_stored_config_are_one_short_line(tmp_path, capsys, options, message):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out, "-q")
    experiment = json.loads((out / "experiment.json").read_text())
    experiment["config"]["method_options"] = options
    (out / "experiment.json").write_text(json.dumps(experiment))
    err = assert_one_line_error(capsys, "report", out, "--no-figures", match=message)
    assert len(err) < 400
