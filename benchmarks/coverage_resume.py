"""Resuming a coverage record (`benchmarks/interval_coverage.py --resume RECORD`): a record goes on
only with the code it measures giving the numbers it gave. Where git says the measured files changed
since a commit the record holds, replicate 0 of every cell is computed by that commit (a git worktree)
and by the code now, in two processes (`PROBE`), and every value, ensdiag's interval and each
candidate both compute must agree to 10⁻⁹ (`differences`); else the run is refused, naming what moved.
"""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import coverage_populations as P  # noqa: E402

MEASURED = ("ensdiag/analysis", "ensdiag/core/intervals.py", "ensdiag/geometry", "benchmarks/coverage_populations.py",
            "benchmarks/interval_coverage.py")  # the code a record's replicates depend on


def head_commit() -> str | None:
    import subprocess
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    return found.stdout.strip() or None if found.returncode == 0 else None


def changed_since(commit: str) -> list[str]:
    """The measured files that differ between `commit` and the working tree (git diff)."""
    import subprocess
    found = subprocess.run(["git", "diff", "--name-only", commit, "--", *MEASURED], cwd=Path(__file__).resolve().parents[1],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"--resume: git cannot compare with the record's commit {commit}: {found.stderr.strip()}")
    return found.stdout.split()


def uncommitted() -> list[str]:
    """The measured files with changes git has not committed."""
    import subprocess
    found = subprocess.run(["git", "status", "--porcelain", "--", *MEASURED], cwd=Path(__file__).resolve().parents[1],
                           capture_output=True, text=True)
    return [line[3:] for line in found.stdout.splitlines()]


def check_resumable(args) -> dict:
    """The record args.resume, refused (before any truth is computed) where it was made with other
    settings, populations or analyzers, or by code that gives other numbers now (`same_numbers`)."""
    record = json.loads(args.resume.read_text())
    settings = record["settings"]
    for key, wanted in (("sizes", args.sizes), ("truth_examples", args.truth_examples), ("members", P.MEMBERS),
                        ("classes", P.CLASSES), ("only", args.only)):
        if settings.get(key) != wanted:
            raise SystemExit(f"--resume: the record has {key} = {settings.get(key)}, this run {wanted}")
    if sorted(record["populations"]) != sorted(args.populations):
        raise SystemExit(f"--resume: the record's populations are {sorted(record['populations'])}")
    parts = record.get("parts") or [{"commit": record["environment"].get("git_commit"), "from": {}, "to": {}}]
    for commit in dict.fromkeys(part["commit"] for part in parts):
        if not commit:
            raise SystemExit("--resume: the record does not say which commit made it")
        changed = changed_since(commit)
        if changed:  # the code moved on: the record goes on only if its numbers did not
            same_numbers(commit, changed, args)
    return record


PROBE = """
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
import ensdiag, coverage_populations as P, interval_coverage as C
assert Path(ensdiag.__file__).resolve().is_relative_to(Path.cwd().resolve()), ensdiag.__file__
cells, only, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])
out.write_text(json.dumps({f"{name}|{n}": C.Replicates(P.POPULATIONS[name], n, only).run(0) for name, n in cells}))
"""  # replicate 0 of every cell, by the code of the folder it runs in (its own package and scripts)
PROBE_SECONDS = 3600  # two probes of every cell take about two minutes of two cores


