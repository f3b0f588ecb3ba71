"""Aggregation over seeds: the report's one convention, mean ± t_{0.975, n−1}·s/√n, which the
tables (aggregate.py) and the verdict (verdict.py) both use."""

import math

from scipy import stats


def mean_ci(values: list[float]) -> dict:
    n = len(values)
    if n == 0:
        return {"mean": None, "ci": None, "n": 0, "values": []}
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "ci": None, "n": 1, "values": values}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return {"mean": mean, "ci": float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n), "n": n, "values": values}
