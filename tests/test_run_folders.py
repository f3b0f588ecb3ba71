"""The folders ensdiag writes: every method and seed folder a real folder inside the one asked for
(a link on the way is refused, nothing lands outside), method names never the run folder's own,
a saved result replaced only when asked (--overwrite), a LoRA weight-space diagnosis and an
analysis of predictions side by side in one run and nothing else mixed, and `train` growing a
run folder by seeds and methods without touching what is finished."""

import json
import os

import numpy as np
import pytest
import torch

import ensdiag
from ensdiag.errors import EnsdiagError

from .cli import assert_one_line_error, run_cli
from .lora_reference import ADAPTERS


@pytest.fixture
def predictions(tmp_path):
    """Two predictions files of the same shape (different numbers) and their labels."""
    rng = np.random.default_rng(0)
    for name in ("p", "q"):
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(3, 40, 4)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 4, 40))
    return tmp_path / "p.npy", tmp_path / "q.npy", tmp_path / "y.npy"


def analyze(capsys, source, labels, out, *extra):
    return run_cli(capsys, "analyze", source, "--labels", labels, "--out", out, "--format", "json", *extra)


def outside_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    return outside


# ------------------------------------------------------------------ no write through a link

@pytest.mark.parametrize("linked", ["method", "seed"])
def test_analyze_never_writes_through_a_linked_method_or_seed_folder(tmp_path, capsys, predictions, linked):
    p, _, y = predictions
    outside = outside_folder(tmp_path)
    (tmp_path / "runs").mkdir()
    if linked == "method":
        os.symlink(outside, tmp_path / "runs" / "m")
    else:
        (tmp_path / "runs" / "m").mkdir()
        os.symlink(outside, tmp_path / "runs" / "m" / "seed-0")
    assert_one_line_error(capsys, "analyze", p, "--labels", y, "--out", tmp_path / "runs", "--method", "m",
                          match=r"is a link, not a folder of .*never through a link")
    assert sorted(path.name for path in outside.iterdir()) == ["keep.txt"]


def test_a_lora_save_never_writes_through_a_linked_method_folder(tmp_path, capsys):
    outside = outside_folder(tmp_path)
    (tmp_path / "runs").mkdir()
    os.symlink(outside, tmp_path / "runs" / "lora")
    assert_one_line_error(capsys, "diversity", *ADAPTERS[:2], "--save", tmp_path / "runs", match="is a link")
    assert sorted(path.name for path in outside.iterdir()) == ["keep.txt"]


@pytest.mark.slow
def test_train_resume_refuses_a_linked_seed_folder_before_training_anything(run, tmp_path, capsys):
    outside = tmp_path / "outside"
    (run / "single" / "seed-1").rename(outside)
    (outside / "meta.json").unlink()  # unfinished: a resume would train into it
    os.symlink(outside, run / "single" / "seed-1")
    before = sorted(path.name for path in outside.iterdir())
    assert_one_line_error(capsys, "train", "--resume", run, "--quiet", match=r"single/seed-1 is a link")
    assert sorted(path.name for path in outside.iterdir()) == before


def test_stale_temporaries_are_never_removed_through_a_link(tmp_path):
    from ensdiag.io import remove_stale_temporaries
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".meta.json.abc123.tmp").write_text("not ensdiag's to delete")
    (tmp_path / "run" / "m").mkdir(parents=True)
    os.symlink(outside, tmp_path / "run" / "m" / "seed-0")
    assert remove_stale_temporaries(tmp_path / "run", ["meta.json"], ["*/seed-*"]) == []
    assert (outside / ".meta.json.abc123.tmp").exists()


# ------------------------------------------------------------------ names the run folder itself uses

@pytest.mark.parametrize("name", ["experiment.json", "report.md", "report.html", "report", "figures", "Figures",
                                  "REPORT.TXT", ".hidden"])
def test_a_method_cannot_take_a_name_the_run_folder_uses(tmp_path, capsys, predictions, name):
    p, _, y = predictions
    assert_one_line_error(capsys, "analyze", p, "--labels", y, "--out", tmp_path / "runs", "--method", name,
                          match="method name")
    assert not (tmp_path / "runs").exists()


def test_no_method_takes_the_name_of_anything_ensdiag_writes_at_the_folders_root(tmp_path, capsys, predictions):
    p, _, y = predictions
    analyze(capsys, p, y, tmp_path / "runs", "--method", "m")
    code, _, err = run_cli(capsys, "report", tmp_path / "runs")  # report.md, report.html, its cache, figures/
    assert code == 0, err
    written = sorted(path.name for path in (tmp_path / "runs").iterdir() if path.name != "m")
    assert {"experiment.json", "report.md", "report-cache.json", "figures"} <= set(written)
    for name in written:
        assert_one_line_error(capsys, "analyze", p, "--labels", y, "--out", tmp_path / "runs", "--method", name,
                              match="is a name the run folder itself uses")


