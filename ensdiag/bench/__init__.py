"""`ensdiag bench`: the fast path against the reference pipeline, written down as JSON.

    ensdiag bench --arch mlp --device cpu
    ensdiag bench --arch resnet18 --device cuda --format json

`harness.py` does the timing, `reference.py` is the pipeline it is compared with. Results go
to `benchmarks/results/bench-<arch>-<device>-<time>.json` with the machine, the library
versions and every setting, so a number in the docs can always be traced to its run.
"""

from datetime import datetime
from pathlib import Path

from rich.table import Table

from ..errors import EnsdiagError
from ..io import atomic_write_json
from ..nn.methods import run_methods
from ..precision import PRECISIONS
from ..provenance import environment
from ..report.example_level import budget_lines
from .diagnose import BudgetSettings, DiagnoseSettings, run_budget_bench, run_diagnose_bench
from .harness import BENCH_METHODS, COMPILE_MODES, PROTOCOL_IMAGES, PROTOCOLS, BenchSettings, default_methods, run_bench
from .main_job import MainJobSettings, run_main_job_bench

BENCH_FORMAT = "ensdiag.bench/1"
__all__ = ["BENCH_METHODS", "PROTOCOLS", "BenchSettings", "BudgetSettings", "DiagnoseSettings", "MainJobSettings",
           "bench", "bench_record", "bench_table", "budget_table", "default_methods", "diagnose_table",
           "main_job_table", "run_budget_bench", "run_diagnose_bench", "run_main_job_bench", "write_result"]


def bench(settings: BenchSettings, device, log=None) -> dict:
    """`run_bench`, its settings checked as user input first."""
    unknown = [m for m in settings.methods if m not in run_methods()]
    if unknown or not settings.methods:
        raise EnsdiagError(f"unknown method {', '.join(unknown) or '(none given)'}; choose from {', '.join(BENCH_METHODS)}")
    if settings.precision not in PRECISIONS:
        raise EnsdiagError(f"unknown --precision {settings.precision!r}; use auto, fp32 or bf16")
    if settings.compile_mode not in COMPILE_MODES:
        raise EnsdiagError(f"unknown --compile-mode {settings.compile_mode!r}; choose from {', '.join(COMPILE_MODES)}")
    checks = [(settings.epochs >= 1, "--epochs must be at least 1"),
              (settings.batches is None or settings.batches >= 1, "--batches must be at least 1"),
              (settings.train_size is None or settings.train_size >= 1, "--train-size must be at least 1"),
              (settings.test_size >= 1, "--test-size must be at least 1")]  # (--members: the preset's checks)
    for ok, message in checks:
        if not ok:
            raise EnsdiagError(message)
    return run_bench(settings, device, log)


def bench_record(run, settings, device, argv=(), log=None) -> dict:
    """`run(settings, device, log)`'s result with what makes it traceable: the time, the command,
    the machine and the library versions (ensdiag's included)."""
    if settings.arch not in PROTOCOLS:
        raise EnsdiagError(f"unknown --arch {settings.arch!r}; choose from {', '.join(PROTOCOLS)}")
    result = run(settings, device, log)
    return {"format": BENCH_FORMAT, "created": datetime.now().isoformat(timespec="seconds"),
            "command": list(argv), "environment": environment(device), **result}


def _table(title: str, columns, **options) -> Table:
    """A table of text in its first column and of numbers, right-aligned, in the others."""
    table = Table(title=title, **options)
    for index, column in enumerate(columns):
        table.add_column(column, justify="right" if index else "left", no_wrap=not index)
    return table


def main_job_table(result: dict) -> list[Table]:
    """The main job's record: per round its seconds and ratios, then the targets, met or not."""
    rounds = _table("The main job (default grid, its report, diversity within a budget), per round",
                    ("round", "cache", "grid s", "training s", "diagnosis s", "diagnosis / training", "report s",
                     "report / training", "report s (figures redrawn)", "diversity s / budget", "load before"),
                    title_justify="left")
    for found in result["rounds"]:
        rounds.add_row(str(found["round"] + 1), found["cache"], f"{found['grid_seconds']:.1f}",
                       f"{found['training_seconds']:.1f}", f"{found['diagnosis_seconds']:.1f}",
                       f"{found['diagnosis_to_training']:.2f}", f"{found['report_seconds']:.1f}",
                       f"{found['report_to_training']:.2f}", f"{found['report_cold_seconds']:.1f}",
                       f"{found['budget']['wall_seconds']:.0f} / {found['budget']['asked_seconds']:.0f}",
                       " ".join(f"{x:.2f}" for x in found["load_average"]["before"]))
    targets = _table("Targets", ("target", "met"), title_justify="left")
    for name, met in result["targets"].items():
        targets.add_row(name, "yes" if met else "no")
    return [rounds, targets]


def write_result(result: dict, folder=Path("benchmarks/results")) -> Path:
    settings = result["settings"]
    stamp = result["created"].replace(":", "").replace("-", "")
    kind = result.get("kind") if result.get("kind") in ("diagnose", "diagnose-budget", "main-job") else "bench"
    return atomic_write_json(Path(folder) / f"{kind}-{settings['arch']}-{settings['device']}-{stamp}.json", result)


