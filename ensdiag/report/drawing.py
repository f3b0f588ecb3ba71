"""Drawing a report's figures, several at once where the machine has the cores.

Each figure is independent of the others and matplotlib's Agg rendering holds the interpreter
(threads would take turns), so the figures a report has to draw are spread over forked worker
processes (`ensdiag/forked.py`: the jobs are never pickled; one figure, one core or a platform
whose `fork` is not safe draws them in the report's own process, and so does any job a worker
could not finish because the worker died). Either way every figure is drawn, and the first
failure, in the order given, is raised after: a figure whose inputs are not
of the layout it expects raises its `damaged` error (the run file that held them).
"""

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from .. import forked
from ..errors import EnsdiagError
from .figures import save_figure

MAX_WORKERS = 4  # beyond this the figures' sizes, not the cores, decide the time
LAYOUT_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)


@dataclass
class Job:
    name: str  # the file stem under figures/
    draw: object  # draw(*inputs) -> matplotlib Figure
    inputs: tuple
    damaged: object = None  # () -> the EnsdiagError naming the run file whose layout was wrong, or None


class _LayoutError(Exception):
    """A figure's inputs were not of the layout its drawing expects (the original error's text)."""


def _draw(job: Job, folder: Path, formats) -> None:
    try:
        figure = job.draw(*job.inputs)
    except EnsdiagError:
        raise
    except LAYOUT_ERRORS as error:
        raise _LayoutError(f"{type(error).__name__}: {error}") from None
    save_figure(figure, folder / job.name, formats=formats)


def draw_all(jobs: list[Job], folder: Path, formats, done) -> None:
    """Draw every job into `folder` in each of `formats`; `done(job)` after each one's files are
    written. Every job is drawn; then the first failure, in the order given, is raised: for a layout
    error, the job's damaged-file error where it has one."""
    workers = forked.workers(len(jobs), MAX_WORKERS)
    if workers > 1:  # imported once here, before the fork, not once in every worker (a third of a second each)
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    outcomes = forked.run([partial(_draw, job, folder, formats) for job in jobs], workers,
                          each=lambda index, outcome: done(jobs[index]) if outcome[0] else None)
    job, error = next(((job, error) for job, (ok, error) in zip(jobs, outcomes) if not ok), (None, None))
    if isinstance(error, _LayoutError):
        error = job.damaged() if job.damaged is not None else TypeError(str(error))
    if error is not None:
        raise error from None
