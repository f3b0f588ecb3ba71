"""`ensdiag bench`: training, inference and diagnosis throughput, written down as JSON.

Nothing here imports torch before the command runs.
"""

import sys
from pathlib import Path

import typer
from rich.console import Console

from ..console import check_format, note, print_json
from ..errors import EnsdiagError
from ..numbers import parse_precision, parse_seconds, path_points_option
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
    check_format(fmt)
    if (budget is not None or precision_target is not None) and not (diagnose or main_job):
        raise EnsdiagError("--budget and --precision-target time a budgeted diagnosis: give --diagnose too")
    parse_seconds(budget), parse_precision(precision_target)
    from ..bench import (BenchSettings, BudgetSettings, DiagnoseSettings, MainJobSettings, bench_record, bench_table,
                         budget_table, default_methods, diagnose_table, main_job_table, run_budget_bench,
                         run_diagnose_bench, run_main_job_bench, write_result)
    from ..bench import bench as run_bench
    from ..device import resolve_device

    resolved = resolve_device(device)
    own_threads(threads, arch)
    methods = csv_list(method)
    if main_job:
        run, tables = run_main_job_bench, main_job_table
        settings = MainJobSettings(rounds=epochs if epochs != 3 else 2, budget=budget or "1m", device=resolved.type)
    elif diagnose and (budget is not None or precision_target is not None):
        run, tables = run_budget_bench, budget_table
        settings = BudgetSettings(arch=arch, device=resolved.type, members=members, budget=budget or "5m",
                                  precision=precision_target, methods=tuple(methods or BudgetSettings.methods),
                                  **({"test_size": test_size} if test_size else {}),
                                  **({"train_size": train_size} if train_size else {}))
    elif diagnose:
        # one CPU evaluation pass of 10,000 CIFAR images takes minutes: fewer images, one path pair,
        # no warm-up, one round; the JSON's estimate scales the steps to the protocol's sizes
        small = arch == "resnet18" and resolved.type == "cpu"
        run, tables = run_diagnose_bench, diagnose_table
        settings = DiagnoseSettings(arch=arch, device=resolved.type, members=members,
                                    methods=tuple(methods or DiagnoseSettings.methods),
                                    test_size=test_size or (500 if small else 10_000),
                                    train_size=train_size or (250 if small else 2_000),
                                    rounds=epochs if epochs != 3 or not small else 1, path_points=path_points_option(path_points),
                                    **({"warmup": False, "path_pairs": 1} if small else {}))
    else:
        if arch == "resnet18" and resolved.type == "cpu":  # a full epoch takes the better part of an hour
            batches = 10 if batches is None else batches
            test_size = 1_000 if test_size is None else test_size
        run, tables = run_bench, bench_table
        settings = BenchSettings(arch=arch, methods=tuple(methods or default_methods(arch)), device=resolved.type,
                                 epochs=epochs, batches=batches, train_size=train_size,
                                 test_size=10_000 if test_size is None else test_size, precision=precision,
                                 compile=compile or compile_mode != "default", compile_mode=compile_mode,
                                 reference=reference, strategies=strategies, members=members, tracking=tracking)
    result = bench_record(run, settings, resolved, sys.argv, note if fmt == "table" else None)
    path = write_result(result, results_dir)
    if fmt == "json":
        print_json(result)
    else:
        console = Console(width=max(Console().width, 120))  # a wide table beats a truncated one in a pipe
        for table in tables(result):
            console.print(table)
    note(f"results written to {path}")
