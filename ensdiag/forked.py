"""Independent pieces of work spread over forked worker processes, where the machine has the cores.

    outcomes = forked.run(tasks, forked.workers(len(tasks)))   # [(True, result) | (False, exception)], in order

Pure-Python work (drawing a figure, parsing a file of JSON lines) holds the interpreter, so threads
would take turns. The tasks (zero-argument callables) are never pickled: they sit in `_TASKS` when
the workers are forked, and a worker is told only which one to run; only results and exceptions
come back pickled. A worker ends with its caller however it ends (Linux's parent-death signal), and a
signal that ends a command is held while the workers are forked and raised after (in an at-fork hook it
would be swallowed). A worker ignores Ctrl-C (the caller's Ctrl-C ends the workers at once), writes to
its own copies of stdout and stderr (a lock another thread held at the fork, a spinner's, must not
hang it), computes with one torch thread (GNU OpenMP hangs a child that uses the threads its parent
started), holds its share of the memory budget (budget.py), and forks no workers of its own. One
task, one core, a process that may not have children, CUDA initialised (a forked child may not touch
it), or a platform whose `fork` is not safe (macOS, Windows) runs them in this process; so does any
task a worker could not finish because the worker died, or every task where no worker could be
forked. `stop`: the first failure, in order, ends the run (the later tasks are not run, or their
workers are ended); else every task runs once to an outcome.
"""

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from . import budget
from .threads import cpus

_TASKS: list = []  # what the forked workers run
_IN_WORKER = False
_HELD: dict = {}  # the caller's handlers of ENDING while it forks (a worker takes them back)
ENDING = (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM))  # the signals that end a command
PR_SET_PDEATHSIG = 1  # Linux's prctl option: the signal a process gets when the thread that forked it ends


def workers(tasks: int, most: int = 4) -> int:
    """How many worker processes `tasks` independent tasks get here (1: run them in this process)."""
    if sys.platform != "linux" or tasks < 2 or _IN_WORKER or multiprocessing.current_process().daemon:
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return 1
    return max(1, min(cpus(), tasks, most))


def _start(processes: int, caller: int) -> None:
    global _IN_WORKER
    _IN_WORKER = True
    with contextlib.suppress(OSError, AttributeError):  # killed with its caller, whatever ends it
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != caller:  # (a caller gone before then)
        os._exit(1)
    budget.share(processes)
    torch = sys.modules.get("torch")
    if torch is not None:  # GNU OpenMP does not survive a fork after its threads started: a worker computes in one
        torch.set_num_threads(1)
    for number, handler in _HELD.items():  # the caller's, as they were before it held them
        signal.signal(number, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.dup(2), "w", buffering=1)


@contextlib.contextmanager
def _held():
    """The signals that end a command noted (Python handles them in the main thread) while the block forks
    the workers, then raised with the caller's handlers back."""
    came, main = [], threading.current_thread() is threading.main_thread()
    _HELD.update({number: signal.signal(number, lambda number, frame: came.append(number)) for number in ENDING
                  if main and signal.getsignal(number) is not None})  # (None: a handler not set from Python)
    try:
        yield
    finally:
        for number, handler in _HELD.items():
            signal.signal(number, handler)
        _HELD.clear()
        for number in dict.fromkeys(came):
            signal.raise_signal(number)


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
    for process in running:  # SIGKILL: one forked while the caller held its signals may not have its own yet
        process.kill()
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
    pool = None
    try:
        with _held():  # (the workers are forked at the first submit)
            pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"), initializer=_start,
                                       initargs=(processes, os.getpid()))
            futures = [pool.submit(_run_forked, index) for index in range(len(tasks))]
        for future in futures:
            try:
                outcome = True, future.result()
            except BrokenProcessPool:  # a worker died: this task and the rest run here, below
                break
            except Exception as error:
                outcome = False, error
            if known(outcome):
                _ended(pool)
                return found
        pool.shutdown()
    except BaseException as error:  # Ctrl-C: the workers end at once; no worker could be forked (OSError): run here
        if pool is not None:
            _ended(pool)
        if not isinstance(error, OSError):
            raise
    finally:
        _TASKS.clear()
    for task in tasks[len(found):]:
        if known(_outcome(task)):
            break
    return found
