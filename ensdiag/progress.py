"""Training progress on stderr: rich bars in a terminal, plain lines otherwise, nothing with --quiet."""

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainProgress:
    def __init__(self, total_runs: int, quiet: bool = False):
        self.quiet, self.total_runs, self.done_runs = quiet, total_runs, 0
        self.console = Console(stderr=True)
        self.live = not quiet and sys.stderr.isatty()
        self.bar = None
        if self.live:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=self.console)
            self.grid = self.bar.add_task("grid", total=total_runs, status="")
            self.epochs = self.bar.add_task("epochs", total=1, status="")
            self.bar.start()

    def message(self, text: str):
        if not self.quiet:
            self.console.print(text, markup=False, highlight=False)

    def start_run(self, run: str, seed: int, epochs: int, resumed_at: int = 0):
        self.name, self.started = f"{run} seed {seed}", time.perf_counter()
        if self.bar is not None:
            self.bar.reset(self.epochs, total=epochs, completed=resumed_at,
                           description=f"{self.name}", status="")
            self.bar.update(self.grid, description=f"run {self.done_runs + 1}/{self.total_runs}")
        elif resumed_at:
            self.message(f"[{self.done_runs + 1}/{self.total_runs}] {self.name}: resuming after epoch {resumed_at}")

    def epoch(self, row: dict, epochs: int):
        status = f"loss {row['loss']:.3f} acc {row['accuracy']:.3f}"
        if row["val_accuracy"] is not None:
            status += f" val {row['val_accuracy']:.3f}"
        if self.bar is not None:
            self.bar.update(self.epochs, completed=row["epoch"], status=status)
        elif not self.quiet and (row["epoch"] == epochs or row["epoch"] % 10 == 0):
            self.message(f"[{self.done_runs + 1}/{self.total_runs}] {self.name} epoch {row['epoch']}/{epochs}: {status}")

    def end_run(self, summary: str):
        self.done_runs += 1
        if self.bar is not None:
            self.bar.update(self.grid, completed=self.done_runs)
        self.message(f"[{self.done_runs}/{self.total_runs}] {self.name}: {summary} ({time.perf_counter() - self.started:.1f} s)")

    def skip_run(self, run: str, seed: int):
        self.done_runs += 1
        if self.bar is not None:
            self.bar.update(self.grid, completed=self.done_runs)
        self.message(f"[{self.done_runs}/{self.total_runs}] {run} seed {seed}: already finished, kept")

    def close(self):
        if self.bar is not None:
            self.bar.stop()
