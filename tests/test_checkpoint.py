"""Save -> load gives identical logits; bad files give one clear error."""

import json

import pytest
import torch
from safetensors.torch import save_file

import ensdiag
from ensdiag.checkpoint import read_spec
from ensdiag.errors import EnsdiagError
from ensdiag.nn import ARCHITECTURES, METHODS, ModelSpec

SHAPES = {"mlp": (1, 8, 8), "resnet18": (3, 16, 16)}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("method", METHODS)
def test_save_load_gives_identical_logits(tmp_path, arch, method):
    model = ensdiag.build_model(arch, method, num_classes=7, input_shape=SHAPES[arch]).eval()
    path = ensdiag.save_model(model, tmp_path / "model.safetensors")
    loaded = ensdiag.load_model(path)
    assert loaded.spec == model.spec
    x = torch.randn(3, *SHAPES[arch])
    torch.manual_seed(5)  # MC Dropout: the same masks for both
    expected = model(x)
    torch.manual_seed(5)
    torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_spec_json_round_trips():
    spec = ensdiag.build_model("resnet18", "batch-ensemble", input_shape=(3, 32, 32),
                               variant="kernel", init="random-sign:0.7").spec
    assert ModelSpec.from_json(spec.to_json()) == spec
    assert json.loads(spec.to_json())["options"] == {"variant": "kernel", "init": "random-sign:0.7", "layout": "original"}


@pytest.fixture
def saved(tmp_path):
    model = ensdiag.build_model("mlp", "batch-ensemble", input_shape=SHAPES["mlp"])
    return ensdiag.save_model(model, tmp_path / "good.safetensors")


def test_truncated_file(saved, tmp_path):
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    with pytest.raises(EnsdiagError, match="not a readable safetensors file"):
        ensdiag.load_model(bad)


def test_not_safetensors(tmp_path):
    bad = tmp_path / "notes.safetensors"
    bad.write_text("just some text, not tensors\n")
    with pytest.raises(EnsdiagError, match="not a readable safetensors file"):
        ensdiag.load_model(bad)


def test_file_from_another_tool(tmp_path):
    other = tmp_path / "other.safetensors"
    save_file({"weight": torch.zeros(3, 3)}, str(other))
    with pytest.raises(EnsdiagError, match="no ensdiag metadata"):
        ensdiag.load_model(other)


def test_tensors_that_do_not_fit_the_spec(saved, tmp_path):
    tensors, metadata = ensdiag.checkpoint.read_safetensors(saved)
    spec = json.loads(metadata["ensdiag.spec"])
    spec["num_members"] = 2
    bad = tmp_path / "mismatch.safetensors"
    save_file(tensors, str(bad), metadata={**metadata, "ensdiag.spec": json.dumps(spec)})
    with pytest.raises(EnsdiagError, match="do not fit its spec.*wrong shape"):
        ensdiag.load_model(bad)
    del tensors["body.head.r"]
    save_file(tensors, str(bad), metadata=metadata)
    with pytest.raises(EnsdiagError, match="1 missing"):
        ensdiag.load_model(bad)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(EnsdiagError, match="does not exist"):
        ensdiag.load_model(tmp_path / "nope.safetensors")
    with pytest.raises(EnsdiagError, match="directory"):
        ensdiag.load_model(tmp_path)


def test_read_spec_without_loading_weights(saved):
    assert read_spec(saved).method == "batch-ensemble"
