"""The predictions analyzers and their intervals run in forked workers give the metrics.json of running them
one after another (ensdiag/core/analyzed.py, ensdiag/forked.py): same entries, same order, same numbers; an
analyzer that raises raises as it would in process; nothing is forked where CUDA is initialised; a worker
computes with one torch thread."""

import json
import sys

import pytest
import torch

from ensdiag import forked
from ensdiag.analysis import register_analyzer
from ensdiag.analysis.registry import ANALYZERS
from ensdiag.core import analyzed as A

forks = pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")


def _predictions(k=4, n=300, classes=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = lambda rows: 2 * torch.randn(k, rows, classes, generator=generator)  # noqa: E731
    labels = lambda rows: torch.randint(0, classes, (rows,), generator=generator)  # noqa: E731
    return {"id": {"logits": logits(n), "labels": labels(n)}, "shift": {"logits": logits(2 * n), "labels": labels(2 * n)},
            "ood": {"logits": logits(n), "labels": None}}


def _run(monkeypatch, forking: bool, predictions, **options):
    monkeypatch.setattr(A, "PARALLEL_EXAMPLES", 0 if forking else 10**12)
    monkeypatch.setattr(forked, "workers", lambda tasks, most=4: 2 if forking else 1)
    ran = []
    real = forked.run
    monkeypatch.setattr(forked, "run", lambda tasks, processes, **options: ran.append(processes) or real(tasks, processes, **options))
    found = json.loads(json.dumps(A.analyzed(predictions, **options), default=str))
    assert ran == ([2] if forking else [])
    return found


@forks
@pytest.mark.parametrize("detail", [False, True])
def test_forked_analyzers_write_the_metrics_of_running_them_in_turn(monkeypatch, detail):
    predictions = _predictions()
    there = _run(monkeypatch, True, predictions, detail=detail)
    here = _run(monkeypatch, False, predictions, detail=detail)
    assert list(there["analyzers"]) == list(here["analyzers"]) and there == here
    assert there["analyzers"]["calibration"]["splits"]["id"]["ece"]["interval"]["low"] is not None
    assert there["intervals"] == here["intervals"]


@forks
def test_an_analyzer_that_raises_in_a_worker_raises_as_in_process(monkeypatch):
    @register_analyzer("zz-broken", description="raises")
    def broken(predictions, weights=None):
        raise ArithmeticError("a bug in a plug-in")
    try:
        for forking in (True, False):
            with pytest.raises(ArithmeticError, match="a bug in a plug-in"):
                _run(monkeypatch, forking, _predictions())
    finally:
        ANALYZERS.pop("zz-broken")


def test_nothing_is_forked_for_small_work_or_tensors_off_the_cpu(monkeypatch):
    predictions = A.without_ood_labels(_predictions())
    monkeypatch.setattr(A, "PARALLEL_EXAMPLES", 0)
    monkeypatch.setattr(forked, "workers", lambda tasks, most=4: 2)  # (CUDA initialised: none, tests/test_forked.py)
    assert A.processes_for(predictions, 12) == 2 and A.processes_for(predictions, 1) == 1 and A.processes_for({}, 12) == 1
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("meta")))
    assert A.processes_for(predictions, 12) == 1
    monkeypatch.undo()
    monkeypatch.setattr(A, "PARALLEL_EXAMPLES", 10**12)
    assert A.processes_for(predictions, 12) == 1


@forks
def test_a_worker_computes_with_one_torch_thread_whatever_its_parent_used(monkeypatch):
    """GNU OpenMP hangs a forked child that uses the threads its parent started: workers use one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.rand(600, 600) @ torch.rand(600, 600)).sum()  # the parent's thread pool started
        outcomes = forked.run([lambda: (torch.get_num_threads(), float((torch.ones(300, 300) @ torch.ones(300, 300)).sum()))
                               for _ in range(3)], 2)
    finally:
        torch.set_num_threads(threads)
    assert outcomes == [(True, (1, 300.0 ** 3))] * 3
