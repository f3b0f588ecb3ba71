"""A report's figures drawn across worker processes are the figures drawn in the report's own process,
and a figure that fails there fails as it would here (report/drawing.py)."""

import pytest

from ensdiag.errors import EnsdiagError
from ensdiag.report import drawing
from ensdiag.report.drawing import Job, draw_all
from ensdiag.report.figures import heatmap_grid, training_curves_figure


def _jobs():
    rows = [("deep ensemble", [("disagreement: id", [[0.0, 0.2], [0.2, 0.0]], "disagreement"),
                               ("weight cosine", [[1.0, 0.1], [0.1, 1.0]], "cosine")])]
    history = {"single": [[{"epoch": 1, "loss": 1.0, "val_accuracy": 0.5},
                           {"epoch": 2, "loss": 0.5, "val_accuracy": 0.7}]]}
    return [Job("diversity", heatmap_grid, (rows,)), Job("training", training_curves_figure, (history,)),
            Job("other", heatmap_grid, (rows[:1],))]


@pytest.mark.parametrize("workers", [2, 3])
def test_figures_drawn_by_workers_are_the_bytes_drawn_in_process(tmp_path, monkeypatch, workers):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    monkeypatch.setattr(drawing, "_workers", lambda jobs: 1)
    drawn_here = []
    draw_all(_jobs(), here, ("png", "svg"), lambda job: drawn_here.append(job.name))
    monkeypatch.setattr(drawing, "_workers", lambda jobs: workers)
    drawn_there = []
    draw_all(_jobs(), there, ("png", "svg"), lambda job: drawn_there.append(job.name))
    assert drawn_here == drawn_there == ["diversity", "training", "other"]
    names = sorted(path.name for path in here.iterdir())
    assert names == sorted(path.name for path in there.iterdir()) and len(names) == 6
    for name in names:
        if name.endswith(".png"):  # SVG carries no clock, but ids may differ between processes
            assert (here / name).read_bytes() == (there / name).read_bytes(), name


@pytest.mark.parametrize("workers", [1, 2])
def test_a_figure_that_fails_in_a_worker_fails_as_it_would_in_process(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(drawing, "_workers", lambda jobs: workers)
    damaged = lambda: EnsdiagError("runs/x/metrics.json is damaged (its paths result is not of the expected layout)")  # noqa: E731
    broken = Job("broken", heatmap_grid, ("not rows",), damaged=damaged)
    done = []
    with pytest.raises(EnsdiagError, match="metrics.json is damaged"):
        draw_all([_jobs()[0], broken], tmp_path, ("png",), lambda job: done.append(job.name))
    assert done == ["diversity"] and (tmp_path / "diversity.png").is_file() and not (tmp_path / "broken.png").exists()
    (tmp_path / "broken").mkdir()  # an error of ensdiag's own is raised as it is, never as a damaged file
    with pytest.raises(EnsdiagError, match="is a directory"):
        draw_all([_jobs()[1], Job("broken", heatmap_grid, _jobs()[0].inputs, damaged=damaged)], tmp_path, ("png",),
                 lambda job: None)
