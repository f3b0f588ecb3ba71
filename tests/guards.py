"""Guards for tests of inputs that could hang: a FIFO opened for reading waits for a writer for
ever, a folder link to `.` or /proc can be walked without end. Under `deadline` such a wait fails
the test after a few seconds instead of stalling the suite (SIGALRM interrupts a blocking open()
as well as Python code; main thread, Unix)."""

import os
import signal
from contextlib import contextmanager

import pytest


class Hung(BaseException):
    """The code under test was still running at its deadline (a BaseException: no `except Exception`
    in the code under test can swallow it)."""


@contextmanager
def deadline(seconds: float = 10.0):
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs SIGALRM (Unix)")

    def expired(*_):
        raise Hung(f"still running after {seconds:g} s: it waits on a FIFO or walks without end")

    handler = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)


def fifo(path):
    """A named pipe at `path` (skips where the platform has none)."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    os.mkfifo(path)
    return path
