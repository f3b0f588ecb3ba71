"""Do two versions of ensdiag print the same outputs? A refactoring's check, on the README's main job.

    python benchmarks/same_outputs.py --base 19063b6 [--out benchmarks/results]

Trains the default grid once (with this checkout), then runs each output command with the code
of `--base` (a git worktree of it, through PYTHONPATH) and with this checkout, on copies of the same
run folder: `report` in every format, `evaluate --format json` of each method's first seed,
`diversity --format json` of the Deep Ensemble and `analyze --detail --format json` of its
predictions. The record holds each output's SHA-256 on both sides and, where they differ, the
differing lines (the run folder's name replaced by one placeholder).
"""

import argparse
import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("markdown", "summary", "html", "latex", "table", "json")
METHODS = ("single", "mc-dropout", "deep-ensemble", "batch-ensemble")


def ensdiag(code: Path, args: list, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(code), "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-m", "ensdiag", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ensdiag {' '.join(args)} failed with {code}:\n{done.stderr}")
    return done.stdout


def commit_of(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with this checkout")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        base = scratch / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True)
        try:
            ensdiag(ROOT, ["train", "--out", "grid", "--quiet"], scratch)
            outputs = {}
            for side, code in (("base", base), ("head", ROOT)):
                folder = scratch / f"grid-{side}"
                shutil.copytree(scratch / "grid", folder, ignore=shutil.ignore_patterns("report*", "figures"))
                commands = {f"report --format {fmt}": ["report", folder.name, "--format", fmt] for fmt in FORMATS}
                for method in METHODS:
                    commands[f"evaluate {method}"] = ["evaluate", f"{folder.name}/{method}/seed-42/model.safetensors",
                                                      "--format", "json"]
                commands["diversity deep-ensemble"] = ["diversity", f"{folder.name}/deep-ensemble/seed-42/model.safetensors",
                                                       "--format", "json"]
                commands["analyze --detail deep-ensemble"] = [
                    "analyze", f"{folder.name}/deep-ensemble/seed-42/predictions.safetensors", "--detail", "--format", "json"]
                for name, command in commands.items():
                    outputs.setdefault(name, {})[side] = ensdiag(code, command, scratch).replace(folder.name, "RUN")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    record = {"kind": "same-outputs", "created": datetime.now().isoformat(timespec="seconds"),
              "base": commit_of(args.base), "head": commit_of("HEAD"),
              "head_has_uncommitted_changes": bool(subprocess.run(["git", "status", "--porcelain", "ensdiag"], cwd=ROOT,
                                                                  capture_output=True, text=True).stdout.strip()),
              "outputs": {}}
    for name, sides in outputs.items():
        entry = {side: hashlib.sha256(text.encode()).hexdigest() for side, text in sides.items()}
        entry["same"] = sides["base"] == sides["head"]
        if not entry["same"]:
            entry["differing_lines"] = [line for line in difflib.unified_diff(
                sides["base"].splitlines(), sides["head"].splitlines(), lineterm="", n=0)
                if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        record["outputs"][name] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"same-outputs-{datetime.now():%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    same = sum(entry["same"] for entry in record["outputs"].values())
    print(f"{same} of {len(record['outputs'])} outputs byte-equal; record: {path}")


if __name__ == "__main__":
    main()
