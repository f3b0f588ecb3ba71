"""Drawing a report's figures, several at once where the machine has the cores.

Each figure is independent of the others and matplotlib's Agg rendering holds the interpreter
(threads would take turns), so the figures a report has to draw are spread over forked worker
processes: they inherit the report's modules and inputs, draw, write their files atomically and
return. One figure, one core, or a platform whose `fork` is not safe (macOS, Windows) draws
them in the report's own process, in order. Errors come back as the exceptions they were; a
figure whose inputs are not of the layout it expects raises its `damaged` error (the run file
that held them), as drawing it in process would.
"""

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsdiagError
from .figures import save_figure

MAX_WORKERS = 4  # beyond this the figures' sizes, not the cores, decide the time
LAYOUT_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)


@dataclass
class Job:
    name: str  # the file stem under figures/
    draw: object  # a module-level function: draw(*inputs) -> matplotlib Figure
    inputs: tuple
    damaged: object = None  # () -> the EnsdiagError naming the run file whose layout was wrong, or None


def _draw(draw, inputs, path: Path, formats) -> None:
    save_figure(draw(*inputs), path, formats=formats)


def _workers(jobs: list) -> int:
    if sys.platform != "linux" or len(jobs) < 2:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, len(jobs), MAX_WORKERS))


def _raised(job: Job, error: Exception) -> Exception:
    """What a failed figure raises: its damaged-file error for a layout error where it has one."""
    if job.damaged is not None and isinstance(error, LAYOUT_ERRORS) and not isinstance(error, EnsdiagError):
        return job.damaged()
    return error


def draw_all(jobs: list[Job], folder: Path, formats, done) -> None:
    """Draw every job into `folder` in each of `formats`; `done(job)` after each one's files are
    written (in the order given). The first failure, in that order, is raised."""
    workers = _workers(jobs)
    if workers == 1:
        for job in jobs:
            try:
                _draw(job.draw, job.inputs, folder / job.name, formats)
            except Exception as error:
                raised = _raised(job, error)
                if raised is error:
                    raise
                raise raised from None
            done(job)
        return
    import matplotlib.backends.backend_agg  # noqa: F401  (imported once here, inherited by every worker)
    import matplotlib.figure  # noqa: F401
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_draw, job.draw, job.inputs, folder / job.name, formats) for job in jobs]
        failed = None
        for job, future in zip(jobs, futures):
            error = future.exception()
            if error is None:
                done(job)
            elif failed is None:
                failed = (job, error)
    if failed is not None:
        job, error = failed
        raised = _raised(job, error)
        if raised is error:
            raise error
        raise raised from None
