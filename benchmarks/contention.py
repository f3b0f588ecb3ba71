"""Benchmark: the README's main job and one Deep-Ensemble run, idle and beside other work, in one run.

    python benchmarks/contention.py [--busy 4] [--rounds 1] [--env KEY=VALUE ...] [--out benchmarks/results]

Each job runs as a user runs it, separate processes from an empty folder (one data cache, warmed
first): the main job is `ensdiag train --out runs` (the default grid, its report written) and then
`ensdiag report runs --format summary`; the Deep-Ensemble run is `ensdiag train --method
deep-ensemble --seeds 42`, whose meta.json gives its training and diagnosis seconds. Every job is
timed in each condition, in turn: idle; beside another PyTorch job (a process doing matmuls with
torch's default threads and OpenMP's default waiting, as a second training would); beside --busy
CPU-bound processes (busy loops). The bench starts that other work, waits until it computes, and
ends it. The jobs get the environment without OMP_NUM_THREADS, MKL_NUM_THREADS and
OMP_WAIT_POLICY, so they run with ensdiag's own choice, unless --env sets one (e.g. `--env
OMP_WAIT_POLICY=ACTIVE --env OMP_NUM_THREADS=2`: torch's defaults, as before ensdiag chose).
The record (seconds, ratios to idle, load averages, the jobs' threads) goes under --out;
`python benchmarks/docs_tables.py` renders it into docs/performance.md.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

SCRUBBED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")
TORCH_JOB = [sys.executable, "-c", "import torch\nx = torch.randn(512, 512)\nx = torch.tanh(x @ x / 512)\n"
             "print('ready', flush=True)\nwhile True:\n    x = torch.tanh(x @ x / 512)\n"]
BUSY_LOOP = [sys.executable, "-c", "print('ready', flush=True)\nwhile True:\n    pass\n"]
TARGET = 3.0  # beside one other PyTorch job, at most this × the idle time (issue 55)


def ensdiag(*args) -> list[str]:
    return [sys.executable, "-m", "ensdiag", *args]


JOBS = {"main job": [ensdiag("train", "--out", "runs", "--quiet"), ensdiag("report", "runs", "--format", "summary")],
        "deep-ensemble run": [ensdiag("train", "--method", "deep-ensemble", "--seeds", "42", "--out", "runs", "--quiet")]}


def conditions(busy: int) -> dict:
    return {"idle": [], "beside a PyTorch job": [TORCH_JOB], f"beside {busy} busy loops": [BUSY_LOOP] * busy}


@contextlib.contextmanager
def beside(commands: list, env: dict):
    """The processes of `commands` running (each has said it computes) while the block runs; ended after."""
    started = []
    try:
        for command in commands:
            started.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True))
            if started[-1].stdout.readline().strip() != "ready":
                raise RuntimeError(f"the other work {command[-1][:60]!r} did not start")
        yield [process.pid for process in started]
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def timed(commands: list, folder: Path, env: dict) -> dict:
    """One job's seconds (each command's, and all of them), with its runs' training and diagnosis seconds."""
    folder.mkdir(parents=True)
    load, steps = os.getloadavg()[0], []
    for command in commands:
        began = time.perf_counter()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        steps.append(round(time.perf_counter() - began, 3))
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[-4:])} failed: {(done.stderr.strip() or '?')[-400:]}")
    metas = [json.loads(path.read_text()) for path in sorted(folder.glob("**/seed-*/meta.json"))]
    found = {"seconds": round(sum(steps), 3), "steps": steps, "load_before": round(load, 2)}
    if metas:
        found.update(train_seconds=round(sum(meta["train_seconds"] for meta in metas), 3),
                     diagnosis_seconds=round(sum(meta["eval_seconds"] for meta in metas), 3),
                     threads=sorted({(meta["environment"].get("threads"), meta["environment"].get("threads_from"))
                                     for meta in metas if "environment" in meta}))
    return found


def measure(jobs: dict, settings: dict, rounds: int, scratch: Path, env: dict, log=print) -> dict:
    """{"conditions": {condition: {job: medians}}, "ratios": {condition: {job: {quantity: × idle}}}, "targets"}:
    every job in every condition (`settings`: {condition: commands of the other work}), `rounds` times in turn."""
    runs = {condition: {job: [] for job in jobs} for condition in settings}
    for round_ in range(rounds):
        for condition, others in settings.items():
            with beside(others, {key: value for key, value in os.environ.items() if key not in SCRUBBED}):
                for job, commands in jobs.items():
                    log(f"round {round_ + 1}: {job}, {condition} …")
                    runs[condition][job].append(timed(commands, scratch / f"{round_}-{condition}-{job}".replace(" ", "-"), env))
    found = {condition: {job: _median(results) for job, results in by_job.items()} for condition, by_job in runs.items()}
    idle = found[next(iter(settings))]
    ratios = {condition: {job: {key: round(value / idle[job][key], 2) for key, value in result.items()
                                if key.endswith("seconds") and idle[job].get(key)}
                          for job, result in by_job.items()} for condition, by_job in found.items() if condition != "idle"}
    torch_job = next((condition for condition in ratios if "PyTorch" in condition), None)
    targets = {} if torch_job is None else {
        f"{job} beside a PyTorch job ≤ {TARGET:g}× idle ({key.replace('_', ' ')})": value <= TARGET
        for job, quantities in ratios[torch_job].items() for key, value in quantities.items()}
    return {"conditions": found, "ratios": ratios, "targets": targets}


def _median(results: list) -> dict:
    first = results[0]
    return {**first, **{key: round(statistics.median(result[key] for result in results), 3)
                        for key, value in first.items() if isinstance(value, float)}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=4, help="CPU-bound processes in the last condition")
    parser.add_argument("--rounds", type=int, default=1, help="every condition this many times in turn (medians)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set for the timed jobs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    import torch

    from ensdiag.io import atomic_write_json
    from ensdiag.provenance import environment
    given = dict(pair.split("=", 1) for pair in args.env)
    with tempfile.TemporaryDirectory(prefix="ensdiag-contention-") as scratch:
        env = {**{key: value for key, value in os.environ.items() if key not in SCRUBBED},
               "ENSDIAG_CACHE": str(Path(scratch) / "cache"), **given}
        timed([ensdiag("train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", "runs", "--quiet")],
              Path(scratch) / "warm-up", env)  # the data cache made once, as a user's first run did
        found = measure(JOBS, conditions(args.busy), args.rounds, Path(scratch), env)
    record = {"kind": "contention", "created": datetime.now().isoformat(timespec="seconds"), "command": sys.argv,
              "environment": environment(torch.device("cpu")),
              "settings": {"busy": args.busy, "rounds": args.rounds, "env": given, "other_pytorch_job": TORCH_JOB[-1],
                           "jobs": {job: [" ".join(command[2:]) for command in commands] for job, commands in JOBS.items()}},
              **found}
    path = args.out / f"contention-cpu-{record['created'].replace(':', '').replace('-', '')}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    print(json.dumps(found["ratios"], indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