def probe(root: Path, cells: list, only, out: Path):
    """A process writing replicate 0 of `cells`, computed with the code under `root`, to `out` (JSON)."""
    import os
    import subprocess
    path = [str(root / "benchmarks"), str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", PROBE, json.dumps(cells), json.dumps(only), str(out)], cwd=root,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def same_numbers(commit: str, changed: list, args, tolerance: float = 1e-9) -> None:
    """Refuse to resume unless replicate 0 of every cell — every column's value, ensdiag's interval and
    every candidate both hold — is the same number (to `tolerance`, relative) at `commit` and now: a
    change to the measured code that moves no number (a faster resampler) keeps the record going, one
    that moves any refuses, naming the first columns that moved. About two minutes of two cores. Both
    probes run this checkout's way of importing (each asserts its ensdiag is its folder's)."""
    import shutil
    import subprocess
    import tempfile
    root = Path(__file__).resolve().parents[1]
    cells = [[name, n] for name in args.populations for n in args.sizes]
    print(f"--resume: {', '.join(changed)} changed since {commit[:12]}; comparing replicate 0 of every cell …",
          flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="coverage-probe-"))
    then, runs = scratch / "then", []
    try:
        added = subprocess.run(["git", "worktree", "add", "--detach", str(then), commit], cwd=root, capture_output=True,
                               text=True)
        if added.returncode != 0:
            raise SystemExit(f"--resume: git cannot check out the record's commit {commit}: {added.stderr.strip()}")
        runs = [probe(folder, cells, args.only, scratch / f"{name}.json") for folder, name in ((then, "then"), (root, "now"))]
        for run in runs:
            try:
                _, err = run.communicate(timeout=PROBE_SECONDS)
            except subprocess.TimeoutExpired:
                raise SystemExit(f"--resume: replicate 0 took over {PROBE_SECONDS} s") from None
            if run.returncode != 0:
                raise SystemExit("--resume: replicate 0 failed: "
                                 + (err.strip().splitlines()[-1] if err.strip() else f"exit {run.returncode}"))
        moved = differences(*(json.loads((scratch / f"{name}.json").read_text()) for name in ("then", "now")), tolerance)
    finally:
        for run in runs:  # Ctrl-C or a failure: no probe outlives the worktree it reads
            if run.poll() is None:
                run.kill()
                run.wait()
        subprocess.run(["git", "worktree", "remove", "--force", str(then)], cwd=root, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    if moved:
        raise SystemExit(f"--resume: the code changed since {commit[:12]} gives other numbers ({len(moved)}), e.g. "
                         + "; ".join(moved[:3]))
    print(f"--resume: every cell's replicate 0 is the same at {commit[:12]} and now", flush=True)


def differences(then: dict, now: dict, tolerance: float = 1e-9) -> list[str]:
    """["cell column: what moved"] between two probes (`PROBE`): a column present in one only, or a
    value or interval end (ensdiag's, or a candidate's that both compute: a candidate added since is
    tallied from the replicates it ran on) that differs by more than `tolerance` (relative; 10⁻¹²
    absolute)."""
    def same(a, b):
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=tolerance, abs_tol=1e-12)
        return a == b
    found = []
    for cell in sorted(set(then) | set(now)):
        before, after = then.get(cell, {}), now.get(cell, {})
        for key in sorted(set(before) | set(after)):
            if key not in before or key not in after:
                found.append(f"{cell} {key}: only {'now' if key in after else 'then'}")
                continue
            shared = set(before[key]["candidates"]) & set(after[key]["candidates"])
            for part in ("value", "ensdiag", "note", "construction", "candidates"):
                old, new = ([sorted((name, pair) for name, pair in outcome["candidates"].items() if name in shared)
                             for outcome in (before[key], after[key])] if part == "candidates"
                            else [before[key].get(part), after[key].get(part)])
                if not same(old, new):
                    found.append(f"{cell} {key}: {part} {old!r:.60} → {new!r:.60}")
    return found


def confirmed_pairs(parts: list) -> set:
    """{(population, N, column key)} to which a confirmation (`coverage_confirm.py`) added replicates."""
    return {(part["confirm"]["population"], part["confirm"]["n"], key)
            for part in parts if "confirm" in part for key in part["confirm"]["columns"]}


def resumed(record: dict, truths: dict):
    """(done, start, parts, process seconds) of a resumable record (`check_resumable`): its cells as
    the first part of every cell, each size's next replicate index."""
    for name, entry in record["populations"].items():
        if entry["truths"] != json.loads(json.dumps(truths[name])):
            raise SystemExit(f"--resume: the population {name!r} has other true values than the record's")
    parts = record.get("parts") or [{"commit": record["environment"].get("git_commit"), "from": {}, "to": {}}]
    done, start, confirmed = [], {}, confirmed_pairs(parts)
    for cell in record["cells"]:
        counts = [max([column["ensdiag"]["replicates"]] + [c["replicates"] for c in column["candidates"].values()])
                  for key, column in cell["columns"].items() if (cell["population"], cell["n"], key) not in confirmed]
        reached = max(counts) if counts else start.get(cell["n"], 0)  # (a confirmation's replicates are drawn apart)
        if start.setdefault(cell["n"], reached) != reached:
            raise SystemExit(f"--resume: the cells at N = {cell['n']} hold different numbers of replicates")
        done.append((cell["population"], cell["n"], -1, cell["columns"]))
    return done, start, [part if "confirm" in part else
                         {"commit": part["commit"], "from": {int(n): i for n, i in part["from"].items()},
                          "to": {int(n): i for n, i in part["to"].items()}} for part in parts], record.get("process_seconds", 0)
