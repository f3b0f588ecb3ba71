"""Saved results are never replaced without --overwrite, and no --out writes through a link.

`evaluate --out` refuses a run folder's root, a training run's folder and a folder holding saved
predictions or metrics (an earlier evaluate, an analysis) unless --overwrite, before predicting
anything; `analyze --out` refuses the same for the file it writes. Every --out (evaluate, report,
analyze, diversity --save, import) and report --examples refuse a link named in their place, and
a folder named where a file goes is refused before the work, naming no temporary file."""

import json
import os

import numpy as np
import pytest

from .cli import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny ensdiag model on 1×8×8 inputs with 3 classes, and data for it."""
    from ensdiag.checkpoint import save_model
    from ensdiag.nn import build_model
    folder = tmp_path_factory.mktemp("model")
    path = save_model(build_model("mlp", "deep-ensemble", 2, 3, (1, 8, 8)), folder / "model.safetensors")
    np.savez(folder / "d.npz", images=np.random.default_rng(0).integers(0, 255, (12, 1, 8, 8), dtype=np.uint8),
             labels=np.arange(12) % 3)
    return path, folder / "d.npz"


def evaluate(capsys, model, *args):
    path, data = model
    return run_cli(capsys, "evaluate", path, "--data", data, "--normalize", "none", *args)


@pytest.mark.slow
def test_evaluate_never_replaces_saved_results_without_overwrite(model, capsys, tmp_path):
    code, _, err = evaluate(capsys, model, "--out", tmp_path / "e")
    assert code == 0, err
    first = (tmp_path / "e" / "metrics.json").read_bytes()
    assert_one_line_error(capsys, "evaluate", *model[:1], "--data", model[1], "--normalize", "none", "--out", tmp_path / "e",
                          match="already holds predictions.safetensors .*pass --overwrite")
    assert (tmp_path / "e" / "metrics.json").read_bytes() == first
    (tmp_path / "e" / "predictions.safetensors").unlink()  # either file alone is a saved result
    assert_one_line_error(capsys, "evaluate", *model[:1], "--data", model[1], "--normalize", "none", "--out", tmp_path / "e",
                          match="already holds metrics.json")
    code, _, err = evaluate(capsys, model, "--out", tmp_path / "e", "--overwrite")
    assert code == 0 and (tmp_path / "e" / "predictions.safetensors").is_file(), err
    assert_one_line_error(capsys, "evaluate", *model[:1], "--data", model[1], "--overwrite",
                          match="--overwrite replaces what --out holds")


def test_evaluate_refuses_a_run_folder_and_a_training_run_even_with_overwrite(model, finished_run, capsys, tmp_path):
    import shutil
    run = shutil.copytree(finished_run, tmp_path / "run")
    seed = run / "batch-ensemble" / "seed-1"
    before = {path.name: path.read_bytes() for path in seed.iterdir()}
    for out, match in ((seed, "holds a trained model, which these files would replace"),
                       (run, "is a run folder \\(it holds experiment.json")):
        for extra in ((), ("--overwrite",)):
            assert_one_line_error(capsys, "evaluate", model[0], "--data", model[1], "--normalize", "none", "--out", out,
                                  *extra, match=match)
    assert {path.name: path.read_bytes() for path in seed.iterdir()} == before
    assert sorted(path.name for path in run.iterdir()) == sorted(path.name for path in finished_run.iterdir())


@pytest.mark.slow
def test_analyze_out_refuses_what_evaluate_out_refuses(finished_run, capsys, tmp_path):
    import shutil
    run = shutil.copytree(finished_run, tmp_path / "run")
    predictions = tmp_path / "p.npz"  # a few predictions: the refusals are the point, not the analysis
    np.savez(predictions, logits=np.random.default_rng(0).normal(size=(2, 8, 3)).astype(np.float32), labels=np.arange(8) % 3)
    metrics = (run / "single" / "seed-1" / "metrics.json").read_bytes()
    for out in (run / "single" / "seed-1", run / "single" / "seed-1" / "metrics.json"):
        assert_one_line_error(capsys, "analyze", predictions, "--out", out, "--overwrite", match="holds a trained model")
    assert_one_line_error(capsys, "analyze", predictions, "--out", run, match="is a run folder")
    assert (run / "single" / "seed-1" / "metrics.json").read_bytes() == metrics
    assert run_cli(capsys, "analyze", predictions, "--out", tmp_path / "a.json")[0] == 0
    assert_one_line_error(capsys, "analyze", predictions, "--out", tmp_path / "a.json", match="a.json already exists")
    assert run_cli(capsys, "analyze", predictions, "--out", tmp_path / "a.json", "--overwrite")[0] == 0
    assert json.loads((tmp_path / "a.json").read_text())["analyzers"]


@pytest.fixture
def outside(tmp_path):
    """A folder outside the one a command is given, and a link to it."""
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "link")
    os.symlink(tmp_path / "outside" / "nothing.md", tmp_path / "dangling.md")
    os.symlink(tmp_path / "outside" / "e.csv", tmp_path / "dangling.csv")
    return tmp_path / "outside", tmp_path / "link"


def test_no_out_writes_through_a_link(model, run, capsys, tmp_path, outside):
    folder, link = outside
    predictions = run / "single" / "seed-1" / "predictions.safetensors"
    lora = [__import__("pathlib").Path(__file__).parent / "fixtures" / "lora" / f"adapter-{i}" for i in (0, 1)]
    for args in (["evaluate", model[0], "--data", model[1], "--normalize", "none", "--out", link],
                 ["report", run, "--no-figures", "--format", "markdown", "--out", link],
                 ["report", run, "--no-figures", "--format", "markdown", "--out", tmp_path / "dangling.md"],
                 ["report", run, "--no-figures", "--format", "json", "--examples", tmp_path / "dangling.csv"],
                 ["analyze", predictions, "--out", link],
                 ["analyze", predictions, "--out", link, "--method", "m"],
                 ["diversity", *lora, "--save", link],
                 ["import", model[0], "--out", link]):
        option = "--examples" if "--examples" in args else "--save" if "--save" in args else "--out"
        line = assert_one_line_error(capsys, *args, match=f"{option} .* is a link: ensdiag never writes through a link")
        assert ".tmp" not in line
    assert list(folder.iterdir()) == []


def test_report_examples_onto_a_folder_fails_before_the_report(run, capsys, tmp_path, monkeypatch):
    import ensdiag.report
    (tmp_path / "e.csv").mkdir()
    monkeypatch.setattr(ensdiag.report, "make_report", lambda *a, **k: pytest.fail("the report was built"))
    line = assert_one_line_error(capsys, "report", run, "--examples", tmp_path / "e.csv", match="--examples .*e.csv is a folder")
    assert ".tmp" not in line


def test_the_python_writers_refuse_a_folder_in_place_of_a_file(tmp_path):
    import torch

    import ensdiag
    from ensdiag.errors import EnsdiagError
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    diagnosis = ensdiag.diagnose([torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)], test=(x, y),
                                 measure=ensdiag.Measure(geometry=False))
    (tmp_path / "e.csv").mkdir()
    with pytest.raises(EnsdiagError, match="e.csv is a folder"):
        diagnosis.save_examples(tmp_path / "e.csv")
    diagnosis.write_files(tmp_path / "w")
    with pytest.raises(EnsdiagError, match="already holds predictions.safetensors"):
        diagnosis.write_files(tmp_path / "w")
    diagnosis.write_files(tmp_path / "w", overwrite=True)
    from ensdiag.io import atomic_write_text
    with pytest.raises(EnsdiagError, match=r"cannot write .*e.csv: Is a directory") as error:
        atomic_write_text(tmp_path / "e.csv", "x")
    assert ".tmp" not in str(error.value) and not list(tmp_path.glob(".e.csv.*"))
