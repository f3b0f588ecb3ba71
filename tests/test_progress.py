"""Training progress: times left from what the grid measured (early stopping makes the run's an
upper bound), a named step after the epochs, and bars that leave the screen when done."""

import io

import pytest
from rich.console import Console

from ensdiag.progress import TrainProgress, clock


def _row(epoch, seconds=2.0):
    return {"epoch": epoch, "loss": 0.5, "accuracy": 0.9, "val_accuracy": 0.8, "seconds": seconds}


def test_the_run_and_grid_estimates_come_from_measured_epochs_and_runs(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("ensdiag.progress.time.perf_counter", lambda: now[0])
    progress = TrainProgress(3, quiet=True, early_stopping=True)
    progress.start_run("deep-ensemble", 1, epochs=10)
    for epoch in (1, 2):
        now[0] += 2.0
        progress.epoch(_row(epoch), 10)
    assert progress.run_left() == pytest.approx(16.0)  # 8 epochs left at 2 s each: an upper bound
    assert progress.grid_left() == pytest.approx(16.0 + (4.0 + 16.0) * 2)  # no run finished yet: the bound for all
    progress.stage("predicting and analysing …")
    now[0] += 3.0
    progress.end_run("done")  # the run stopped early after 4 s of training and 3 s of analysis
    progress.start_run("deep-ensemble", 2, epochs=10)
    now[0] += 1.0
    assert progress.grid_left() == pytest.approx((7.0 - 1.0) + 7.0 * 1)  # measured runs, not the bound
    now[0] += 2.0
    progress.epoch(_row(1), 10)
    assert progress.run_left() == pytest.approx(9 * 2.0 + 3.0)  # its epochs left and an analysis like the last one's
    progress.stage("predicting and analysing …")
    now[0] += 1.0
    assert progress.run_left() == pytest.approx(2.0)  # the analysis is under way
    now[0] += 5.0  # longer than the one before: no false 0:00:00
    assert progress.run_left() is None and progress.grid_left() == pytest.approx(7.0 * 1)


def test_a_passed_estimate_shows_how_long_the_step_has_run_not_zero(monkeypatch):
    import io

    from rich.console import Console
    now = [50.0]
    monkeypatch.setattr("ensdiag.progress.time.perf_counter", lambda: now[0])
    screen = io.StringIO()
    progress = TrainProgress(2, early_stopping=True, console=Console(file=screen, force_terminal=True, width=150))
    progress.start_run("single", 1, epochs=2)
    now[0] += 1.0
    progress.epoch(_row(1), 2)
    progress.stage("predicting and analysing …")
    now[0] += 1.0
    progress.end_run("done")
    progress.start_run("single", 2, epochs=2)
    progress.stage("predicting and analysing …")
    now[0] += 75.0
    progress._show()
    fields = progress.bar.tasks[progress.epochs].fields
    assert fields["left"] == "analysing for 0:01:15" and progress.bar.tasks[progress.grid].fields["left"] == "last run"
    progress.close()


def test_bars_are_transient_and_a_stage_is_named():
    screen = io.StringIO()
    progress = TrainProgress(1, console=Console(file=screen, force_terminal=True, width=100))
    assert progress.bar is not None and progress.bar.live.transient
    progress.start_run("single", 1, epochs=3)
    progress.epoch(_row(1), 3)
    progress.stage("predicting and analysing …")
    assert progress.bar.tasks[1].fields["status"] == "predicting and analysing …"
    progress.end_run("test accuracy 0.950")
    progress.close()
    assert "single seed 1: test accuracy 0.950" in screen.getvalue()


def test_clock():
    assert clock(3725.4) == "1:02:05" and clock(None) == "" and clock(-3) == "0:00:00"


def test_diversity_names_each_slow_step_on_a_terminal(finished_run, monkeypatch, capsys):
    """Predicting and every member-geometry step show a transient status line (paths on a
    ResNet-18 take minutes on a CPU); the results are those of one call of every analyzer."""
    import io

    from rich.console import Console

    from ensdiag import console as cli
    from ensdiag.analysis.registry import ANALYZERS

    from .cli import run_cli
    screen = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=screen, force_terminal=True, width=200))
    code, out, err = run_cli(capsys, "diversity", finished_run / "batch-ensemble" / "seed-1" / "model.safetensors",
                             "--format", "json")
    assert code == 0, err
    shown = screen.getvalue()
    assert "predicting every split" in shown
    for name, analyzer in ANALYZERS.items():
        if analyzer.needs == "model":
            assert f"member geometry: {analyzer.description}" in shown, name
    import json
    analyzers = json.loads(out)["analyzers"]
    assert [name for name in analyzers if ANALYZERS[name].needs == "model"] == [name for name, a in ANALYZERS.items() if a.needs == "model"]