def test_saving_a_diagnosis_as_experiment_json_is_a_value_error(tmp_path):
    diagnosis = ensdiag.diagnose(lambda x: torch.stack([x, 2 * x]), test=(torch.eye(3), torch.arange(3)),
                                 measure=ensdiag.Measure(geometry=False))
    with pytest.raises(ValueError, match="is a name the run folder itself uses") as raised:
        diagnosis.save(tmp_path / "runs", method="experiment.json")
    assert isinstance(raised.value, EnsdiagError) and "\n" not in str(raised.value)
    assert not (tmp_path / "runs" / "experiment.json").exists()


def test_a_diagnosis_folder_listing_a_reserved_method_is_damaged(tmp_path, capsys, predictions):
    p, _, y = predictions
    analyze(capsys, p, y, tmp_path / "runs", "--method", "m")
    path = tmp_path / "runs" / "experiment.json"
    experiment = json.loads(path.read_text())
    experiment["config"]["methods"].append("figures")
    path.write_text(json.dumps(experiment))
    assert_one_line_error(capsys, "report", tmp_path / "runs", "--no-figures", match="none of them a name the folder")


# ------------------------------------------------------------------ nothing replaced silently

def test_a_second_analysis_into_the_same_run_is_refused_unless_overwrite(tmp_path, capsys, predictions):
    p, q, y = predictions
    code, _, err = analyze(capsys, p, y, tmp_path / "runs", "--method", "m")
    assert code == 0, err
    first = (tmp_path / "runs" / "m" / "seed-0" / "metrics.json").read_text()
    assert_one_line_error(capsys, "analyze", q, "--labels", y, "--out", tmp_path / "runs", "--method", "m",
                          match=r"m/seed-0 already holds an analysis of predictions; pass --overwrite")
    assert (tmp_path / "runs" / "m" / "seed-0" / "metrics.json").read_text() == first
    code, _, err = analyze(capsys, q, y, tmp_path / "runs", "--method", "m", "--overwrite")
    assert code == 0, err
    assert (tmp_path / "runs" / "m" / "seed-0" / "metrics.json").read_text() != first
    code, _, err = analyze(capsys, q, y, tmp_path / "runs", "--method", "m", "--seed", "1")
    assert code == 0, err  # another seed is another run
    assert json.loads((tmp_path / "runs" / "experiment.json").read_text())["config"]["seeds"] == [0, 1]


def test_overwrite_only_goes_with_a_saved_run(tmp_path, capsys, predictions):
    p, _, y = predictions
    assert_one_line_error(capsys, "analyze", p, "--labels", y, "--overwrite", match="--overwrite names the run")
    assert_one_line_error(capsys, "diversity", *ADAPTERS[:2], "--overwrite", match="give --save")


def test_a_second_lora_diagnosis_into_the_same_run_is_refused_unless_overwrite(tmp_path, capsys):
    code, _, err = run_cli(capsys, "diversity", *ADAPTERS[:2], "--save", tmp_path / "runs", "--format", "json")
    assert code == 0, err
    assert_one_line_error(capsys, "diversity", *ADAPTERS[1:], "--save", tmp_path / "runs",
                          match="already holds a LoRA weight-space diagnosis; pass --overwrite")
    members = json.loads((tmp_path / "runs" / "lora" / "seed-0" / "lora.json").read_text())["lora"]["members"]
    assert members == [str(folder) for folder in ADAPTERS[:2]]
    code, _, err = run_cli(capsys, "diversity", *ADAPTERS[1:], "--save", tmp_path / "runs", "--overwrite", "--format", "json")
    assert code == 0, err
    members = json.loads((tmp_path / "runs" / "lora" / "seed-0" / "lora.json").read_text())["lora"]["members"]
    assert members == [str(folder) for folder in ADAPTERS[1:]]


def test_the_python_api_refuses_to_replace_a_saved_diagnosis_unless_asked(tmp_path):
    diagnosis = ensdiag.diagnose(lambda x: torch.stack([x, 2 * x]), test=(torch.eye(3), torch.arange(3)),
                                 measure=ensdiag.Measure(geometry=False))
    diagnosis.save(tmp_path / "runs", "m", 0)
    with pytest.raises(ValueError, match="already holds an analysis of predictions"):
        diagnosis.save(tmp_path / "runs", "m", 0)
    assert diagnosis.save(tmp_path / "runs", "m", 0, overwrite=True) == tmp_path / "runs" / "m" / "seed-0"


