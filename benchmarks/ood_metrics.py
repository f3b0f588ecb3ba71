"""Benchmark: ensdiag's OOD metrics (one sort) vs scikit-learn's three calls, same scores.

    python benchmarks/ood_metrics.py [--n 1000000] [--repeats 3]

Times AUROC + AUPR-Out + AUPR-In + FPR95 from `ensdiag.stats.metrics.ood_metrics` on
n ID + n OOD scores, beside roc_auc_score + average_precision_score (twice) in the same run,
checks that the numbers agree, and prints the ratio. Timings are measured, never asserted.
"""

import argparse
import time

import numpy as np
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from ensdiag.stats.metrics import ood_metrics


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="scores per class")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    score_id = rng.beta(2, 5, args.n).astype(np.float32)  # float32 scores, as from a model: many ties
    score_ood = rng.beta(3, 3, args.n).astype(np.float32)
    y = np.r_[np.zeros(args.n), np.ones(args.n)]
    s = np.r_[score_id, score_ood].astype(np.float64)
    ours_t, ours = best_of(args.repeats, lambda: ood_metrics(torch.from_numpy(score_id), torch.from_numpy(score_ood)))
    sk_t, sk = best_of(args.repeats, lambda: (roc_auc_score(y, s), average_precision_score(y, s), average_precision_score(1 - y, -s)))
    assert abs(ours["auroc"] - sk[0]) < 1e-9 and abs(ours["aupr_out"] - sk[1]) < 1e-9 and abs(ours["aupr_in"] - sk[2]) < 1e-9
    print(f"{args.n:,} ID + {args.n:,} OOD scores, best of {args.repeats}, torch threads {torch.get_num_threads()}")
    print(f"  ensdiag ood_metrics (AUROC, AUPR-Out, AUPR-In, FPR95): {ours_t:.3f} s")
    print(f"  scikit-learn (roc_auc_score + 2 x average_precision_score): {sk_t:.3f} s")
    print(f"  speed-up: {sk_t / ours_t:.1f}x (values agree to 1e-9)")


if __name__ == "__main__":
    main()
