"""A report's figures drawn across worker processes are the figures drawn in the report's own process,
and a figure that fails there fails as it would here (report/__init__.py, ensdiag/forked.py)."""

import multiprocessing
import os
import sys

import pytest

from ensdiag import forked
from ensdiag.errors import EnsdiagError

from ensdiag.report import Job, draw_all
from ensdiag.report.figures import heatmap_grid, training_curves_figure

forks = pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")
ROWS = [("deep ensemble", [("disagreement: id", [[0.0, 0.2], [0.2, 0.0]], "disagreement"),
                           ("weight cosine", [[1.0, 0.1], [0.1, 1.0]], "cosine")])]
HISTORY = {"single": [[{"epoch": 1, "loss": 1.0, "val_accuracy": 0.5}, {"epoch": 2, "loss": 0.5, "val_accuracy": 0.7}]]}


def _jobs():
    return [Job("diversity", heatmap_grid, (ROWS,)), Job("training", training_curves_figure, (HISTORY,)),
            Job("other", lambda rows: heatmap_grid(rows[:1]), (ROWS,))]  # a closure: jobs are never pickled


def _draw(folder, workers, jobs, monkeypatch):
    folder.mkdir()
    monkeypatch.setattr(forked, "workers", lambda tasks, most=4: workers)
    done = []
    draw_all(jobs, folder, ("png", "svg"), lambda job: done.append(job.name))
    return done


@forks
@pytest.mark.parametrize("workers", [2, 3])
def test_figures_drawn_by_workers_are_the_png_bytes_drawn_in_process(tmp_path, monkeypatch, workers):
    there = _draw(tmp_path / "there", workers, _jobs(), monkeypatch)  # workers first: forked from a fresh process
    here = _draw(tmp_path / "here", 1, _jobs(), monkeypatch)
    assert sorted(here) == sorted(there) == ["diversity", "other", "training"]
    names = sorted(path.name for path in (tmp_path / "here").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "there").iterdir()) and len(names) == 6
    for name in names:
        if name.endswith(".png"):  # (an SVG's ids carry a random salt)
            assert (tmp_path / "here" / name).read_bytes() == (tmp_path / "there" / name).read_bytes(), name


def _dies_in_a_worker(rows):
    if multiprocessing.current_process().name != "MainProcess":
        os._exit(1)
    return heatmap_grid(rows)


@forks
def test_a_figure_whose_worker_dies_is_drawn_in_process(tmp_path, monkeypatch):
    jobs = [Job("dies", _dies_in_a_worker, (ROWS,)), *_jobs()]
    done = _draw(tmp_path / "figures", 2, jobs, monkeypatch)
    assert sorted(done) == ["dies", "diversity", "other", "training"]
    assert all((tmp_path / "figures" / f"{job.name}.png").is_file() for job in jobs)


@pytest.mark.parametrize("workers", [pytest.param(2, marks=forks), 1])
def test_a_figure_that_fails_fails_as_it_would_in_process_after_the_others_are_drawn(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(forked, "workers", lambda tasks, most=4: workers)
    damaged = lambda: EnsdiagError("runs/x/metrics.json is damaged (its paths result is not of the expected layout)")  # noqa: E731
    done = []
    with pytest.raises(EnsdiagError, match="metrics.json is damaged"):  # the broken one first: the rest still drawn
        draw_all([Job("broken", heatmap_grid, ("not rows",), damaged=damaged), *_jobs()], tmp_path, ("png",),
                 lambda job: done.append(job.name))
    assert sorted(done) == ["diversity", "other", "training"] and not (tmp_path / "broken.png").exists()
    (tmp_path / "taken").mkdir()  # an error of ensdiag's own is raised as it is, never as a damaged file
    with pytest.raises(EnsdiagError, match="is a directory"):
        draw_all([Job("taken", heatmap_grid, (ROWS,), damaged=damaged), *_jobs()], tmp_path, ("png",), lambda job: None)


def test_a_daemonic_process_draws_in_process(monkeypatch):
    """A report made inside a multiprocessing pool's worker (which may have no children) draws in process."""
    class Daemonic:
        daemon = True
    monkeypatch.setattr(multiprocessing, "current_process", lambda: Daemonic())
    assert forked.workers(len(_jobs())) == 1
