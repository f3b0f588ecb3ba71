"""Output paths do what they say: report files in the run only when asked, --out as a file or
a folder, --plot in the format its suffix names, clean errors otherwise."""

import json

import pytest

import ensdiag

from .cli import assert_one_line_error, run_cli

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
    assert code == 0 and written.read_bytes().startswith(magic) and f"figures written to {written}" in err
    # beside the heatmaps, member geometry's line figures (a BatchEnsemble: no alignment), same format
    lines = [written.with_name(f"heat-{figure}{written.suffix}").name for figure in ("cka-layers", "paths")]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("heat")) == sorted([written.name, *lines])


def test_plot_to_an_unknown_format_or_a_folder_is_refused(run, capsys, tmp_path):
    model = run / "batch-ensemble" / "seed-1" / "model.safetensors"
    assert_one_line_error(capsys, "diversity", model, "--plot", tmp_path / "heat.xyz", match="unknown image format .xyz")
    assert_one_line_error(capsys, "diversity", model, "--plot", tmp_path, match="is a directory")


def test_diversity_plot_skips_what_was_not_stored(tmp_path, capsys):
    model = ensdiag.build_model("mlp", "deep-ensemble", 260, 10, (1, 8, 8))  # k > 256: no matrices stored
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    code, out, _ = run_cli(capsys, "diversity", path, "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["analyzers"]["weight-similarity"]["matrix"]["value"] is None
    assert -1 <= report["analyzers"]["weight-similarity"]["mean"]["value"] <= 1
    assert_one_line_error(capsys, "diversity", path, "--plot", tmp_path / "d.png", match="nothing to plot")


def test_a_model_file_named_like_mathtext_is_drawn_literally(finished_run, tmp_path, capsys):
    """The file name goes into the heatmap's title: a '$' in it is a dollar sign, not a mathtext error."""
    import shutil

    from .cli import run_cli
    model = tmp_path / "$\\x$.safetensors"
    shutil.copy(finished_run / "batch-ensemble" / "seed-1" / "model.safetensors", model)
    code, _, err = run_cli(capsys, "diversity", model, "--no-geometry", "--plot", tmp_path / "heat.png")
    assert code == 0, err
    assert (tmp_path / "heat.png").read_bytes().startswith(b"\x89PNG")
