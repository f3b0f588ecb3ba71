"""Hostile and damaged input: every case exits 0 or 2 with one line naming the file or option,
never a traceback, never code execution, and nothing outside the run folder is touched."""

import json
import shutil

import pytest
import torch

import ensdiag
from ensdiag.config import preset_config
from ensdiag.data.batching import Normalize
from ensdiag.data.preset import load_preset_data
from ensdiag.experiment import run_experiment
from ensdiag.train import FitData, fit

from .cli import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny finished run: single and BatchEnsemble, one seed, two epochs on the embedded digits."""
    out = tmp_path_factory.mktemp("finished") / "run"
    config = preset_config("digits", methods=["single", "batch-ensemble"], seeds=[1], epochs=2, members=2)
    run_experiment(config, out, "data", quiet=True)
    return out


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "box" / "run"  # `box` holds only the run: nothing else may appear in it
    shutil.copytree(finished_run, copy)
    return copy


def outside_untouched(run):
    return sorted(p.name for p in run.parent.iterdir()) == ["run"]


DAMAGE = {
    "truncated metrics.json": ("single/seed-1/metrics.json", lambda text: text[: len(text) // 2]),
    "truncated meta.json": ("single/seed-1/meta.json", lambda text: text[:10]),
    "garbage history line": ("single/seed-1/history.jsonl", lambda text: text + "garbage\n"),
    "history row without loss": ("single/seed-1/history.jsonl", lambda text: '{"epoch": 1}\n'),
    "experiment.json is a list": ("experiment.json", lambda text: "[1, 2]"),
    "metrics are {}": ("batch-ensemble/seed-1/metrics.json", lambda text: "{}"),
    "meta is a number": ("batch-ensemble/seed-1/meta.json", lambda text: "3"),
    "config has a string lr": ("experiment.json", lambda text: text.replace('"lr": 0.01', '"lr": "fast"')),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_run_folders_give_one_line_naming_the_file(run, capsys, case):
    relative, damage = DAMAGE[case]
    path = run / relative
    path.write_text(damage(path.read_text()))
    line = assert_one_line_error(capsys, "report", run, "--format", "json", "--no-figures", match=relative.split("/")[-1])
    assert "weights_only" not in line and outside_untouched(run)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated", b"\x80\x04garbage"])
def test_damaged_training_state_is_a_clear_error(run, capsys, content):
    folder = run / "single" / "seed-1"
    (folder / "meta.json").unlink()  # the seed is unfinished again, with a damaged resume point
    (folder / "training-state.pt").write_bytes(content)
    line = assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match="training-state.pt is damaged")
    assert "weights_only" not in line and "delete it" in line


def test_truncated_real_training_state_is_a_clear_error(run, capsys, tmp_path):
    config = preset_config("digits", methods=["single"], seeds=[1], epochs=1)
    data = load_preset_data(config, "data")
    fit_data = FitData(data.train.images[:64], data.train.labels[:64], data.train.images[64:96],
                       data.train.labels[64:96], Normalize(config.mean, config.std, "cpu"))
    state = tmp_path / "state.pt"  # a real training state, then cut short
    fit(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)), config, fit_data, 1, state, "cpu")
    folder = run / "single" / "seed-1"
    (folder / "meta.json").unlink()
    (folder / "training-state.pt").write_bytes(state.read_bytes()[:-100])
    assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match="training-state.pt is damaged")


@pytest.mark.parametrize("change,match", [
    ({"methods": ["../../x"]}, "unknown method '../../x'"),
    ({"epochs": -3}, "--epochs must be at least 1"),
    ({"seeds": ["a"]}, "seeds must be tuple"),
    ({"members": 0}, "--members must be at least 1"),
    ({"lr": None}, "lr must be float"),
    ({"evil": 1}, "unknown fields 'evil'"),
])
def test_resume_validates_the_stored_config_like_user_input(run, capsys, change, match):
    path = run / "experiment.json"
    experiment = json.loads(path.read_text())
    experiment["config"].update(change)
    path.write_text(json.dumps(experiment))
    for seed_folder in run.glob("*/seed-1"):
        (seed_folder / "meta.json").unlink()
    assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match=match)
    assert outside_untouched(run) and not (run.parent.parent / "x").exists()


@pytest.mark.parametrize("args,match", [
    (["--lr", "inf"], "--lr must be a finite number"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--dropout", "nan"], "--dropout must be a finite number"),
    (["--val-fraction", "nan"], "--val-fraction must be a finite number"),
    (["--be-init", "normal:nan"], "not a finite number"),
    (["--be-init", "random-sign:inf"], "not a finite number"),
    (["--seeds", "18446744073709551616"], "--seeds must lie in -2"),
    (["--seeds", "-9223372036854775809"], "--seeds must lie in -2"),
])
def test_float_options_must_be_finite(tmp_path, capsys, args, match):
    assert_one_line_error(capsys, "train", "--quiet", "--out", tmp_path / "r", *args, match=match)
    assert not (tmp_path / "r").exists()


def test_a_diverging_run_stops_at_the_epoch_and_keeps_the_last_finite_state(tmp_path, capsys):
    line = assert_one_line_error(capsys, "train", "--quiet", "--method", "single", "--seeds", "1", "--epochs", "3",
                                 "--lr", "1e38", "--out", tmp_path / "r", match=r"single seed 1: training diverged in epoch \d")
    assert_one_line_error(capsys, "train", "--quiet", "--method", "single", "--seeds", "1,2", "--epochs", "3",
                          "--lr", "1e38", "--out", tmp_path / "grid",
                          match=r"2 runs diverged \(the others finished\): single seed 1: .*; single seed 2: ")
    folder = tmp_path / "r" / "single" / "seed-1"
    assert not (folder / "meta.json").exists() and not (folder / "model.safetensors").exists()
    state = folder / "training-state.pt"
    if state.exists():  # diverged after epoch 1: the state of the last finite epoch is kept
        saved = torch.load(state, weights_only=True)
        assert all(torch.isfinite(t).all() for t in saved["model"].values())
        assert "resumes from there" in line


# --------------------------------------------------------------------------- property-based cases

import contextlib  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ensdiag.cli import main  # noqa: E402

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


# --------------------------------------------------------------------------- output paths


def test_report_without_figures_leaves_the_run_folders_report_alone(run, capsys):
    code, _, _ = run_cli(capsys, "report", run, "--format", "markdown")
    html = (run / "report.html").read_bytes()
    figures = sorted(p.name for p in (run / "figures").iterdir())
    code, out, err = run_cli(capsys, "report", run, "--format", "markdown", "--no-figures")
    assert code == 0 and "## In-distribution" in out and "written to" not in err
    assert (run / "report.html").read_bytes() == html and sorted(p.name for p in (run / "figures").iterdir()) == figures


def test_a_run_folder_that_cannot_be_written_is_still_reported(run, capsys, monkeypatch):
    import os
    real = os.access  # root may write anywhere, so a read-only mount is simulated
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK and real(path, mode))
    code, out, err = run_cli(capsys, "report", run, "--format", "json")
    assert code == 0 and json.loads(out)["tables"] and "is not writable" in err
    assert not (run / "report.html").exists()


def test_output_options_name_a_file_or_a_folder(run, capsys, tmp_path):
    predictions = run / "single" / "seed-1" / "predictions.safetensors"
    (tmp_path / "folder").mkdir()
    assert run_cli(capsys, "analyze", predictions, "--out", tmp_path / "folder")[0] == 0
    assert json.loads((tmp_path / "folder" / "metrics.json").read_text())["analyzers"]
    assert run_cli(capsys, "analyze", predictions, "--out", tmp_path / "new" / "deep" / "m.json")[0] == 0
    assert (tmp_path / "new" / "deep" / "m.json").is_file()
    assert run_cli(capsys, "report", run, "--format", "latex", "--no-figures", "--out", tmp_path / "folder")[0] == 0
    assert (tmp_path / "folder" / "report.tex").read_text().startswith("%") or (tmp_path / "folder" / "report.tex").stat().st_size
    (tmp_path / "file.txt").write_text("x")
    assert_one_line_error(capsys, "analyze", predictions, "--out", tmp_path / "file.txt" / "m.json", match="is a file")
    model = run / "single" / "seed-1" / "model.safetensors"
    assert_one_line_error(capsys, "evaluate", model, "--out", tmp_path / "file.txt", match="is a file")


@pytest.mark.parametrize("name,magic", [("heat.jpg", b"\xff\xd8"), ("heat.pdf", b"%PDF"), ("heat.png", b"\x89PNG"),
                                       ("heat", b"\x89PNG")])
def test_plot_writes_the_format_its_name_says(run, capsys, tmp_path, name, magic):
    model = run / "batch-ensemble" / "seed-1" / "model.safetensors"
    code, _, err = run_cli(capsys, "diversity", model, "--plot", tmp_path / name)
    written = tmp_path / (name if "." in name else name + ".png")
    assert code == 0 and written.read_bytes().startswith(magic) and f"heatmaps written to {written}" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("heat")) == [written.name]


def test_plot_to_an_unknown_format_or_a_folder_is_refused(run, capsys, tmp_path):
    model = run / "batch-ensemble" / "seed-1" / "model.safetensors"
    assert_one_line_error(capsys, "diversity", model, "--plot", tmp_path / "heat.xyz", match="unknown image format .xyz")
    assert_one_line_error(capsys, "diversity", model, "--plot", tmp_path, match="is a directory")


def test_an_ensemble_too_big_for_memory_is_refused_before_training(tmp_path, capsys, monkeypatch):
    import ensdiag.experiment
    monkeypatch.setattr(ensdiag.experiment, "physical_memory", lambda: 64 * 2**20)  # a 64 MiB machine
    assert_one_line_error(capsys, "train", "--method", "deep-ensemble", "--members", "1000", "--out", tmp_path / "r",
                          "--quiet", match=r"deep-ensemble with k = 1000 needs about 0\.\d GiB .*lower --members")
    assert not (tmp_path / "r").exists()
    assert_one_line_error(capsys, "train", "--members", "5000", "--quiet", match="--members must be at most 4096")


def test_hundreds_of_members_train_and_are_diagnosed(tmp_path, capsys):
    """k = 300 on the embedded digits (k = 1000 was once killed at 23.6 GB by a k×k×N tensor); k > 256 stores no matrix."""
    code, _, err = run_cli(capsys, "train", "--method", "batch-ensemble", "--members", "300", "--seeds", "1",
                           "--epochs", "1", "--out", tmp_path / "r", "--quiet")
    assert code == 0, err
    metrics = json.loads((tmp_path / "r" / "batch-ensemble" / "seed-1" / "metrics.json").read_text())
    disagreement = metrics["analyzers"]["disagreement"]["splits"]["id"]
    assert disagreement["matrix"]["value"] is None and 0 <= disagreement["mean"]["value"] <= 1


def test_run_folders_written_by_older_ensdiag_still_report(run, capsys):
    """Kernel-wise BatchEnsemble on the mlp, one FPR95 key, NaN losses in a history: all as 0.1 wrote them."""
    experiment = json.loads((run / "experiment.json").read_text())
    experiment["config"]["methods"].append("batch-ensemble-kernel")
    del experiment["config"]["be_loss"]
    (run / "experiment.json").write_text(json.dumps(experiment))
    path = run / "single" / "seed-1" / "metrics.json"
    metrics = json.loads(path.read_text())
    msp = metrics["analyzers"]["ood"]["scores"]["msp"]
    legacy = msp.pop("fpr95_ood_as_id")
    msp.pop("fpr95_id_as_ood")
    msp["fpr95"] = legacy
    path.write_text(json.dumps(metrics))
    history = run / "single" / "seed-1" / "history.jsonl"
    history.write_text(history.read_text() + '{"epoch": 3, "loss": NaN, "accuracy": 0.1, "val_accuracy": null}\n')
    code, out, err = run_cli(capsys, "report", run, "--format", "json", "--no-figures")
    assert code == 0, err
    ood = next(t for t in json.loads(out)["tables"] if t["id"] == "ood")
    column = [c["name"] for c in ood["columns"]].index("FPR95 OOD→ID")
    assert next(r for r in ood["rows"] if r["method"] == "single")["cells"][column]["mean"] == legacy["value"]


def test_diversity_plot_skips_what_was_not_stored(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 260, 10, (1, 8, 8))  # k > 256: no matrices stored
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    code, out, _ = run_cli(capsys, "diversity", path, "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["weight_similarity"]["matrix"]["value"] is None
    assert -1 <= report["weight_similarity"]["mean"]["value"] <= 1
    assert_one_line_error(capsys, "diversity", path, "--plot", tmp_path / "d.png", match="nothing to plot")


@pytest.fixture(scope="module")
def predictions_bytes(tmp_path_factory):
    from ensdiag.predict import save_predictions
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
