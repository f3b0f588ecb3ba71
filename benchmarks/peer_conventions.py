"""How far ensdiag's adaptive ECE and AURC lie from torch-uncertainty's, on real runs.

Both conventions are computed by ensdiag for every run (metrics.json: `ece_adaptive` and
`ece_adaptive_tu`, `aurc` and `aurc_trapezoid`); this reads them from run folders and writes
the largest absolute and relative difference per quantity, which docs/conventions.md quotes
(a test keeps the two in step).

    python benchmarks/peer_conventions.py runs/demo runs/efficient \
        --out benchmarks/results/peer-conventions-digits.json
"""

import argparse
import json
from pathlib import Path

PAIRS = {  # quantity: (analyzer, ensdiag's key, the peer's key)
    "adaptive ECE": ("calibration", "ece_adaptive", "ece_adaptive_tu"),
    "AURC": ("selective", "aurc", "aurc_trapezoid"),
}


def differences(run_dirs) -> dict:
    found = {name: [] for name in PAIRS}
    runs = 0
    for run_dir in run_dirs:
        for metrics_file in sorted(Path(run_dir).glob("*/seed-*/metrics.json")):
            analyzers = json.loads(metrics_file.read_text())["analyzers"]
            runs += 1
            for name, (analyzer, ours, theirs) in PAIRS.items():
                for split, entry in analyzers.get(analyzer, {}).get("splits", {}).items():
                    a, b = entry.get(ours, {}).get("value"), entry.get(theirs, {}).get("value")
                    if a is not None and b is not None:
                        found[name].append({"run": str(metrics_file.parent), "split": split, "n": entry.get("n"),
                                            "ensdiag": a, "torch-uncertainty": b})
    summary = {}
    for name, rows in found.items():
        gaps = [abs(row["ensdiag"] - row["torch-uncertainty"]) for row in rows]
        relative = [abs(row["ensdiag"] - row["torch-uncertainty"]) / abs(row["ensdiag"]) for row in rows if row["ensdiag"]]
        summary[name] = {"values": len(rows), "max_abs_difference": max(gaps, default=None),
                         "max_relative_difference": max(relative, default=None)}
    return {"runs": runs, "run_dirs": [str(d) for d in run_dirs], "summary": summary}


def markdown(result: dict) -> str:
    """The sentence docs/conventions.md carries (checked by tests/test_docs_numbers.py)."""
    ece, aurc = result["summary"]["adaptive ECE"], result["summary"]["AURC"]
    return (f"On the committed digits examples ({result['runs']} runs, every labelled split) the two adaptive ECEs "
            f"differ by at most {ece['max_abs_difference']:.2g} ({ece['max_relative_difference']:.0%} of the value) "
            f"and the two AURCs by at most {aurc['max_abs_difference']:.2g}.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/peer-conventions-digits.json"))
    args = parser.parse_args()
    result = differences(args.run_dirs)
    result["sentence"] = markdown(result)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["sentence"])


if __name__ == "__main__":
    main()
