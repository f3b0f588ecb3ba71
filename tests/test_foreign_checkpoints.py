"""Ensembles trained elsewhere: real torch-uncertainty 0.13 files (tests/fixtures/torch_uncertainty,
written by make_fixtures.py there) give torch-uncertainty's own logits member by member, member
weights are W ∘ (s_group r_groupᵀ), plain state_dicts form Deep Ensembles, and nothing pickled runs."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ensdiag
from ensdiag.foreign.checkpoints import RawEnsemble, import_ensemble

from .cli import assert_one_line_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "torch_uncertainty"
REFERENCE = load_file(FIXTURES / "logits.safetensors")
CASES = {  # reference logits -> (files, inputs, method, members, --num-classes where the shapes cannot tell)
    "be_mlp": (["be_mlp.pt"], "mlp_inputs", "batch-ensemble", 3, None),
    "be_mlp_ckpt": (["be_mlp.ckpt"], "mlp_inputs", "batch-ensemble", 3, None),
    "de_mlp": ([f"de_mlp_member{i}.pt" for i in range(3)], "mlp_inputs", "deep-ensemble", 3, None),
    "de_mlp_wrapped": (["de_mlp_wrapped.pt"], "mlp_inputs", "deep-ensemble", 3, None),
    "be_resnet18_w8": (["be_resnet18_w8.pt"], "resnet_inputs", "batch-ensemble", 2, None),
    "de_resnet18_w8": ([f"de_resnet18_w8_member{i}.pt" for i in range(2)], "resnet_inputs", "deep-ensemble", 2, None),
    "packed_mlp": (["packed_mlp.pt"], "mlp_inputs", "packed-ensemble", 2, 10),
    "packed_resnet18_w8": (["packed_resnet18_w8.pt"], "resnet_inputs", "packed-ensemble", 2, None),
    "mimo_mlp": (["mimo_mlp.pt"], "mlp_inputs", "mimo", 3, 10),
    "mimo_resnet18_w8": (["mimo_resnet18_w8.pt"], "resnet_inputs", "mimo", 2, 10),
}


def inputs_for(name):
    x = REFERENCE[CASES[name][1]]
    return x.view(-1, 1, 8, 8) if CASES[name][1] == "mlp_inputs" else x


@pytest.mark.parametrize("name", CASES)
def test_imported_model_gives_torch_uncertaintys_logits_member_by_member(name):
    files, _, method, k, num_classes = CASES[name]
    model = import_ensemble([FIXTURES / f for f in files], num_classes=num_classes)
    assert model.method == method and model.num_members == k
    with torch.no_grad():
        logits = model(inputs_for(name))
    torch.testing.assert_close(logits, REFERENCE[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("file", ["be_mlp.pt", "be_resnet18_w8.pt"])
def test_member_weights_are_the_shared_weight_times_the_fast_weights_outer_product(file):
    raw = torch.load(FIXTURES / file, weights_only=True)
    weights = import_ensemble([FIXTURES / file]).member_weights()
    layers = [key[: -len(".r_group")] for key in raw if key.endswith(".r_group")]
    renames = {"final_layer": "head", "linear": "fc"}
    checked = 0
    for layer in layers:
        shared = raw.get(f"{layer}.linear.weight", raw.get(f"{layer}.conv.weight"))
        ours = renames.get(layer, layer).replace("layers.", "hidden.")
        for i, member in enumerate(weights):
            # torch-uncertainty: y = (x ∘ r_group) Wᵀ ∘ s_group, so member i's W is W ∘ s_group[i] r_group[i]ᵀ
            outer = torch.outer(raw[f"{layer}.s_group"][i], raw[f"{layer}.r_group"][i])
            expected = shared * outer.reshape(*outer.shape, *[1] * (shared.dim() - 2))
            torch.testing.assert_close(member[f"{ours}.weight"], expected)
            checked += 1
    assert checked == len(layers) * len(weights) > 0


def test_import_writes_an_ensdiag_model_that_remembers_its_source(tmp_path, capsys):
    code, out, err = run_cli(capsys, "import", FIXTURES / "be_mlp.ckpt", "--out", tmp_path / "model.safetensors")
    assert code == 0, err
    model = ensdiag.load_model(out.strip())
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_for("be_mlp_ckpt")), REFERENCE["be_mlp_ckpt"], rtol=1e-5, atol=1e-5)
    from ensdiag.io import read_safetensors
    _, metadata = read_safetensors(tmp_path / "model.safetensors")
    assert json.loads(metadata["ensdiag.source"]) == {"files": ["be_mlp.ckpt"], "from": "auto", "arch": "auto"}


def test_diversity_and_evaluate_take_foreign_files_directly(capsys):
    members = [FIXTURES / f"de_mlp_member{i}.pt" for i in range(3)]
    code, out, err = run_cli(capsys, "diversity", *members, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ensemble"]["method"] == "deep-ensemble" and report["ensemble"]["num_members"] == 3
    assert report["analyzers"]["disagreement"]["status"] == "ok" and report["analyzers"]["weight-similarity"]["status"] == "ok"
    code, out, err = run_cli(capsys, "evaluate", FIXTURES / "be_mlp.pt", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["num_members"] == 3


def test_members_of_ensdiags_own_architecture_form_a_deep_ensemble(tmp_path):
    singles = [ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)).eval() for _ in range(3)]
    (tmp_path / "members").mkdir()
    for i, single in enumerate(singles):
        torch.save(single.body.state_dict(), tmp_path / "members" / f"m{i}.pt")
    model = ensdiag.import_ensemble([tmp_path / "members"])  # a folder of member files, in name order
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        expected = torch.stack([single(x)[0] for single in singles])
        torch.testing.assert_close(model(x), expected)


def test_unknown_architectures_still_get_weight_similarity(tmp_path, capsys):
    for i in range(3):
        torch.manual_seed(i)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4, 2))
        torch.save(net.state_dict(), tmp_path / f"m{i}.pt")
    files = [tmp_path / f"m{i}.pt" for i in range(3)]
    assert isinstance(import_ensemble(files), RawEnsemble)
    code, out, err = run_cli(capsys, "diversity", *files, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    similarity = report["analyzers"]["weight-similarity"]
    assert similarity["status"] == "ok" and set(similarity["layers"]) == {"0", "2"}
    assert "no ensdiag architecture" in report["analyzers"]["disagreement"]["reason"]
    assert_one_line_error(capsys, "import", *files, "--out", tmp_path / "x.safetensors", match="no ensdiag architecture")
    assert not (tmp_path / "x.safetensors").exists()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_without_running_it(tmp_path, capsys):
    marker = tmp_path / "ran"
    torch.save({"layer.weight": torch.zeros(2), "x": _Payload(marker)}, tmp_path / "evil.pt")
    (tmp_path / "evil2.pt").write_bytes((tmp_path / "evil.pt").read_bytes())  # two members (one given twice is refused)
    assert_one_line_error(capsys, "diversity", tmp_path / "evil.pt", tmp_path / "evil2.pt",
                          match=r"needs more than tensors.*weights_only=True.*never runs pickled code")
    assert_one_line_error(capsys, "import", tmp_path / "evil.pt", "--out", tmp_path / "m.safetensors", match="pickled")
    assert not marker.exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)  # the payload is live: a full unpickle runs it
    assert marker.exists()


@pytest.mark.parametrize("make,message", [
    (lambda d: [(d / "a.pt").write_bytes(b"PK\x03\x04 not a zip")], "not a readable PyTorch checkpoint"),
    (lambda d: [torch.save({"a": 1}, d / "a.pt")], "'a' is not a named tensor"),
    (lambda d: [torch.save(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)).body.state_dict(), d / "a.pt")],
     "holds one network, not an ensemble"),
])
def test_bad_checkpoints_are_one_line_errors(make, message, tmp_path, capsys):
    make(tmp_path)
    assert_one_line_error(capsys, "import", tmp_path / "a.pt", "--out", tmp_path / "m.safetensors", match=message)


def test_a_member_that_does_not_fit_names_the_key_and_the_shape(tmp_path, capsys):
    good = torch.load(FIXTURES / "de_mlp_member0.pt", weights_only=True)
    bad = {**good, "layers.1.weight": torch.zeros(32, 60)}
    torch.save(good, tmp_path / "m0.pt")
    torch.save(bad, tmp_path / "m1.pt")
    assert_one_line_error(capsys, "import", tmp_path / "m0.pt", tmp_path / "m1.pt", "--out", tmp_path / "m.safetensors",
                          match=r"member 1 'hidden\.1\.weight' has shape \[32, 60\], mlp expects \[32, 64\]")


def test_a_deep_ensemble_of_torchvision_resnet18s_runs_like_torchvision(tmp_path, capsys):
    import torchvision

    from .formats import write_cifar10_layout
    networks = []
    for i in range(2):
        torch.manual_seed(i)
        network = torchvision.models.resnet18(num_classes=10)
        for module in network.modules():  # non-trivial BatchNorm statistics, so eval mode uses them
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
        torch.save(network.state_dict(), tmp_path / f"tv{i}.pt")
        networks.append(network.eval())
    files = [tmp_path / "tv0.pt", tmp_path / "tv1.pt"]
    model = import_ensemble(files, arch="torchvision:resnet18")
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), torch.stack([network(x) for network in networks]))
    torch.testing.assert_close(model.member_network(1).eval()(x)[0], networks[1](x).detach())
    write_cifar10_layout(tmp_path / "data")
    code, out, err = run_cli(capsys, "diversity", *files, "--arch", "torchvision:resnet18", "--preset", "cifar10",
                             "--data-dir", tmp_path / "data", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["analyzers"]["disagreement"]["status"] == "ok" and report["ensemble"]["num_members"] == 2
    torch.save(torchvision.models.resnet34(num_classes=10).state_dict(), tmp_path / "tv34.pt")
    assert_one_line_error(capsys, "import", tmp_path / "tv0.pt", tmp_path / "tv34.pt", "--arch", "torchvision:resnet18",
                          "--out", tmp_path / "m.safetensors", match="member 1 has 'layer1.2.conv1.weight'")
    assert_one_line_error(capsys, "import", *files, "--arch", "torchvision:resnet999", "--out", tmp_path / "m.safetensors",
                          match="torchvision has no classification model 'resnet999'")


def test_packed_mlp_without_num_classes_asks_for_it(capsys, tmp_path):
    assert_one_line_error(capsys, "import", FIXTURES / "packed_mlp.pt", "--out", tmp_path / "m.safetensors",
                          match="members and subgroups cannot be told apart.*pass --num-classes")
    assert_one_line_error(capsys, "import", FIXTURES / "mimo_mlp.pt", "--out", tmp_path / "m.safetensors",
                          match="k input and output heads, --num-classes C")
    code, _, err = run_cli(capsys, "import", FIXTURES / "mimo_mlp.pt", "--num-classes", "10",
                           "--out", tmp_path / "m.safetensors")
    assert code == 0, err


def test_a_plain_safetensors_state_dict_imports_like_the_pt_file(tmp_path):
    from safetensors.torch import save_file
    save_file(torch.load(FIXTURES / "be_mlp.pt", weights_only=True), tmp_path / "be_mlp.safetensors")
    model = import_ensemble([tmp_path / "be_mlp.safetensors"])
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_for("be_mlp")), REFERENCE["be_mlp"], rtol=1e-5, atol=1e-5)


def test_a_lightning_checkpoint_with_other_modules_keeps_only_the_network(tmp_path):
    checkpoint = torch.load(FIXTURES / "be_mlp.ckpt", weights_only=True)
    checkpoint["state_dict"]["loss.weight"] = torch.ones(10)  # CrossEntropyLoss(weight=...) saved beside the model
    torch.save(checkpoint, tmp_path / "weighted.ckpt")
    model = import_ensemble([tmp_path / "weighted.ckpt"])
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_for("be_mlp_ckpt")), REFERENCE["be_mlp_ckpt"], rtol=1e-5, atol=1e-5)


def test_recognised_but_unfitting_members_fall_back_to_weight_similarity(tmp_path, capsys):
    """A Deep Ensemble of ResNet-18s with convolution biases (ensdiag's have none): diversity still
    compares the weights and says why it cannot run them; import refuses with the first misfit."""
    for i in range(2):
        state = torch.load(FIXTURES / f"de_resnet18_w8_member{i}.pt", weights_only=True)
        state["conv1.bias"] = torch.zeros(8)
        torch.save(state, tmp_path / f"m{i}.pt")
    files = [tmp_path / "m0.pt", tmp_path / "m1.pt"]
    code, out, err = run_cli(capsys, "diversity", *files, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["analyzers"]["weight-similarity"]["status"] == "ok"
    assert "conv1.bias" in report["analyzers"]["disagreement"]["reason"]
    assert_one_line_error(capsys, "import", *files, "--out", tmp_path / "x.safetensors", match="conv1.bias")


def test_non_finite_weights_are_refused_at_import(tmp_path, capsys):
    state = torch.load(FIXTURES / "de_mlp_member1.pt", weights_only=True)
    state["layers.0.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pt")
    assert_one_line_error(capsys, "import", FIXTURES / "de_mlp_member0.pt", tmp_path / "nan.pt",
                          "--out", tmp_path / "x.safetensors", match="NaN or infinite")


@pytest.mark.parametrize("args,message", [
    (("--num-classes", "0"), r"--num-classes must lie in 2\.\.1000000"),
    (("--num-classes", "7"), "has 10 classes per member, not --num-classes 7"),
])
def test_num_classes_is_checked(args, message, tmp_path, capsys):
    assert_one_line_error(capsys, "import", FIXTURES / "packed_resnet18_w8.pt", *args, "--out", tmp_path / "x.safetensors",
                          match=message)


def test_deep_ensembles_files_need_numbered_members(tmp_path, capsys):
    state = {f"core_models.{index}.layers.0.weight": torch.zeros(2, 2) for index in ("0", "1", "01")}
    torch.save(state, tmp_path / "de.pt")
    assert_one_line_error(capsys, "import", tmp_path / "de.pt", "--out", tmp_path / "x.safetensors", match="0..k-1")
    torch.save({"core_models.².w": torch.zeros(1)}, tmp_path / "odd.pt")
    assert_one_line_error(capsys, "import", tmp_path / "odd.pt", "--out", tmp_path / "x.safetensors",
                          match="not a core_models")


def test_torchvision_class_count_comes_from_the_models_own_classifier(tmp_path):
    import torchvision
    from safetensors.torch import save_file
    for i in range(2):  # safetensors sorts its keys: "the last 2-D weight" would not be the classifier
        save_file(torchvision.models.squeezenet1_0(num_classes=7).state_dict(), tmp_path / f"sq{i}.safetensors")
    model = import_ensemble([tmp_path / "sq0.safetensors", tmp_path / "sq1.safetensors"],
                            arch="torchvision:squeezenet1_0")
    assert model.num_classes == 7 and model(torch.randn(1, 3, 64, 64)).shape == (2, 1, 7)
