"""Training progress on stderr: rich bars in a terminal, plain lines otherwise, nothing with --quiet.

Times left are estimated from what this grid has measured, not from rich's sliding window
(which shows nothing once a run takes longer than its window):
- the run: its mean epoch so far × the epochs left, plus its analysis after training (the mean
  of the runs analysed so far); with early stopping that is an upper bound ("≤"), since most runs
  stop well before their last epoch; while it is analysed, the mean analysis less the time spent;
- the grid: the current run's time left plus the mean cost of the runs finished so far × the
  runs after it (before the first run ends, the current run's bound for each).
An estimate that is passed is never shown as 0:00:00: the line says how long the step has been
running instead, and the grid's time counts the runs after it only ("+").
The bars are transient: when the grid ends they leave the screen, and the lines printed per
run stay. `stage` names a step that shows no epochs (predicting and analysing after training).
"""

import sys
import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn


def clock(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class TrainProgress:
    def __init__(self, total_runs: int, quiet: bool = False, early_stopping: bool = False, console=None):
        self.quiet, self.total_runs, self.done_runs = quiet, total_runs, 0
        self.early_stopping = early_stopping
        self.console = console or Console(stderr=True)
        self.live = not quiet and (self.console.is_terminal if console is not None else sys.stderr.isatty())
        self.bar, self.run_seconds, self.epoch_seconds, self.epochs_total = None, [], [], 0
        self.stage_seconds, self.stage_started = [], None  # each finished run's analysis; when the current one began
        self.name, self.started = "", time.perf_counter()
        if self.live:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), TextColumn("{task.fields[left]}"),
                                console=self.console, transient=True)
            self.grid = self.bar.add_task("grid", total=total_runs, status="", left="")
            self.epochs = self.bar.add_task("epochs", total=1, status="", left="")
            self.bar.start()

    def message(self, text: str):
        if not self.quiet:
            self.console.print(text, markup=False, highlight=False)

    def run_left(self) -> float | None:
        """Seconds the current run still needs: its epochs left at its mean epoch (an upper bound with
        early stopping) and its analysis; while analysed, the mean analysis less the time spent on it
        (None where that is passed or nothing is measured yet)."""
        analysis = sum(self.stage_seconds) / len(self.stage_seconds) if self.stage_seconds else None
        if self.stage_started is not None:
            if analysis is None:
                return None
            left = analysis - (time.perf_counter() - self.stage_started)
            return left if left > 0 else None
        if not self.epoch_seconds:
            return None
        epochs = sum(self.epoch_seconds) / len(self.epoch_seconds) * max(0, self.epochs_total - self.epochs_done)
        return epochs + (analysis or 0.0)

    def grid_left(self) -> float | None:
        """Seconds the grid still needs: the current run's time left plus the runs after it (each at the
        mean of the runs finished, or at the current run's bound before any finished)."""
        spent = time.perf_counter() - self.started
        after = self.total_runs - self.done_runs - 1
        current = self.run_left()
        if self.run_seconds:
            mean = sum(self.run_seconds) / len(self.run_seconds)
            if current is None and self.stage_started is None and mean > spent:  # no epoch measured yet: a typical run
                current = mean - spent
            return (current if current is not None else 0.0) + mean * after
        return None if current is None else current + (spent + current) * after

    def _show(self):
        if self.bar is None:
            return
        bound = "≤ " if self.early_stopping and self.stage_started is None else "~"
        run_left, grid_left = self.run_left(), self.grid_left()
        if run_left is None and self.stage_started is not None:  # past its estimate: how long it has been running
            run_text = f"analysing for {clock(time.perf_counter() - self.stage_started)}"
        else:
            run_text = f"{bound}{clock(run_left)}" if run_left is not None else ""
        self.bar.update(self.epochs, left=run_text)
        if run_left is None and self.stage_started is not None:  # the grid's time: the runs after this one only
            after = self.total_runs - self.done_runs - 1
            grid_text = f"then ~{clock(grid_left)} for the rest of the grid" if after and grid_left else "last run"
        else:
            grid_text = f"grid {bound if not self.run_seconds else '~'}{clock(grid_left)}" if grid_left is not None else ""
        self.bar.update(self.grid, left=grid_text)

    def start_run(self, run: str, seed: int, epochs: int, resumed_at: int = 0):
        self.name, self.started, self.stage_started = f"{run} seed {seed}", time.perf_counter(), None
        self.epoch_seconds, self.epochs_total, self.epochs_done = [], epochs, resumed_at
        if self.bar is not None:
            self.bar.reset(self.epochs, total=epochs, completed=resumed_at, description=f"{self.name}", status="", left="")
            self.bar.update(self.grid, description=f"run {self.done_runs + 1}/{self.total_runs}")
            self._show()
        elif resumed_at:
            self.message(f"[{self.done_runs + 1}/{self.total_runs}] {self.name}: resuming after epoch {resumed_at}")

    def epoch(self, row: dict, epochs: int):
        self.epochs_done = row["epoch"]
        if isinstance(row.get("seconds"), (int, float)):
            self.epoch_seconds.append(row["seconds"])
        status = f"loss {row['loss']:.3f} acc {row['accuracy']:.3f}"
        if row["val_accuracy"] is not None:
            status += f" val {row['val_accuracy']:.3f}"
        if self.bar is not None:
            self.bar.update(self.epochs, completed=row["epoch"], status=status)
            self._show()
        elif not self.quiet and (row["epoch"] == epochs or row["epoch"] % 10 == 0):
            self.message(f"[{self.done_runs + 1}/{self.total_runs}] {self.name} epoch {row['epoch']}/{epochs}: {status}")

    def stage(self, text: str):
        """The current run's analysis after training (predicting and analysing): no epochs to count,
        its time left from the runs analysed before."""
        self.stage_started = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.epochs, status=text)
            self._show()

    def end_run(self, summary: str):
        self.done_runs += 1
        self.run_seconds.append(time.perf_counter() - self.started)
        if self.stage_started is not None:
            self.stage_seconds.append(time.perf_counter() - self.stage_started)
            self.stage_started = None
        if self.bar is not None:
            self.bar.update(self.grid, completed=self.done_runs)
            self._show()
        self.message(f"[{self.done_runs}/{self.total_runs}] {self.name}: {summary} ({time.perf_counter() - self.started:.1f} s)")

    def skip_run(self, run: str, seed: int):
        self.done_runs += 1
        if self.bar is not None:
            self.bar.update(self.grid, completed=self.done_runs)
        self.message(f"[{self.done_runs}/{self.total_runs}] {run} seed {seed}: already finished, kept")

    def close(self):
        if self.bar is not None:
            self.bar.stop()  # transient: the bars leave the screen, nothing stale stays



@contextmanager
def step_bar(description: str, console=None):
    """A transient bar on stderr for a long step of known length, given as a callback
    `advance(done, total)`; nothing where stderr is not a terminal (logs and pipes get no bar)."""
    shown = console or Console(stderr=True)
    if not shown.is_terminal:
        yield lambda done, total: None
        return
    with Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), console=shown, transient=True) as progress:
        task = progress.add_task(description, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)
