"""Adding a method is one kit: a toy method registered from this file alone trains, is
diagnosed and is reported, with no other file naming it."""

import ast
import json

import pytest
import torch

from ensdiag.nn import METHODS, register_method

from .cli import run_cli


@pytest.fixture
def toy_method():
    """`toy-twins`: k plain networks whose weights start equal (a Deep Ensemble without independent
    initialisation), trained on one shared data order with the loss averaged over members."""
    from ensdiag.nn.kits.deep_ensemble import DeepEnsembleKit

    @register_method("toy-twins")
    class ToyTwinsKit(DeepEnsembleKit):
        label = "Toy twins"
        options = {"spread": 0.0}
        loss_over_members = "mean"
        strategies = ()

        @classmethod
        def options_from(cls, config):
            return {"spread": 0.0}

        def data_orders(self):
            return 1

        def member_batch(self, images, labels, split_batch=False, generator=None):
            return images.expand(self.num_members, *images.shape[1:]), labels.expand(self.num_members, -1)

        def linear(self, in_features, out_features, bias=True, role="hidden"):
            layer = super().linear(in_features, out_features, bias, role)
            with torch.no_grad():  # every member starts from member 0's weights
                layer.weight.copy_(layer.weight[:1].expand_as(layer.weight))
                if layer.bias is not None:
                    layer.bias.copy_(layer.bias[:1].expand_as(layer.bias))
            return layer

    yield ToyTwinsKit
    METHODS.pop("toy-twins")


def test_a_method_registered_from_a_test_file_trains_is_diagnosed_and_reported(toy_method, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--method", "toy-twins,deep-ensemble", "--seeds", "1", "--epochs", "2",
                           "--members", "3", "--out", out, "--quiet")
    assert code == 0, err
    model = out / "toy-twins" / "seed-1" / "model.safetensors"
    code, text, _ = run_cli(capsys, "diversity", model, "--format", "json")
    diversity = json.loads(text)
    assert code == 0 and diversity["ensemble"]["method"] == "toy-twins" and diversity["ensemble"]["num_members"] == 3
    # members that start equal and see the same batches stay equal: the diagnosis says so
    assert diversity["analyzers"]["weight-similarity"]["mean"]["value"] == pytest.approx(1.0)
    assert diversity["analyzers"]["disagreement"]["splits"]["id"]["mean"]["value"] == 0.0
    code, text, _ = run_cli(capsys, "report", out, "--format", "markdown", "--no-figures")
    assert code == 0 and "| Toy twins |" in text and "| Deep Ensemble |" in text
    code, text, _ = run_cli(capsys, "models", "--arch", "mlp")
    assert code == 0 and "toy-twins" in text


def test_training_and_reporting_code_name_no_method():
    """What differs between methods lives in their kits (nn/methods.py): these files name none."""
    from pathlib import Path

    import ensdiag
    root = Path(ensdiag.__file__).parent
    # (cli.py's help texts list the built-in methods for the reader; its code names none either)
    generic = ["train.py", "core/predict.py", "predictions.py", "core/inputs.py", "nn/model.py", "nn/kit.py",
               "nn/architectures.py", "report/__init__.py", "report/render.py", "report/terminal.py"]
    for name in generic:
        tree = ast.parse((root / name).read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                   and isinstance(node.value, str) and id(node) not in docstrings]
        for method in ("mc-dropout", "deep-ensemble", "batch-ensemble"):
            assert not [text for text in strings if method in text], f"{name} names {method} in code"


OPTIONS = [(method, option) for method, kit in METHODS.items() for option in kit.declared]


@pytest.mark.parametrize("method,option", OPTIONS, ids=[f"{m}.{o.name}" for m, o in OPTIONS])
def test_every_declared_option_checks_its_values(method, option):
    """One declaration per option: defaults pass, values outside it are one error naming the flag."""
    from ensdiag.errors import EnsdiagError
    from ensdiag.nn.methods import resolve_options
    defaults = {"dropout": 0.1}
    assert resolve_options(method, {}, defaults)[option.name] == defaults.get(option.name, option.default)
    assert option.help and METHODS[method].options[option.name] == option.default
    bad = {bool: "yes", float: 1.5 if option.high == 1.0 else float("nan"), str: 3,
           int: (option.low or 0) - 1}[option.kind]
    with pytest.raises(EnsdiagError, match=option.flag or option.name):
        resolve_options(method, {option.name: bad}, defaults)
    if option.choices:
        with pytest.raises(EnsdiagError, match=" or |one of"):
            resolve_options(method, {option.name: "none-of-these"}, defaults)


def test_every_method_lives_in_its_own_module():
    """One module per method in nn/kits/, its kit defined there (and its layers with it)."""
    from ensdiag.nn.kit import Kit
    for name, kit in METHODS.items():
        if name == "toy-twins":
            continue
        assert kit.__module__ == f"ensdiag.nn.kits.{name.replace('-', '_')}", name
        assert issubclass(kit, Kit)
