"""How far a test set's MCE lies above its population's: the mean MCE ensdiag reads on test sets of N examples
drawn from the coverage suite's known populations, against each population's true MCE.

    python benchmarks/mce_bias.py                    # writes benchmarks/results/mce-bias.json
    python benchmarks/mce_bias.py --replicates 50 --out X.json

The MCE is the largest of the 15 bins' gaps |acc − conf|: each filled bin's gap is noisy on a test set, and the
largest of several noisy gaps sits above the largest true one, most where bins are sparse. docs/conventions.md
quotes this record beside the MCE, and the report's MCE column says it reads high.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from coverage_populations import POPULATIONS, true_values
from ensdiag.analysis.calibration import bins
from ensdiag.stats.examples import Examples
from ensdiag.provenance import environment

KEY = "calibration/splits/id/mce/value"
SIZES = (500, 2000)


def measured(population, n: int, replicates: int) -> list[float]:
    rng = np.random.default_rng(7000 + population.seed)
    found = []
    for _ in range(replicates):
        split = population.draw("id", n, rng)
        examples = Examples(torch.as_tensor(split["logits"]), torch.as_tensor(split["labels"]).long())
        found.append(float(bins(examples, None).mce()))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mce-bias.json")
    args = parser.parse_args()
    rows = []
    for name, population in POPULATIONS.items():
        if not population.everything:
            continue
        truth = true_values(population)[KEY]
        for n in SIZES:
            values = measured(population, n, args.replicates)
            rows.append({"population": name, "n": n, "truth": truth, "mean": float(np.mean(values)),
                         "ratio": float(np.mean(values)) / truth if truth > 1e-9 else None})
            print(rows[-1])
    record = {"kind": "mce-bias", "environment": environment(torch.device("cpu")), "replicates": args.replicates,
              "rows": rows}
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
