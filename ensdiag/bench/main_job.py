"""The README's main job, timed end to end as a user runs it: `ensdiag bench --main-job`.

    ensdiag bench --main-job --epochs 2       # 2 rounds of the default grid; a JSON record

Each round runs, as separate processes from an empty folder: `ensdiag train` (the default grid:
4 methods × 3 seeds on digits, each run diagnosed as it finishes, then the grid's report written),
`ensdiag report RUN --format summary` twice (as the main job runs it, reading back the report train
wrote, and again after deleting figures/, which builds the report and draws every figure anew),
and `ensdiag diversity` of the grid's Deep Ensemble within a budget. The first round
starts with an empty data cache (a fresh machine), the others with the cache it wrote. From the
runs' own records (meta.json): each run's training and diagnosis seconds, so the ratios the
targets are stated in are measured in the same run, never against another machine. The machine's
load average is recorded before and after each step.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

from ..errors import EnsdiagError

TARGETS = {"diagnosis_to_training": 0.4, "grid_seconds": 25.0, "report_to_training": 0.25, "budget_overrun": 1.1}


@dataclass(frozen=True)
class MainJobSettings:
    rounds: int = 2
    budget: str = "1m"  # diversity's budget on the grid's Deep Ensemble
    arch: str = "mlp"  # (what write_result names the record by)
    device: str = "cpu"


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _timed(args: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ensdiag", *args], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise EnsdiagError(f"bench --main-job: `ensdiag {' '.join(args)}` failed: {(done.stderr.strip() or '?')[-300:]}")
    return seconds, done


def _round(index: int, scratch: Path, settings: MainJobSettings, cache: Path) -> dict:
    env = {**os.environ, "ENSDIAG_CACHE": str(cache)}
    folder = scratch / f"round-{index}"
    folder.mkdir()
    load = {"before": load_average()}
    grid_seconds, _ = _timed(["train", "--out", "runs", "--quiet"], folder, env)
    load["after_grid"] = load_average()
    run = folder / "runs"
    runs = []
    for meta in sorted(run.glob("*/seed-*/meta.json")):
        record = json.loads(meta.read_text())
        train, diagnose = record["train_seconds"], record["eval_seconds"]
        runs.append({"run": record["run"], "seed": record["seed"], "epochs": record["epochs_run"],
                     "train_seconds": round(train, 3), "diagnosis_seconds": round(diagnose, 3),
                     "ratio": round(diagnose / train, 3) if train > 0 else None})
    train, diagnose = sum(r["train_seconds"] for r in runs), sum(r["diagnosis_seconds"] for r in runs)
    warm, _ = _timed(["report", "runs", "--format", "summary"], folder, env)  # as the main job runs it
    shutil.rmtree(run / "figures")
    cold, _ = _timed(["report", "runs", "--format", "summary"], folder, env)  # every figure drawn again
    load["after_report"] = load_average()
    model = next(run.glob("deep-ensemble/seed-*/model.safetensors"))
    budget_seconds, done = _timed(["diversity", str(model.relative_to(folder)), "--budget", settings.budget, "--format",
                                   "json"], folder, env)
    load["after_budget"] = load_average()
    budget = json.loads(done.stdout).get("budget", {})
    return {"round": index, "cache": "empty" if index == 0 else "warm", "load_average": load,
            "grid_seconds": round(grid_seconds, 2), "training_seconds": round(train, 2),
            "diagnosis_seconds": round(diagnose, 2), "diagnosis_to_training": round(diagnose / train, 3),
            "runs": runs, "report_seconds": round(warm, 2), "report_to_training": round(warm / train, 3),
            "report_cold_seconds": round(cold, 2), "report_cold_to_training": round(cold / train, 3),
            "budget": {"asked_seconds": budget.get("seconds"), "wall_seconds": round(budget_seconds, 2),
                       "spent_seconds": budget.get("spent_seconds"),
                       "wall_to_budget": round(budget_seconds / budget["seconds"], 3) if budget.get("seconds") else None,
                       "skipped": budget.get("skipped", {})}}


def run_main_job_bench(settings: MainJobSettings, device=None, log=None) -> dict:
    """{"settings", "rounds", "summary", "targets"}: `settings.rounds` rounds of the main job (module docstring)."""
    if settings.rounds < 1:
        raise EnsdiagError("--epochs (the rounds of the main job) must be at least 1")
    with tempfile.TemporaryDirectory(prefix="ensdiag-main-job-") as scratch:
        scratch, cache = Path(scratch), Path(scratch) / "cache"
        rounds = []
        for index in range(settings.rounds):
            if log:
                log(f"main job, round {index + 1} of {settings.rounds} …")
            rounds.append(_round(index, scratch, settings, cache))
    warm = [found for found in rounds if found["cache"] == "warm"] or rounds
    summary = {key: median([found[key] for found in warm]) for key in
               ("grid_seconds", "training_seconds", "diagnosis_seconds", "diagnosis_to_training", "report_seconds",
                "report_to_training", "report_cold_seconds", "report_cold_to_training")}
    summary["worst_run_diagnosis_to_training"] = max(r["ratio"] for found in warm for r in found["runs"] if r["ratio"])
    summary["budget_wall_to_budget"] = max(found["budget"]["wall_to_budget"] or 0 for found in rounds)
    summary["first_round_grid_seconds"] = rounds[0]["grid_seconds"]
    targets = {f"diagnosis ≤ {TARGETS['diagnosis_to_training']:g}× training (the grid's runs together)":
               summary["diagnosis_to_training"] <= TARGETS["diagnosis_to_training"],
               f"grid ≤ {TARGETS['grid_seconds']:g} s end to end": summary["grid_seconds"] <= TARGETS["grid_seconds"],
               f"report ≤ {TARGETS['report_to_training']:g}× the grid's training":
               summary["report_to_training"] <= TARGETS["report_to_training"],
               f"diversity --budget {settings.budget} within its budget + {(TARGETS['budget_overrun'] - 1) * 100:.0f} %":
               summary["budget_wall_to_budget"] <= TARGETS["budget_overrun"]}
    return {"kind": "main-job", "settings": asdict(settings), "rounds": rounds, "summary": summary, "targets": targets}
