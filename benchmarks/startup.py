"""Typo to error: how long a mistyped command takes to answer, against `ensdiag --version`.

Every argument check that needs no tensor runs before torch is imported (ensdiag/quickcheck.py),
so a typo should cost what starting Python and the CLI costs, not a torch start-up. This times
each command as a fresh process (median of interleaved rounds) and writes the seconds and their
ratio to `ensdiag --version` measured in the same run; `import torch` is timed for scale.

    python benchmarks/startup.py --out benchmarks/results/startup-cpu.json
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "ensdiag --version (baseline)": ["--version"],
    "train --preset digts": ["train", "--preset", "digts"],
    "train --method deep-ensembel": ["train", "--method", "deep-ensembel"],
    "diversity missing.safetensors": ["diversity", "missing.safetensors"],
    "report missing-run": ["report", "missing-run"],
}


def timed(command) -> float:
    began = time.perf_counter()
    subprocess.run(command, capture_output=True, timeout=300)
    return time.perf_counter() - began


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/startup-cpu.json"))
    args = parser.parse_args()
    entry = [sys.executable, "-m", "ensdiag"]
    commands = {name: entry + argv for name, argv in CASES.items()}
    commands["import torch (for scale)"] = [sys.executable, "-c", "import torch"]
    samples = {name: [] for name in commands}
    for _ in range(args.rounds):  # interleaved: a slow moment of the machine touches every case alike
        for name, command in commands.items():
            samples[name].append(timed(command))
    seconds = {name: statistics.median(values) for name, values in samples.items()}
    baseline = seconds["ensdiag --version (baseline)"]
    result = {"what": "seconds from process start to the error line, median of interleaved rounds",
              "rounds": args.rounds, "python": platform.python_version(), "machine": platform.machine(),
              "cpus": __import__("os").cpu_count(),
              "seconds": seconds, "ratio_to_version": {name: value / baseline for name, value in seconds.items()},
              "samples": samples}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, value in seconds.items():
        print(f"{name:34s} {value:6.2f} s  ×{value / baseline:4.1f}")


if __name__ == "__main__":
    main()
