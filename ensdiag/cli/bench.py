"""`ensdiag bench`: training, inference and diagnosis throughput, written down as JSON.

Nothing here imports torch before the command runs.
"""

import sys
from pathlib import Path

import typer
from rich.console import Console

from ..console import check_format, note, print_json
from .app import app, csv_list
from .options import THREADS, own_threads


@app.command()
def bench(
    arch: str = typer.Option("mlp", help="mlp (MNIST-sized, 60,000 × 1×28×28) or resnet18 (CIFAR-sized, 50,000 × 3×32×32)."),
    method: str = typer.Option(None, help="Comma list (default: single, mc-dropout, deep-ensemble, batch-ensemble-channel, and -kernel where the architecture has convolutions)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    epochs: int = typer.Option(3, help="Timed rounds, each one epoch of every method (round-robin); the median counts."),
    batches: int = typer.Option(None, help="Time only this many batches per epoch and extrapolate (default: all; 10 for resnet18 on CPU)."),
    train_size: int = typer.Option(None, help="Synthetic training images (default: the protocol's)."),
    test_size: int = typer.Option(None, help="Synthetic images for the inference timing (default 10,000; 1,000 for resnet18 on CPU)."),
    members: int = typer.Option(4, "--members", "-k", help="Ensemble members k."),
    precision: str = typer.Option("auto", help="auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16."),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the model body on the fast path."),
    compile_mode: str = typer.Option("default", help="torch.compile mode (implies --compile): default, reduce-overhead (CUDA graphs on CUDA), max-autotune."),
    reference: bool = typer.Option(True, "--reference/--no-reference", help="Also time the reference pipeline."),
    strategies: bool = typer.Option(False, "--strategies", help="Also time Deep-Ensemble members stacked vs vmap vs loop."),
    tracking: bool = typer.Option(False, "--tracking", help="Also time train --track-diversity's per-epoch row, as a share of the epoch."),
    diagnose: bool = typer.Option(False, "--diagnose", help="Time the diagnosis instead: every analyzer, geometry step and "
                                  "the report, as multiples of one evaluation pass (--epochs: rounds)."),
    path_points: str = typer.Option("11", help="--diagnose: points on each path between members, or 'adaptive'."),
    budget: str = typer.Option(None, "--budget", help="--diagnose: one whole diagnosis within this time (e.g. 5m) instead, "
                               "each step reading what its measured cost affords, beside the estimate on every example "
                               "(default --method deep-ensemble)."),
    precision_target: float = typer.Option(None, "--precision-target", help="--diagnose --budget: also stop a step at "
                                           "this interval half-width."),
    main_job: bool = typer.Option(False, "--main-job", help="Time the README's main job end to end instead: the default "
                                  "grid, its report and diversity --budget 1m of its Deep Ensemble, as separate "
                                  "processes (--epochs: rounds), each run's diagnosis against its own training."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    results_dir: Path = typer.Option(Path("benchmarks/results"), help="Where the JSON record is written."),
    threads: int = THREADS,
):
    """Speed of training, inference and diagnosis, as JSON records.

    Training and inference, ensdiag's fast path against the reference pipeline; with --diagnose,
    every diagnosis step as a multiple of one evaluation pass."""
    from ..bench import BenchSettings, bench_table, default_methods, write_result
    from ..bench import bench as run
    from ..device import resolve_device

    check_format(fmt)
    if (budget is not None or precision_target is not None) and not (diagnose or main_job):
        from ..errors import EnsdiagError
        raise EnsdiagError("--budget and --precision-target time a budgeted diagnosis: give --diagnose too")
    if budget is not None or precision_target is not None:
        from ..quickcheck import parse_precision, parse_seconds
        parse_seconds(budget), parse_precision(precision_target)
    resolved = resolve_device(device)
    own_threads(threads, arch)
    if main_job:
        from ..bench import main_job_table
        from ..bench.main_job import MainJobSettings, run_main_job_bench
        settings = MainJobSettings(rounds=epochs if epochs != 3 else 2, budget=budget or "1m", device=resolved.type)
        return _record(run_main_job_bench, settings, resolved, fmt, results_dir, main_job_table)
    if diagnose and (budget is not None or precision_target is not None):
        from ..bench import budget_table
        from ..bench.budgeted import BudgetSettings, run_budget_bench
        settings = BudgetSettings(arch=arch, device=resolved.type, members=members, budget=budget or "5m",
                                  precision=precision_target,
                                  methods=tuple(csv_list(method, what="--method") or BudgetSettings.methods),
                                  **({"test_size": test_size} if test_size else {}),
                                  **({"train_size": train_size} if train_size else {}))
        return _record(run_budget_bench, settings, resolved, fmt, results_dir, budget_table)
    if diagnose:
        from ..bench import diagnose_table
        from ..bench.diagnose import DiagnoseSettings, run_diagnose_bench
        from ..quickcheck import path_points_option
        # one CPU evaluation pass of 10,000 CIFAR images takes minutes: fewer images, one path pair,
        # no warm-up, one round; the JSON's estimate scales the steps to the protocol's sizes
        small = arch == "resnet18" and resolved.type == "cpu"
        settings = DiagnoseSettings(arch=arch, device=resolved.type, members=members,
                                    methods=tuple(csv_list(method, what="--method") or DiagnoseSettings.methods),
                                    test_size=test_size or (500 if small else 10_000),
                                    train_size=train_size or (250 if small else 2_000),
                                    rounds=epochs if epochs != 3 or not small else 1, path_points=path_points_option(path_points),
                                    **({"warmup": False, "path_pairs": 1} if small else {}))
        return _record(run_diagnose_bench, settings, resolved, fmt, results_dir, diagnose_table)
    if arch == "resnet18" and resolved.type == "cpu":  # a full epoch takes the better part of an hour
        batches = 10 if batches is None else batches
        test_size = 1_000 if test_size is None else test_size
    settings = BenchSettings(arch=arch, methods=tuple(csv_list(method, what="--method") or default_methods(arch)),
                             device=resolved.type, epochs=epochs, batches=batches, train_size=train_size,
                             test_size=10_000 if test_size is None else test_size, precision=precision,
                             compile=compile or compile_mode != "default", compile_mode=compile_mode,
                             reference=reference, strategies=strategies, members=members,
                             tracking=tracking)

    def log(message):
        if fmt == "table":
            note(message)

    result = run(settings, resolved, sys.argv, log)
    path = write_result(result, results_dir)
    if fmt == "json":
        print_json(result)
    else:
        console = Console()
        console.width = max(console.width, 120)  # a wide table beats a truncated one in a pipe
        for table in bench_table(result):
            console.print(table)
    note(f"results written to {path}")


def _record(run, settings, device, fmt: str, results_dir, tables) -> None:
    """Run one bench, write its record, print it (tables or JSON) and say where it went."""
    from ..bench import bench_record, write_result
    result = bench_record(run, settings, device, sys.argv, note if fmt == "table" else None)
    path = write_result(result, results_dir)
    if fmt == "json":
        print_json(result)
    else:
        console = Console(width=max(Console().width, 120))
        for table in tables(result):
            console.print(table)
    note(f"results written to {path}")
