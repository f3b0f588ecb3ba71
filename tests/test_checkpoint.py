"""Save -> load gives identical logits; bad files give one clear error."""

import json

import pytest
import torch
from safetensors.torch import save_file

import ensdiag
from ensdiag.errors import EnsdiagError
from ensdiag.nn import ARCHITECTURES, METHODS, ModelSpec

# architectures written against the kits (not torchvision's whole networks, which are imported)
KIT_ARCHITECTURES = [name for name, builder in ARCHITECTURES.items() if not builder.whole_networks]

SHAPES = {"mlp": (1, 8, 8), "resnet18": (3, 16, 16)}


@pytest.mark.parametrize("arch", KIT_ARCHITECTURES)
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
    assert json.loads(spec.to_json())["options"] == {"variant": "kernel", "init": "random-sign:0.7", "layout": "original",
                                                    "loss": "mean", "shortcut_bias": False}
    narrow = ensdiag.build_model("resnet18", "single", 1, 10, (3, 16, 16), arch_options={"width": 8}).spec
    assert ModelSpec.from_json(narrow.to_json()) == narrow and json.loads(narrow.to_json())["arch_options"] == {"width": 8}
    assert "arch_options" not in json.loads(spec.to_json())  # unset: specs read as before


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
    with pytest.raises(EnsdiagError, match="is a folder, not a file"):
        ensdiag.load_model(tmp_path)


WRITE_BOTH = """
import sys, torch, ensdiag
from ensdiag.predictions import save_predictions
torch.manual_seed(0)
model = ensdiag.build_model("mlp", "batch-ensemble", num_classes=3, input_shape=(1, 4, 4))
extra = {"run": "r1", "seed": "7", "dataset": "digits", "note": "caf\\u00e9", "epochs": "2"}
ensdiag.save_model(model, sys.argv[1] + "/model.safetensors", extra_metadata=extra)
predictions = {"id": {"logits": torch.arange(24.0).reshape(2, 4, 3), "labels": torch.tensor([0, 1, 2, 0])},
               "ood": {"logits": torch.ones(2, 2, 3), "labels": None}}
save_predictions(predictions, sys.argv[1] + "/predictions.safetensors",
                 {"model": "m", "seed": 7, "splits": ["id", "ood"], "dataset": "digits", "ood": "svhn"})
"""


def test_identical_tensors_give_identical_bytes_in_separate_processes(tmp_path):
    """safetensors writes its metadata map in a per-process random order; ensdiag's files do not."""
    import hashlib
    import subprocess
    import sys
    digests = []
    for run in ("a", "b", "c"):
        (tmp_path / run).mkdir()
        subprocess.run([sys.executable, "-c", WRITE_BOTH, str(tmp_path / run)], check=True)
        digests.append({name: hashlib.sha256((tmp_path / run / name).read_bytes()).hexdigest()
                        for name in ("model.safetensors", "predictions.safetensors")})
    assert digests[0] == digests[1] == digests[2]


def test_deterministic_header_reads_back_with_the_same_tensors_and_metadata(tmp_path):
    import struct
    from safetensors import safe_open
    from safetensors.torch import save as safetensors_save
    from ensdiag.io import safetensors_bytes_deterministic
    tensors = {"b": torch.arange(5, dtype=torch.int64), "a": torch.randn(3, 2), "c/half": torch.ones(3, dtype=torch.float16)}
    metadata = {"zeta": "1", "alpha": "two", "mid": "caf\u00e9 \u2713", "ensdiag.format": "x"}
    data = safetensors_bytes_deterministic(tensors, metadata)
    original = safetensors_save(tensors, metadata=metadata)
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length]
    assert length % 8 == 0 and header == header.rstrip() + b" " * (len(header) - len(header.rstrip()))
    assert json.loads(header) == json.loads(original[8:8 + struct.unpack("<Q", original[:8])[0]])
    assert list(json.loads(header)["__metadata__"]) == sorted(metadata)
    assert data[8 + length:] == original[8 + struct.unpack("<Q", original[:8])[0]:]  # tensor bytes untouched
    path = tmp_path / "t.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == metadata
        assert sorted(handle.keys()) == sorted(tensors)
        for name, tensor in tensors.items():
            assert torch.equal(handle.get_tensor(name), tensor) and handle.get_tensor(name).dtype == tensor.dtype


def test_saved_model_loads_and_its_file_is_deterministic(tmp_path):
    model = ensdiag.build_model("mlp", "deep-ensemble", num_classes=4, input_shape=SHAPES["mlp"]).eval()
    extra = {"b": "2", "a": "1", "c": "3"}
    first = ensdiag.save_model(model, tmp_path / "one.safetensors", extra_metadata=extra)
    second = ensdiag.save_model(model, tmp_path / "two.safetensors", extra_metadata=dict(reversed(extra.items())))
    assert first.read_bytes() == second.read_bytes()
    loaded = ensdiag.load_model(first)
    x = torch.randn(2, *SHAPES["mlp"])
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    from ensdiag.io import read_safetensors
    _, metadata = read_safetensors(first)
    assert {k: metadata[k] for k in extra} == extra and metadata["ensdiag.format"] == "ensdiag.model/1"