def _rate(value):
    if value is None:
        return "–"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def bench_table(result: dict) -> list[Table]:
    """The per-method numbers, the target ratios, and the member-strategy comparison."""
    settings, env = result["settings"], result["environment"]
    title = (f"ensdiag bench: {settings['arch']} on {env['device_name']} ({env['device']}, "
             f"{settings['threads']} threads), {settings['train_size']:,} images, batch {settings['batch_size']}")
    table = _table(title, ("method", "k", "s/epoch", "ref s/epoch", "speed-up", "img/s", "member img/s", "infer img/s",
                           "infer member img/s", "ref infer img/s"))
    for run, row in result["methods"].items():
        reference = row.get("reference_seconds_per_epoch")
        table.add_row(run, str(row["members"]), f"{row['seconds_per_epoch']:.3f}",
                      f"{reference:.3f}" if reference else "–", f"{row['speedup']:.1f}×" if "speedup" in row else "–",
                      _rate(row["images_per_second"]), _rate(row["member_images_per_second"]),
                      _rate(row["inference_images_per_second"]), _rate(row["inference_member_images_per_second"]),
                      _rate(row.get("reference_inference_images_per_second")))
    tables = [table]
    if result["ratios"]:
        ratios = _table("Ratios the targets are stated in", ("ratio", "value"))
        for name, value in result["ratios"].items():
            ratios.add_row(name, f"{value:.2f}")
        tables.append(ratios)
    if result["strategies"]:
        measured = min(result["strategies"], key=lambda name: result["strategies"][name]["seconds_per_epoch"])
        in_use = result["strategy_in_use"]
        caption = (f"{in_use} is in use (FASTEST in nn/members.py)"
                   + ("" if measured == in_use else f"; {measured} was faster in this run"))
        strategies = _table("Deep Ensemble member strategies (nn/members.py)",
                            ("strategy", "s/epoch", "infer images/s"), caption=caption)
        for name, row in result["strategies"].items():
            strategies.add_row(name, f"{row['seconds_per_epoch']:.3f}", _rate(row["inference_images_per_second"]))
        for name, why in result.get("strategies_skipped", {}).items():
            strategies.add_row(name, "cannot run", why)
        tables.append(strategies)
    extrapolated = [run for run, row in result["methods"].items() if row["timed_batches"] < row["batches_per_epoch"]]
    if extrapolated:
        first = result["methods"][extrapolated[0]]
        tables.append(f"epoch times extrapolated from {first['timed_batches']} of {first['batches_per_epoch']} batches")
    return tables


def diagnose_table(result: dict) -> list[Table]:
    """`bench --diagnose`: seconds and evaluation passes per step, one column pair per method."""
    settings, methods = result["settings"], result["methods"]
    table = _table(f"ensdiag bench --diagnose: {settings['arch']}, k = {settings['members']}, "
                   f"{settings['test_size']:,} images per split ({settings['threads']} threads); "
                   f"passes = multiples of one evaluation pass",
                   ("step", *(label for run in methods for label in (f"{run} s", "passes"))))
    steps = list(dict.fromkeys(step for row in methods.values() for step in row["steps"]))
    for step in steps:
        cells = []
        for row in methods.values():
            found = row["steps"].get(step)
            cells += [f"{found['seconds']:.3g}", f"{found['passes']:.3g}"] if found else ["–", "–"]
        table.add_row(step, *cells)
    table.add_row("diagnosis (all but the unit)", *[cell for row in methods.values()
                                                    for cell in (f"{row['diagnosis_seconds']:.3g}", f"{row['diagnosis_passes']:.3g}")])
    estimates = [f"{run} ≈ {row['estimate']['seconds']:,.0f} s" for run, row in methods.items() if row["estimate"]]
    if estimates:
        table.caption = (f"whole diagnosis at {PROTOCOL_IMAGES:,} images per split, estimated: " + ", ".join(estimates))
    report = result["report"]
    reporting = _table(f"report of {report['runs']} runs (passes of {report['unit_method']}'s evaluation pass)",
                       ("step", "s", "passes"))
    for step, found in report["steps"].items():
        reporting.add_row(step, f"{found['seconds']:.3g}", f"{found['passes']:.3g}")
    return [table, reporting]


def budget_table(result: dict) -> list[Table]:
    """`bench --diagnose --budget`: what each step read within the budget, and the headline numbers."""
    tables = []
    for run, row in result["methods"].items():
        table = _table(f"{run}, k = {row['members']}: {row['wall_seconds']:.0f} s within a budget of "
                       f"{result['settings']['budget']}", ("step",))
        for line in budget_lines({"budget": row["budget"]}):
            table.add_row(line)
        numbers = _table("headline numbers with their example-level 95 % intervals",
                         ("number", "value", "interval", "n"))
        for name, found in row["headline"].items():
            interval = f"[{found['low']:.3g}, {found['high']:.3g}]" if found.get("low") is not None else "–"
            numbers.add_row(name, f"{found['value']:.3g}", interval, f"{found['n']:,}" if found.get("n") else "–")
        tables += [table, numbers]
    return tables
