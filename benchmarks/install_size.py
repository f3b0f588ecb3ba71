"""How much disk a fresh install of ensdiag takes, and how much of it is CUDA: the install
note of docs/install.md comes from the record this writes.

    python3 -m venv /tmp/fresh && /tmp/fresh/bin/pip install -c constraints.txt -e .
    python benchmarks/install_size.py /tmp/fresh --out benchmarks/results/install-size.json

Sizes are the bytes of the files under the virtual environment (symbolic links not followed),
in GiB: the whole environment, NVIDIA's CUDA libraries (site-packages/nvidia, pulled in by the
regular torch wheel), Triton (a GPU compiler, also torch's) and torch itself.
"""

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path

GIB = 1024 ** 3


def size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            file = Path(root) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    site = next(args.venv.glob("lib/python*/site-packages"))
    version = subprocess.run([str(args.venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    record = {"command": "python3 -m venv VENV && VENV/bin/pip install -c constraints.txt -e .",
              "torch": version, "python": platform.python_version(), "machine": platform.machine(),
              "gib": {"environment": size(args.venv) / GIB, "nvidia": size(site / "nvidia") / GIB,
                      "triton": size(site / "triton") / GIB, "torch": size(site / "torch") / GIB}}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["gib"]))


if __name__ == "__main__":
    main()
