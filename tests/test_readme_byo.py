"""Every command of the README's "Bring your own ensemble" section runs, from a copy of the repository."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def byo_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Bring your own ensemble", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.strip().splitlines()]


def test_every_bring_your_own_example_runs(tmp_path):
    commands = byo_commands()
    assert len(commands) == 5 and sum("ensdiag " in c for c in commands) == 5
    for folder in ("examples", "tests/fixtures"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    bin_dir = Path(sys.executable).parent  # the interpreter's `ensdiag` and `python`
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    for command in commands:
        done = subprocess.run(["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    assert (tmp_path / "de-mlp.safetensors").exists()
    done = subprocess.run([str(bin_dir / "ensdiag"), "analyze", "byo-predictions.safetensors", "--format", "json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    auroc = json.loads(done.stdout)["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"]
    assert auroc > 0.8  # the example's OOD set is one the members tell apart, as the README says
