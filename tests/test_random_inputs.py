"""Property-based hostile input: random bytes, truncations, mutated headers and specs of real
files, random option values. Every case exits 0 or 2 with one line naming the file or option,
and nothing appears outside the sandbox but what an option named."""

import contextlib
import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ensdiag
from ensdiag.cli import main

from .cli import assert_one_line_error

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def sandbox():
    """A fresh working directory; yields it, and the test checks nothing appears outside `allowed`."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(previous)


def invoke(*args):
    """(exit code, stderr) of the CLI run in-process, stdout discarded."""
    import io
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return code, err.getvalue()


def assert_clean(code, err, names):
    """Exit 0, or exit 2 with one `error:` line that names the file or option."""
    assert "Traceback" not in err and code in (0, 2), (code, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert any(name in lines[0] for name in names), (names, lines[0])


def files_in(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    ensdiag.save_model(ensdiag.build_model("mlp", "batch-ensemble", 2, 10, (1, 8, 8)), path)
    return path.read_bytes()


def with_spec(data: bytes, change) -> bytes:
    """The file with its ensdiag.spec metadata changed by `change(dict) -> dict | str`."""
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    spec = change(json.loads(header["__metadata__"]["ensdiag.spec"]))
    header["__metadata__"]["ensdiag.spec"] = spec if isinstance(spec, str) else json.dumps(spec)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + size:]


@PROPERTY
@given(st.binary(max_size=512))
def test_random_bytes_as_any_input_file(data):
    with sandbox() as folder:
        Path("input.safetensors").write_bytes(data)
        for command in ("analyze", "diversity", "evaluate"):
            code, err = invoke(command, "input.safetensors", "--format", "json")
            assert code == 2
            assert_clean(code, err, ["input.safetensors"])
        assert files_in(folder) == {"input.safetensors"}


@PROPERTY
@given(st.integers(0, 10**9))
def test_truncated_model_files(model_bytes, cut):
    with sandbox() as folder:
        Path("m.safetensors").write_bytes(model_bytes[: cut % (len(model_bytes) + 1)])
        code, err = invoke("diversity", "m.safetensors", "--format", "json", "--data-dir", "nowhere")
        assert_clean(code, err, ["m.safetensors"])
        assert files_in(folder) == {"m.safetensors"}


# allow_subnormal=False: ensdiag flushes subnormals process-wide (docs/performance.md), and
# hypothesis refuses to draw them while flushing is on
SPEC_VALUES = st.one_of(st.integers(-10, 10), st.integers(10**6, 10**12), st.floats(allow_nan=True, allow_subnormal=False),
                        st.text(max_size=12),
                        st.lists(st.integers(-5, 10**7), max_size=6), st.none(), st.booleans(),
                        st.dictionaries(st.text(max_size=6), st.integers(), max_size=3))


@PROPERTY
@given(st.sampled_from(["arch", "method", "num_members", "num_classes", "input_shape", "options", "extra"]), SPEC_VALUES)
def test_mutated_model_metadata_never_allocates_or_crashes(model_bytes, key, value):
    def change(spec):
        spec[key] = value
        return spec

    with sandbox() as folder:
        Path("m.safetensors").write_bytes(with_spec(model_bytes, change))
        code, err = invoke("diversity", "m.safetensors", "--format", "json", "--data-dir", "nowhere")
        assert_clean(code, err, ["m.safetensors", "spec", "member", "input_shape", "num_classes", "architecture",
                                 "method", "option", "variant", "init", "layout"])
        assert files_in(folder) == {"m.safetensors"}


@pytest.mark.parametrize("change,match", [
    (lambda spec: {**spec, "num_members": -3}, "cannot have -3 members"),
    (lambda spec: {**spec, "input_shape": [3, 4096, 4096]}, "tensors do not fit its spec"),  # would be 3.2 GB
    (lambda spec: {**spec, "method": "[red]EVIL"}, r"unknown method '\[red\]EVIL'"),
    (lambda spec: "not json", "model spec is not valid JSON"),
])
def test_stored_model_specs_are_checked_before_anything_is_built(model_bytes, tmp_path, capsys, change, match):
    path = tmp_path / "m.safetensors"
    path.write_bytes(with_spec(model_bytes, change))
    assert_one_line_error(capsys, "diversity", path, "--data-dir", tmp_path, match=match)


OPTION_VALUES = st.one_of(st.text(max_size=10), st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e308", "1e-320",
                                                                 "0.5", "3", "[red]x", "../../x", ""]))
TRAIN_OPTIONS = ["--lr", "--epochs", "--members", "--dropout", "--batch-size", "--be-init", "--seeds", "--method",
                 "--be-variant", "--be-layout", "--patience", "--val-fraction", "--mc-dropout-train", "--device"]


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(TRAIN_OPTIONS), OPTION_VALUES), min_size=1, max_size=3))
def test_random_train_option_values(options):
    """Every option value is refused with one line naming it, or accepted; nothing trains (no data)."""
    with sandbox() as folder:
        args = [part for pair in options for part in pair]
        code, err = invoke("train", "--preset", "mnist", "--data-dir", "empty", "--out", "run", "--quiet", *args)
        assert code == 2, err
        names = [option for option, _ in options] + [option.lstrip("-") for option, _ in options]
        assert_clean(code, err, names + ["MNIST not found", "unknown method", "methods and seeds", "seed",
                                         "No such option", "Invalid value", "split-batch", "Option", "cuda"])
        assert files_in(folder) <= {"run"} and not any(Path("run").iterdir() if Path("run").exists() else [])


@pytest.fixture(scope="module")
def predictions_bytes(tmp_path_factory):
    from ensdiag.predictions import save_predictions
    g = torch.Generator().manual_seed(0)
    path = tmp_path_factory.mktemp("predictions") / "p.safetensors"
    save_predictions({"id": {"logits": torch.randn(3, 20, 4, generator=g), "labels": torch.randint(0, 4, (20,), generator=g)},
                      "shift/blur": {"logits": torch.randn(3, 10, 4, generator=g), "labels": torch.randint(0, 4, (10,), generator=g)},
                      "ood": {"logits": torch.randn(3, 15, 4, generator=g), "labels": None}}, path, {"ensdiag.splits": {}})
    return path.read_bytes()


def with_header(data: bytes, change) -> bytes:
    size = struct.unpack("<Q", data[:8])[0]
    text = json.dumps(change(json.loads(data[8:8 + size]))).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + size:]


HEADER_VALUES = st.one_of(st.sampled_from(["F16", "I64", "BOOL", "U8", "F64", "X9"]), st.integers(-3, 10**6),
                          st.lists(st.integers(-2, 10**4), max_size=4), st.text(max_size=10), st.none())


@PROPERTY
@given(st.sampled_from(["id/logits", "id/labels", "ood/logits", "shift/blur/labels", "__metadata__"]),
       st.sampled_from(["dtype", "shape", "data_offsets", "ensdiag.format", "rename"]), HEADER_VALUES)
def test_mutated_predictions_headers(predictions_bytes, tensor, field, value):
    def change(header):
        if field == "rename":
            header[str(value)] = header.pop(tensor)
        elif isinstance(header.get(tensor), dict):
            header[tensor][field] = value
        return header

    with sandbox() as folder:
        Path("p.safetensors").write_bytes(with_header(predictions_bytes, change))
        code, err = invoke("analyze", "p.safetensors", "--format", "json")
        assert_clean(code, err, ["p.safetensors"])
        assert files_in(folder) == {"p.safetensors"}


REPORT_OPTIONS = st.lists(st.tuples(st.sampled_from(["--format", "--reference", "--out"]),
                                    st.sampled_from(["json", "html", "bogus", "paper", "", "[red]x", "out.md", "."])),
                          min_size=1, max_size=2)


@PROPERTY
@given(REPORT_OPTIONS)
def test_random_report_options(finished_run, options):
    """report reads the run and writes only into it, --out, or stdout."""
    with sandbox() as folder:
        args = [part for pair in options for part in pair]
        code, err = invoke("report", finished_run, "--no-figures", *args)
        assert_clean(code, err, ["--format", "--reference", "--out", "reference", "format", "out", "paper"])
        named = {value for option, value in options if option == "--out"}  # what --out named, and nothing else
        assert files_in(folder) <= named | {f"report.{ext}" for ext in ("json", "html", "md", "txt", "tex")}


# ---------------------------------------------------------------- the newer surfaces (round three)

NUMERIC_DTYPES = st.sampled_from(["<f4", "<f8", "<i8", "<u1", "|b1", "<f2", ">f4", "<c8"])
SHAPES = st.lists(st.integers(0, 40), min_size=0, max_size=4)


@PROPERTY
@given(NUMERIC_DTYPES, SHAPES, st.booleans(), st.sampled_from(["npy", "npz", "npz-compressed"]))
def test_random_arrays_as_predictions(dtype, shape, probs, kind):
    """analyze on .npy/.npz of any dtype and shape: metrics (0) or one line naming the file (2)."""
    import numpy as np
    with sandbox() as folder:
        rng = np.random.default_rng(0)
        array = (rng.random(shape) * 4).astype(np.dtype(dtype)) if dtype != "|b1" else rng.random(shape) > 0.5
        name = "p.npy" if kind == "npy" else "p.npz"
        if kind == "npy":
            np.save(name, array)
        else:
            (np.savez_compressed if kind == "npz-compressed" else np.savez)(name, **{"probs" if probs else "logits": array})
        args = ["--inputs", "probs"] if probs and kind == "npy" else []
        code, err = invoke("analyze", name, "--format", "json", *args)
        assert_clean(code, err, [name, "--inputs"])
        assert files_in(folder) == {name}


@pytest.fixture(scope="module")
def foreign_states():
    from pathlib import Path as P
    fixtures = P(__file__).parent / "fixtures" / "torch_uncertainty"
    states = {}
    for name in ("be_mlp.pt", "de_mlp_member0.pt", "packed_mlp.pt", "mimo_mlp.pt"):
        state = torch.load(fixtures / name, weights_only=True)
        states[name] = state.get("state_dict", state)
    return states


MUTATIONS = st.sampled_from(["drop", "zero-dim", "int", "nan", "transpose", "extra", "resize"])


@PROPERTY
@given(st.sampled_from(["be_mlp.pt", "de_mlp_member0.pt", "packed_mlp.pt", "mimo_mlp.pt"]), MUTATIONS, st.integers(0, 1000),
       st.sampled_from(["import", "diversity"]))
def test_mutated_foreign_checkpoints(foreign_states, name, mutation, pick, command):
    """A torch-uncertainty or plain checkpoint with one tensor changed: imported or refused in one line."""
    state = dict(foreign_states[name])
    key = sorted(state)[pick % len(state)]
    value = state[key]
    if mutation == "drop":
        del state[key]
    elif mutation == "zero-dim":
        state[key] = torch.empty(0, *value.shape[1:]) if value.dim() else value
    elif mutation == "int":
        state[key] = value.long()
    elif mutation == "nan":
        state[key] = torch.full_like(value, float("nan")) if value.is_floating_point() else value
    elif mutation == "transpose" and value.dim() >= 2:
        state[key] = value.transpose(0, 1).contiguous()
    elif mutation == "extra":
        state["surplus.weight"] = torch.ones(3, 3)
    elif mutation == "resize":
        state[key] = torch.ones(*(size + 1 for size in value.shape)) if value.dim() else value
    with sandbox() as folder:
        torch.save(state, "c.pt")
        args = ["--out", "out.safetensors"] if command == "import" else ["--format", "json", "--no-geometry"]
        code, err = invoke(command, "c.pt", *args)
        assert_clean(code, err, ["c.pt"])
        assert files_in(folder) <= {"c.pt", "out.safetensors"}


METHOD_OPTIONS = st.sampled_from(["batch-ensemble.init", "batch-ensemble.variant", "packed-ensemble.alpha",
                                  "packed-ensemble.gamma", "mimo.batch_repetition", "mimo.input_repetition",
                                  "mc-dropout.rate", "nope.x", "deep-ensemble.width", "bogus"])


@PROPERTY
@given(st.lists(st.tuples(METHOD_OPTIONS, OPTION_VALUES), min_size=1, max_size=2), st.booleans())
def test_random_method_options_and_track_diversity(options, track):
    """-O METHOD.NAME=VALUE and --track-diversity: refused in one line naming the option, or accepted
    (then nothing trains: there is no data); nothing is written outside --out."""
    with sandbox() as folder:
        args = [part for name, value in options for part in ("-O", f"{name}={value}")]
        code, err = invoke("train", "--preset", "mnist", "--data-dir", "empty", "--out", "run", "--quiet",
                           *(["--track-diversity"] if track else []), *args)
        assert code == 2, err
        names = [name for name, _ in options] + [name.split(".")[0] for name, _ in options]
        assert_clean(code, err, names + ["--option", "MNIST not found", "METHOD.NAME", "option", "track-diversity"])
        assert files_in(folder) <= {"run"} and not any(Path("run").iterdir() if Path("run").exists() else [])
