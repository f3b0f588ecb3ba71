"""The least barrier between two members over weight matching's restarts, and when to stop.

Weight matching (align.py) ends in a local optimum that depends on where it starts, and the
barrier along the path to the aligned member depends on the optimum far more than the aligned
cosine does: on one digits pair, 64 restarts gave test-loss barriers from 0.12 to 0.59, and the
least of 3 restarts was twice the least of 64. The number that answers "is there a low path
between these members?" is therefore the least over restarts, and how long one looked is part
of its definition. The rule, for each pair:

- restarts s = 0, 1, 2, … (`align.restart`: the aligned cosine's 3 from the member as it is, the
  others from seeded random permutations), fixed seeds, so `train`, `diversity` and `diagnose()`
  agree;
- a restart that reaches an alignment already found counts as a restart and costs nothing more;
- the first alignment is walked over the whole grid; every new one after it point by point,
  nearest t = ½ first (`paths.bounded_walk`, sharing the first walk's ends: every alignment's
  path joins the same two functions). A barrier is the largest excess over the grid, so the
  points evaluated bound it from below, and a walk stops as soon as no barrier of it can fall
  below the least found so far (its barriers are then kept as lower bounds). The least is
  exactly what walking every alignment whole would give; a walk that can lower nothing costs
  the few points, often one, that show it;
- restarting stops once `patience` restarts in a row lowered no barrier, after at least
  `minimum` restarts (a least over fewer would lose to any search of that many) and at most
  `limit` (or fewer where a budget says so); the result says which ended it.

Two rules, both stated with every result (`describe`): `FULL` (at least 24 restarts, until 12
in a row lowered none, at most 64) where the barrier gets its interval (`--detail`,
`diagnose(measure=Measure(detail=True))`), whose resamples draw the restarts, so the interval answers for the
search; and `QUICK` (at least 6, until 3 in a row lowered none, at most 12) otherwise, so that
the search adds little to `ensdiag train`'s per-run diagnosis (on the digits main job the full
rule made a Deep Ensemble's diagnosis 1.8× as costly; docs/conventions.md).

    found = least_over_restarts(alignment_of, evaluate, keys, **FULL._asdict())
    found["least"], found["alignments"], found["run"], found["stopped"]
"""

import math
from typing import NamedTuple

from .align import RESTARTS


class Rule(NamedTuple):
    """When a pair's restarting stops: after at least `minimum` restarts, once `patience` in a row
    lowered no barrier, and after `limit` at the latest."""
    minimum: int
    patience: int
    limit: int

    def capped(self, limit: int | None) -> "Rule":
        """The rule under a budget's cap on restarts (None: none)."""
        if limit is None or limit >= self.limit:
            return self
        return Rule(min(self.minimum, limit), self.patience, limit)


FULL = Rule(minimum=24, patience=12, limit=64)  # where the barrier gets its interval (--detail)
QUICK = Rule(minimum=6, patience=3, limit=12)  # otherwise: train's per-run diagnosis stays cheap
PATIENCE, MIN_RESTARTS, MAX_RESTARTS = FULL.patience, FULL.minimum, FULL.limit


def rule_for(detail: bool) -> Rule:
    return FULL if detail else QUICK


def describe(rule: Rule = FULL) -> str:
    """The stop rule in words (stored with every result)."""
    return (f"weight matching restarted (seeds 0, 1, …; the aligned cosine's {RESTARTS} from the member as trained, the "
            f"others from seeded random permutations) until {rule.patience} restarts in a row lowered no barrier, at "
            f"least {rule.minimum} and at most {rule.limit} restarts per pair; a path walked only as far as it could "
            "still lower one (nearest t = ½ first)")


def least_over_restarts(alignment_of, evaluate, keys, limit: int = MAX_RESTARTS, patience: int = PATIENCE,
                        minimum: int = MIN_RESTARTS) -> dict:
    """The restarts of one pair under the stop rule.

    `alignment_of(seed)` -> (a hashable key of the alignment, the aligned end state);
    `evaluate(end, least)` -> (curve, {barrier key: value}, complete): the path to `end`, whole
    where `least` is None (the first), else walked until none of its barriers can fall below
    `least` (complete False: the values are lower bounds); `keys`: the barriers that count.

    Returns {"alignments": [{"seeds", "complete", "barriers", "curve"}] in the order found,
    "least": {key: value}, "run": restarts run, "stopped": why}."""
    found, by_key, least = [], {}, {}
    last_new, stopped = 0, f"the cap of {limit} restarts"
    for seed in range(limit):
        key, end = alignment_of(seed)
        if key in by_key:
            by_key[key]["seeds"].append(seed)
        else:
            curve, barriers, complete = evaluate(end, dict(least) if found else None)
            if complete:
                if any(barriers[name] < least.get(name, math.inf) for name in keys):
                    last_new = seed
                least = {name: min(barriers[name], least.get(name, math.inf)) for name in keys}
            found.append({"seeds": [seed], "complete": complete, "barriers": barriers, "curve": curve})
            by_key[key] = found[-1]
        if seed + 1 >= minimum and seed - last_new >= patience:
            stopped = f"{patience} restarts in a row lowered no barrier"
            break
    return {"alignments": found, "least": least, "run": seed + 1, "stopped": stopped}
