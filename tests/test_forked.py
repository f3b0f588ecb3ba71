"""ensdiag/forked.py: tasks in forked workers give the outcomes of running them here, in order; a run that
stops at the first failure runs nothing after it (its workers are ended, not waited for); workers hold
their share of the memory budget, fork nothing themselves, and nothing is forked where CUDA is initialised."""

import sys
import time

import pytest
import torch

from ensdiag import budget, forked

from .test_report import run_dir  # noqa: F401 (the fixture)

forks = pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")


def _fails():
    raise ArithmeticError("task 1")


@pytest.mark.parametrize("processes", [pytest.param(2, marks=forks), 1])
def test_outcomes_in_order_and_each_as_it_is_known(processes):
    seen = []
    outcomes = forked.run([lambda: 1, _fails, lambda: 3], processes, each=lambda index, outcome: seen.append(index))
    assert [ok for ok, _ in outcomes] == [True, False, True] and outcomes[0][1] == 1 and outcomes[2][1] == 3
    assert isinstance(outcomes[1][1], ArithmeticError) and seen == [0, 1, 2]


@pytest.mark.parametrize("processes", [pytest.param(2, marks=forks), 1])
def test_a_run_that_stops_runs_nothing_after_the_first_failure(processes, tmp_path):
    marker = tmp_path / "ran"

    def slow():
        time.sleep(1.5)
        marker.write_text("ran")
    outcomes = forked.run([_fails, slow, slow], processes, stop=True)
    assert len(outcomes) == 1 and not outcomes[0][0]
    time.sleep(2.5 if processes > 1 else 0)  # a worker not ended would have written the marker by now
    assert not marker.exists()


@forks
def test_a_worker_holds_its_share_of_the_budget_and_forks_nothing(monkeypatch):
    monkeypatch.setenv(budget.VARIABLE, "1G")
    found = forked.run([lambda: (budget.memory_budget(), forked.workers(8)) for _ in range(3)], 2)
    assert found == [(True, (2**30 // 2, 1))] * 3
    assert budget.memory_budget() == 2**30  # the caller's own is whole
    assert "shared by 2 worker processes" in forked.run([lambda: budget.over_budget(2**30, "x"), lambda: None], 2)[0][1]


def test_nothing_is_forked_where_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(forked.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(forked.sys, "platform", "linux")
    assert forked.workers(8) == 4 and forked.workers(1) == 1
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert forked.workers(8) == 1


SLEEPERS = """
import os, sys, time
from ensdiag import forked

def sleeper():
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    time.sleep(60)
forked.run([sleeper, sleeper], 2)
"""


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _waited(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@forks
@pytest.mark.parametrize("ending", ["SIGTERM", "SIGHUP", "SIGKILL", "SIGINT"])
def test_workers_end_with_their_caller_however_it_ends(tmp_path, ending):
    import os
    import signal
    import subprocess
    caller = subprocess.Popen([sys.executable, "-c", SLEEPERS, str(tmp_path)], stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        assert _waited(lambda: len(list(tmp_path.iterdir())) == 2, 60), "the workers did not start"
        workers = [int(path.name) for path in tmp_path.iterdir()]
        caller.send_signal(getattr(signal, ending))
        caller.wait(10)
        assert _waited(lambda: not any(map(_alive, workers)), 5), f"workers alive 5 s after {ending}"
    finally:
        caller.kill()
        caller.wait()


AT_FORK = """
import os, signal, sys
os.register_at_fork(before=lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C just as a worker is forked
from ensdiag import forked
try:
    forked.run([lambda: 1, lambda: 2], 2)
except KeyboardInterrupt:
    sys.exit(130)
"""


@forks
def test_a_ctrl_c_as_workers_are_forked_is_never_lost():
    import subprocess
    done = subprocess.run([sys.executable, "-c", AT_FORK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and "Traceback" not in done.stderr and "ignored" not in done.stderr, done.stderr


CLI_AT_FORK = AT_FORK.replace("""from ensdiag import forked
try:
    forked.run([lambda: 1, lambda: 2], 2)
except KeyboardInterrupt:
    sys.exit(130)
""", """from ensdiag.entry import main
main(sys.argv[1:])
""")


@forks
@pytest.mark.skipif(forked.workers(8) < 2, reason="forks workers only where there are two cores")
@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_ctrl_c_as_a_command_forks_its_workers_ends_it_with_130(command, tmp_path, run_dir):  # noqa: F811
    import subprocess

    import numpy as np
    if command == "analyze":  # 4 × 25,000 member-examples: its analyzers run in workers
        np.save(tmp_path / "logits.npy", np.random.default_rng(0).normal(size=(4, 25_000, 10)).astype(np.float32))
        np.save(tmp_path / "labels.npy", np.arange(25_000) % 10)
        args = ["analyze", tmp_path / "logits.npy", "--labels", tmp_path / "labels.npy"]
    else:  # its figures are drawn in workers
        args = ["report", run_dir]
    done = subprocess.run([sys.executable, "-c", CLI_AT_FORK, *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 130 and "Traceback" not in done.stderr and "ignored" not in done.stderr, done.stderr
    assert done.stdout == "" or command == "report"