@pytest.mark.parametrize("first", ["analysis", "lora"])
def test_a_run_holds_a_lora_diagnosis_and_an_analysis_side_by_side(tmp_path, capsys, predictions, first):
    p, _, y = predictions
    saves = {"analysis": lambda: analyze(capsys, p, y, tmp_path / "runs", "--method", "lora"),
             "lora": lambda: run_cli(capsys, "diversity", *ADAPTERS[:3], "--save", tmp_path / "runs", "--format", "json")}
    for name in (first, *(set(saves) - {first})):
        code, _, err = saves[name]()
        assert code == 0, err
    run = tmp_path / "runs" / "lora" / "seed-0"
    metrics = json.loads((run / "metrics.json").read_text())
    lora = json.loads((run / "lora.json").read_text())["lora"]  # each part in its own files
    assert metrics["analyzers"]["calibration"]["status"] == "ok" and lora["k"] == 3  # neither lost
    from ensdiag.runs import LORA, PREDICTIONS, saved_kinds
    assert (run / "predictions.safetensors").is_file() and saved_kinds(run) == {PREDICTIONS, LORA}
    code, out, err = run_cli(capsys, "report", tmp_path / "runs", "--format", "markdown", "--no-figures")
    assert code == 0, err
    assert "LoRA ensemble" in out and "Acc" in out
    # overwriting one kind keeps the other
    code, _, err = analyze(capsys, p, y, tmp_path / "runs", "--method", "lora", "--overwrite")
    assert code == 0, err
    assert json.loads((run / "lora.json").read_text())["lora"]["k"] == 3


def test_a_diagnosis_never_goes_into_a_training_run_and_training_never_into_diagnoses(finished_run, tmp_path, capsys,
                                                                                       predictions):
    p, _, y = predictions
    assert_one_line_error(capsys, "analyze", p, "--labels", y, "--out", finished_run, "--method", "single",
                          match="holds a training run")
    from ensdiag.runs import PREDICTIONS, claim_run
    with pytest.raises(EnsdiagError, match="holds a training run"):
        claim_run(finished_run, "single", 1, PREDICTIONS, overwrite=True)
    analyze(capsys, p, y, tmp_path / "runs", "--method", "m")
    assert_one_line_error(capsys, "train", "--out", tmp_path / "runs", "--epochs", "1", "--quiet",
                          match="holds diagnoses saved by")


# ------------------------------------------------------------------ train grows a run folder

@pytest.mark.slow
def test_train_adds_seeds_and_methods_to_a_run_folder_and_keeps_what_is_finished(tmp_path, capsys):
    out = tmp_path / "grid"
    common = ["--epochs", "1", "--no-geometry", "--out", out, "--quiet"]
    code, _, err = run_cli(capsys, "train", "--method", "single", "--seeds", "3", *common)
    assert code == 0, err
    finished = {name: (out / "single" / "seed-3" / name).read_bytes() for name in ("meta.json", "model.safetensors")}
    code, _, err = run_cli(capsys, "train", "--method", "single,deep-ensemble", "--seeds", "3,4", "--members", "2", *common)
    assert "holds a different experiment" in err  # --members changes deep-ensemble only, but it is a setting
    code, _, err = run_cli(capsys, "train", "--method", "single,deep-ensemble", "--seeds", "3,4", *common)
    assert code == 0, err
    assert {name: (out / "single" / "seed-3" / name).read_bytes() for name in finished} == finished  # not retrained
    config = json.loads((out / "experiment.json").read_text())["config"]
    assert config["methods"] == ["single", "deep-ensemble"] and config["seeds"] == [3, 4]
    assert all((out / method / f"seed-{seed}" / "meta.json").is_file()
               for method in ("single", "deep-ensemble") for seed in (3, 4))
    code, out_text, err = run_cli(capsys, "report", out, "--format", "json", "--no-figures")
    assert code == 0, err


def test_a_check_before_computing_creates_nothing(tmp_path):
    from ensdiag.runs import LORA, claim_run
    run = claim_run(tmp_path / "runs", "m", 0, LORA, create=False)
    assert run == tmp_path / "runs" / "m" / "seed-0" and not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ one test set per folder

@pytest.mark.parametrize("change, named", [
    (lambda logits, labels: (np.concatenate([logits, logits[..., :1]], -1), labels), "5 classes against 4"),
    (lambda logits, labels: (logits, (labels + 1) % 4), "other labels: example 0 is class"),
    (lambda logits, labels: (logits[:, :30], labels[:30]), "30 examples against 40")])
def test_a_run_on_another_test_set_is_never_saved_beside_the_folders_runs(tmp_path, capsys, predictions, change, named):
    p, q, y = predictions
    analyze(capsys, p, y, tmp_path / "runs", "--method", "single")
    before = {path: path.read_bytes() for path in (tmp_path / "runs").rglob("*") if path.is_file()}
    logits, labels = change(np.load(q), np.load(y))
    np.save(tmp_path / "other.npy", logits)
    np.save(tmp_path / "other-labels.npy", labels)
    for method, seed in (("deep-ensemble", "0"), ("single", "1")):
        assert_one_line_error(capsys, "analyze", tmp_path / "other.npy", "--labels", tmp_path / "other-labels.npy",
                              "--out", tmp_path / "runs", "--method", method, "--seed", seed,
                              match=rf"this run's 'id' test set is not that of .*single.seed-0 \({named}")
    assert {path: path.read_bytes() for path in (tmp_path / "runs").rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["experiment.json", "single"]
    code, _, err = analyze(capsys, q, y, tmp_path / "runs", "--method", "deep-ensemble")  # the same test set
    assert code == 0, err
