"""Provenance recorded with every run and benchmark: versions, machine, device, git commit."""

import os
import platform
import subprocess
from contextlib import suppress
from pathlib import Path

import numpy
import torch
import torchvision

from . import __version__, threads


def cpu_name() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                               text=True, timeout=5)
        commit = found.stdout.strip() or None if found.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"ensdiag": __version__, "torch": torch.__version__, "torchvision": torchvision.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else cpu_name(), "cpu": cpu_name(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "threads_from": threads.origin(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "git_commit": commit}
