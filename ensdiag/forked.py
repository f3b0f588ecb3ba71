"""Independent pieces of work spread over forked worker processes, where the machine has the cores.

    outcomes = forked.run(tasks, forked.workers(len(tasks)))   # [(True, result) | (False, exception)], in order

Pure-Python work (drawing a figure, parsing a file of JSON lines) holds the interpreter, so threads
would take turns. The tasks (zero-argument callables) are never pickled: they sit in `_TASKS` when
the workers are forked, and a worker is told only which one to run; only results and exceptions
come back pickled. A worker ignores Ctrl-C (the caller stops them) and writes to its own copies of
stdout and stderr (a lock another thread held at the fork, a spinner's, must not hang it), and
computes with one torch thread (GNU OpenMP hangs a child that uses the threads its parent
started). One
task, one core, a process that may not have children, or a platform whose `fork` is not safe
(macOS, Windows) runs them in this process; so does any task a worker could not finish because
the worker died, or every task where no worker could be forked. Either way every task runs once
to an outcome.
"""

import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

_TASKS: list = []  # what the forked workers run


def workers(tasks: int, most: int = 4) -> int:
    """How many worker processes `tasks` independent tasks get here (1: run them in this process)."""
    if sys.platform != "linux" or tasks < 2 or multiprocessing.current_process().daemon:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, tasks, most))


def _start() -> None:
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


def run(tasks: list, processes: int) -> list[tuple[bool, object]]:
    """[(True, result) or (False, the exception it raised)] of every task, in the order given."""
    if processes <= 1:
        return [_outcome(task) for task in tasks]
    _TASKS[:] = tasks
    outcomes: dict = {}
    try:
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"), initializer=_start) as pool:
            try:
                futures = [pool.submit(_run_forked, index) for index in range(len(tasks))]
                for index, future in enumerate(futures):
                    try:
                        outcomes[index] = True, future.result()
                    except BrokenProcessPool:
                        continue  # run here, below
                    except Exception as error:
                        outcomes[index] = False, error
            except BaseException:  # Ctrl-C: stop at once; the tasks under way finish in their workers
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    except OSError:  # no worker could be forked: run here, below
        pass
    finally:
        _TASKS.clear()
    return [outcomes[index] if index in outcomes else _outcome(task) for index, task in enumerate(tasks)]
