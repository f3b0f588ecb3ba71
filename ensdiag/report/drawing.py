"""Drawing a report's figures, several at once where the machine has the cores.

Each figure is independent of the others and matplotlib's Agg rendering holds the interpreter
(threads would take turns), so the figures a report has to draw are spread over forked worker
processes. The jobs are never pickled: they sit in `_JOBS` when the workers are forked, and a
worker is told only which one to draw. A worker ignores Ctrl-C (the report stops them) and
writes to its own copies of stdout and stderr (a lock another thread of the report held at the
fork, a spinner's, must not hang it). One figure, one core, a process that may not have children,
or a platform whose `fork` is not safe (macOS, Windows) draws them in the report's own process;
so does any job a worker could not finish because the worker died. Either way every figure is
drawn, and the first failure, in the order given, is raised after: a figure whose inputs are not
of the layout it expects raises its `damaged` error (the run file that held them).
"""

import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsdiagError
from .figures import save_figure

MAX_WORKERS = 4  # beyond this the figures' sizes, not the cores, decide the time
LAYOUT_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)
_JOBS: list = []  # what the forked workers draw from: (job, folder, formats)


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


def _draw_forked(index: int) -> None:
    _draw(*_JOBS[index])


def _worker_start() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.dup(2), "w", buffering=1)


def _workers(jobs: list) -> int:
    if sys.platform != "linux" or len(jobs) < 2 or multiprocessing.current_process().daemon:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, len(jobs), MAX_WORKERS))


def _raised(job: Job, error: BaseException) -> BaseException:
    """What a failed figure raises: its damaged-file error for a layout error where it has one."""
    if isinstance(error, _LayoutError):
        return job.damaged() if job.damaged is not None else TypeError(str(error))
    return error


def _in_process(jobs: list[Job], folder: Path, formats, done) -> dict:
    failed = {}
    for index, job in enumerate(jobs):
        try:
            _draw(job, folder, formats)
        except Exception as error:
            failed[index] = error
            continue
        done(job)
    return failed


def _forked(jobs: list[Job], folder: Path, formats, done, workers: int) -> dict:
    """{index: error} of the jobs that failed. A job no worker finished (a worker died, or none
    could be forked) is drawn here."""
    _JOBS[:] = [(job, folder, formats) for job in jobs]
    # imported once here, before the fork, not once in every worker (a third of a second each)
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    failed, drawn = {}, []
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                 initializer=_worker_start) as pool:
            try:
                futures = [pool.submit(_draw_forked, index) for index in range(len(jobs))]
                for index, future in enumerate(futures):
                    try:
                        future.result()
                    except BrokenProcessPool:
                        continue  # drawn here, below
                    except Exception as error:
                        failed[index] = error
                    else:
                        drawn.append(index)
            except BaseException:  # Ctrl-C: stop at once; the figures being drawn finish in their workers
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    except OSError:  # no worker could be forked: drawn here, below
        pass
    finally:
        _JOBS.clear()
    for index in drawn:
        done(jobs[index])
    left = [index for index in range(len(jobs)) if index not in failed and index not in drawn]
    failed.update({left[i]: error for i, error in _in_process([jobs[index] for index in left], folder, formats, done).items()})
    return failed


def draw_all(jobs: list[Job], folder: Path, formats, done) -> None:
    """Draw every job into `folder` in each of `formats`; `done(job)` after each one's files are
    written. Every job is drawn; then the first failure, in the order given, is raised."""
    workers = _workers(jobs)
    failed = _in_process(jobs, folder, formats, done) if workers == 1 else _forked(jobs, folder, formats, done, workers)
    if failed:
        index = min(failed)
        error = _raised(jobs[index], failed[index])
        raise error from None
