"""Independent pieces of work spread over forked worker processes, where the machine has the cores.

    outcomes = forked.run(tasks, forked.workers(len(tasks)))   # [(True, result) | (False, exception)], in order

Pure-Python work (drawing a figure, parsing a file of JSON lines) holds the interpreter, so threads
would take turns. The tasks (zero-argument callables) are never pickled: they sit in `_TASKS` when
the workers are forked, and a worker is told only which one to run; only results and exceptions
come back pickled. A worker ignores Ctrl-C (the caller's Ctrl-C ends the workers at once), writes to
its own copies of stdout and stderr (a lock another thread held at the fork, a spinner's, must not
hang it), computes with one torch thread (GNU OpenMP hangs a child that uses the threads its parent
started), holds its share of the memory budget (budget.py), and forks no workers of its own. One
task, one core, a process that may not have children, CUDA initialised (a forked child may not touch
it), or a platform whose `fork` is not safe (macOS, Windows) runs them in this process; so does any
task a worker could not finish because the worker died, or every task where no worker could be
forked. `stop`: the first failure, in order, ends the run (the later tasks are not run, or their
workers are ended); else every task runs once to an outcome.
"""

import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from . import budget
from .threads import cpus

_TASKS: list = []  # what the forked workers run
_IN_WORKER = False


def workers(tasks: int, most: int = 4) -> int:
    """How many worker processes `tasks` independent tasks get here (1: run them in this process)."""
    if sys.platform != "linux" or tasks < 2 or _IN_WORKER or multiprocessing.current_process().daemon:
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return 1
    return max(1, min(cpus(), tasks, most))


def _start(processes: int) -> None:
    global _IN_WORKER
    _IN_WORKER = True
    budget.share(processes)
    torch = sys.modules.get("torch")
    if torch is not None:  # GNU OpenMP does not survive a fork after its threads started: a worker computes in one
        torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.dup(2), "w", buffering=1)


def _run_forked(index: int):
    return _TASKS[index]()


def _outcome(task) -> tuple[bool, object]:
    try:
        return True, task()
    except Exception as error:
        return False, error


def _ended(pool: ProcessPoolExecutor) -> None:
    """The pool's workers ended now, whatever they were running (Ctrl-C, or a run that stopped)."""
    running = list((getattr(pool, "_processes", None) or {}).values())  # (shutdown forgets them)
    for process in running:
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def run(tasks: list, processes: int, *, stop: bool = False, each=None) -> list[tuple[bool, object]]:
    """[(True, result) or (False, the exception it raised)] of every task, in the order given (with
    `stop`: up to the first failure); `each(index, outcome)` as each is known, in order."""
    found: list = []

    def known(outcome) -> bool:
        found.append(outcome)
        if each is not None:
            each(len(found) - 1, outcome)
        return stop and not outcome[0]

    if processes <= 1:
        for task in tasks:
            if known(_outcome(task)):
                break
        return found
    _TASKS[:] = tasks
    try:
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"), initializer=_start,
                                 initargs=(processes,)) as pool:
            try:
                futures = [pool.submit(_run_forked, index) for index in range(len(tasks))]
                for index, future in enumerate(futures):
                    try:
                        outcome = True, future.result()
                    except BrokenProcessPool:  # a worker died: this task and the rest run here, below
                        break
                    except Exception as error:
                        outcome = False, error
                    if known(outcome):
                        _ended(pool)
                        return found
            except BaseException:  # Ctrl-C: the workers end at once
                _ended(pool)
                raise
    except OSError:  # no worker could be forked: run here, below
        pass
    finally:
        _TASKS.clear()
    for task in tasks[len(found):]:
        if known(_outcome(task)):
            break
    return found
