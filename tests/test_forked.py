"""ensdiag/forked.py: tasks in forked workers give the outcomes of running them here, in order; a run that
stops at the first failure runs nothing after it (its workers are ended, not waited for); workers hold
their share of the memory budget, fork nothing themselves, and nothing is forked where CUDA is initialised."""

import sys
import time

import pytest
import torch

from ensdiag import budget, forked

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
