"""The layout of a diagnosis's numbers as metrics.json holds them, readable without torch (the
report re-renders a cached report from it: report/cached.py): the report's tables, key paths,
numbers made JSON-safe, one metric's entry (`metric`) and the split kinds. analysis/registry.py builds on these."""

import math
from numbers import Integral, Real

SPLIT_TABLES = ("id", "shift", "ood")  # the report's per-split tables; "{split}" in a path means theirs
# The headline: the per-split tables, diversity and the ensemble's gain (the verdict reads them). Their
# example-level columns get intervals on every run; every other table's (the detail catalogue) on request.
HEADLINE_TABLES = (*SPLIT_TABLES, "diversity", "gain")
DEFAULT_SCORE = "msp"  # the OOD score (1 − max p̄) the report shows unless asked for another


def lookup(node, path):
    """(the value at key path `path` of an analyzer's nested result, True), or (None, False) where the path breaks."""
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None, False
        node = node[key]
    return node, True


def non_finite(node):
    """(node with every NaN/±inf float replaced by None, the set of non-finite kinds found)."""
    if isinstance(node, float) or (isinstance(node, Real) and not isinstance(node, (bool, Integral))):
        if math.isnan(node):
            return None, {"nan"}
        if math.isinf(node):
            return None, {"inf" if node > 0 else "-inf"}
        return node, set()
    if isinstance(node, (list, tuple)):
        pairs = [non_finite(child) for child in node]
        return [value for value, _ in pairs], set().union(*(kinds for _, kinds in pairs))
    if isinstance(node, dict):
        pairs = {key: non_finite(child) for key, child in node.items()}
        return {key: value for key, (value, _) in pairs.items()}, set().union(*(kinds for _, kinds in pairs.values()))
    return node, set()


def finite(node):
    """The node (numbers, lists, dicts) with every NaN and ±inf replaced by None: JSON-safe."""
    return non_finite(node)[0]


def is_ood_split(name: str) -> bool:
    """OOD splits (`ood`, `ood/<part>`) are unlabelled by definition: whatever labels the
    dataset carries on disk (FashionMNIST's, SVHN's) name classes the model never learned."""
    return name == "ood" or name.startswith("ood/")


def metric(value, definition: str, status: str | None = None, **extra) -> dict:
    """One reported number (or list, or matrix) with its definition and a status.

    Non-finite numbers are not JSON: NaN, +inf and −inf become None (null), also inside lists
    and matrices, and `status` says what was there: "ok" (every number finite), "nan", "inf" or
    "-inf" (a scalar), "non-finite" (a list or matrix with some such entries); "n/a" for a value
    given as None (not defined for these inputs). An explicit `status` (e.g. "empty" for a split
    with no samples) overrides the computed one. `extra` entries are made JSON-safe the same way."""
    value, kinds = non_finite(value)
    if status is None:
        if not kinds:
            status = "n/a" if value is None else "ok"
        else:  # value None: a non-finite scalar, named by its kind
            status = kinds.pop() if value is None else "non-finite"
    return {"value": value, "definition": definition, "status": status, **finite(extra)}


def empty_metric(definition: str, **extra) -> dict:
    """A metric of a split without samples: undefined, None with status "empty"."""
    return metric(None, definition, status="empty", **extra)
