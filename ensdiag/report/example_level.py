"""Example-level uncertainty in a report's cells, beside the seed-level one.

Each metric a run's analyzers declare carries its example-level interval in metrics.json
(`ensdiag/core/intervals.py`): a 95 % confidence interval for its value on the population the test
examples were drawn from.
A cell over seeds shows the seed-level Student-t interval (aggregate.py); this adds, as what
it is, the example-level one:

- one seed: that run's interval, `0.031 [0.024, 0.039] (n = 10,000)`;
- several seeds: the mean over seeds of each seed's example-level half-width, `± 0.004 (test
  set)`. The seeds share one test set, so their test-set errors are correlated: the half-width
  of their mean is at most this mean (the standard deviation of a sum is at most the sum of
  the standard deviations), and equal to it when the seeds err alike on the same examples.
"""

from ..text import counted
from .load import _number, dig

EXAMPLES_DEFINITION = ("test set: a 95 % confidence interval for the value on the population the test examples were drawn "
                       "from (a bootstrap over them, stored in each run's metrics.json); for one seed the run's own "
                       "interval, for several the mean over seeds of each seed's half-width, an upper bound on their "
                       "mean's (the seeds share one test set); [0, …] on an unsigned calibration error: the signed "
                       "error (over-confidence) decides whether the model may be calibrated")


class Declared:
    """A declared column's value of one run (`value_of(run)`, aggregate.py's reader) with its interval entry."""

    def __init__(self, read, analyzer: str, path: tuple):
        self.read, self.analyzer, self.path = read, analyzer, path

    def __call__(self, run):
        return self.read(run)

    def interval(self, run) -> dict | None:
        node = dig(run["metrics"]["analyzers"], (self.analyzer, *self.path[:-1], "interval"))
        return node if isinstance(node, dict) and all(_number(node.get(key)) for key in ("low", "high")) else None


def example_cell(seeds: dict, value_of) -> dict:
    """{"example": …} for a cell whose runs carry intervals, else {}."""
    if not hasattr(value_of, "interval"):
        return {}
    entries = [entry for run in seeds.values() if run is not None and (entry := value_of.interval(run)) is not None]
    if not entries:
        return {}
    n = entries[0].get("n")
    if len(entries) == 1:
        entry = entries[0]
        return {"example": {"low": entry["low"], "high": entry["high"], "n": n, "level": entry.get("level"),
                            "method": entry.get("method"), **({"strata": entry["strata"]} if "strata" in entry else {}),
                            **({"bound": "upper"} if entry.get("bound") == "upper" else {})}}
    half = sum((entry["high"] - entry["low"]) / 2 for entry in entries) / len(entries)
    return {"example": {"half_width": half, "n": n, "seeds": len(entries)}}


def bounds_text(entry: dict, number) -> str:
    """" [0.024, 0.039]", or " (≤ 0.039)" for an upper bound (an unsigned error whose interval starts at 0:
    the data are consistent with no error, so only the upper end says anything; docs/conventions.md)."""
    if entry.get("bound") == "upper":
        return f" (≤ {number(entry['high'])})"
    return f" [{number(entry['low'])}, {number(entry['high'])}]"


def example_text(example: dict, number) -> str:
    """What a rendered cell adds for its example-level interval (`number` formats a value)."""
    if "half_width" in example:
        return f" (test set ± {number(example['half_width'])})"
    strata = example.get("strata")
    size = (" + ".join(f"{count:,} {split}" for split, count in strata.items()) if isinstance(strata, dict)
            else f"{example['n']:,}" if isinstance(example.get("n"), int) else "?")
    return f"{bounds_text(example, number)} (n = {size})"


def budget_notes(runs: dict) -> dict:
    """{"<method> seed <seed>": lines} of the runs measured under a budget or precision target:
    what each step read and how precisely, and what was skipped and why (planning.py)."""
    return {f"{method} seed {seed}": lines for method, seeds in runs.items() for seed, run in seeds.items()
            if run is not None and (lines := budget_lines(run["metrics"]))}


def _duration(seconds) -> str:
    seconds = float(seconds)
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def budget_lines(metrics: dict) -> list[str]:
    """What a budget or precision target chose (planning.py): every step's examples and the precision
    reached, and every skipped step with its reason; [] for a diagnosis without one."""
    record = metrics.get("budget")
    if not isinstance(record, dict):
        return []
    asked = " and ".join(part for part in (
        f"a budget of {_duration(record['seconds'])}" if record.get("seconds") else "",
        f"a target half-width of {record['precision_target']:g}" if record.get("precision_target") else "") if part)
    lines = [f"{asked}: {_duration(record.get('spent_seconds', 0))} spent"
             + (f"; every example would take about {_duration(record['full_estimate_seconds'])}"
                if record.get("full_estimate_seconds") else "")]
    for step in record.get("steps", []):
        name, n = step["step"], step.get("n")
        if name.startswith("predict "):
            of = f" of {step['of']:,}" if step.get("of") else ""
            widest = (f", widest interval ±{step['half_width']:.3g} ({step['column']})" if step.get("half_width") is not None
                      else "")
            lines.append(f"{name}: {n:,}{of} examples ({step.get('stopped')}){widest}")
        elif name == "cka" and isinstance(n, dict):
            widths = step.get("half_width", {})
            lines.append("cka: " + ", ".join(f"{split} {count:,} examples" + (f" (±{widths[split]:.3g})" if widths.get(split)
                                                                               is not None else "")
                                             for split, count in n.items()))
        elif name == "paths" and n is not None:
            points = step.get("points", [])
            lines.append(f"paths: {counted(step['pairs'], 'pair')} × {'/'.join(map(str, points))} points on "
                         f"{n:,} test examples" + (f", BatchNorm on {step['batchnorm_images']:,} training images"
                                                   if step.get("batchnorm_images") else "")
                         + (f", {'/'.join(map(str, step['restarts']))} restarts of weight matching"
                            if step.get("restarts") else "")
                         + (f" (test-loss barrier ±{step['half_width']:.3g})" if step.get("half_width") is not None else ""))
        elif step.get("seconds") is not None:
            lines.append(f"{name}: {_duration(step['seconds'])}" + (f" ({step['status']}: {step['reason']})"
                                                                    if step.get("reason") else ""))
    lines += [f"{name}: skipped — {reason}" for name, reason in record.get("skipped", {}).items()]
    return lines
