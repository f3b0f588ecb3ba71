"""A time budget and a precision target: how many examples each step of a diagnosis reads.

    plan = Plan.of(budget="5m", precision=0.01)      # either may be None: Plan() reads everything
    diagnosis = inspect(ensemble, splits, measure=Measure(plan=plan))  # inspection.py asks the plan at every step
    diagnosis.metrics["budget"]                       # what was measured, with what precision, what was skipped

Every inspection has a plan: one without a budget or a target (`Plan()`, `limited` False) reads
every example of every split in order and runs every geometry step, so the core has one flow.

Every step's cost is measured, not guessed: the test split's first chunk times the ensemble
and the analyzers per example, CKA's pilot and one member's forward time member geometry, and
weights-only steps (alignment, rank) are timed as they run. The plan then gives each step the
examples it can afford:

- predictions get a share of the budget (`planned_predictions.PREDICTION_SHARE`, all of it without member
  geometry), spread so that every split family (id, shift, ood, val) reads the same number of
  examples where it has them, since the widest interval decides what a diagnosis can say; a
  split too small for its share gives the rest to the others;
- examples are read in a seeded random order (a split's first examples may be one class) and in
  doubling chunks; with a precision target a split stops once every headline number that
  reads it has an interval at most that half-width (`constructions.half_width`);
- member geometry then shares what is left (`planned_geometry.py`): CKA and paths read the same n where they can, paths
  on 3, then 2, then 1 pair of 11 points, then 1 adaptive pair, as n would otherwise fall below
  `PATH_EXAMPLES_FLOOR` (an adaptive path is costed at its worst, 11 points); a step that cannot
  run says why (`skipped`), never silently.

A subsample's intervals carry `full_split`, the interval for what the whole split would give
(`constructions.py`).
"""

import math
import time
from dataclasses import dataclass, field

from ..ensembles import measuring
from ..errors import EnsdiagError
from ..numbers import parse_precision, parse_seconds
from .planned_predictions import RESERVE, predict_planned
from .predict import predict_splits


@dataclass
class Plan:
    """The budget of one diagnosis and the record of what each step measured."""

    seconds: float | None = None
    precision: float | None = None
    geometry: bool = True
    started: float = field(default_factory=time.perf_counter)
    steps: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)  # measured seconds per example (or per step for weights-only steps)
    full: dict = field(default_factory=dict)  # split -> its size, where it was subsampled
    sizes: dict = field(default_factory=dict)  # split -> its size (None: a stream of unknown length)

    @classmethod
    def of(cls, budget=None, precision=None, geometry=True) -> "Plan":
        """The plan of a budget ("5m", "90s", seconds) and/or a precision target (either may be None)."""
        return cls(parse_seconds(budget), parse_precision(precision), geometry)

    @property
    def limited(self) -> bool:
        """A budget or a precision target chooses the examples (otherwise every one is read)."""
        return self.seconds is not None or self.precision is not None

    def predict(self, ensemble, splits: dict, preprocess, device, seed: int, spread: bool, progress, keep: int):
        """({split: {"logits", "labels"}}, {split: kept Split for geometry}) of the examples this plan reads."""
        if not self.limited:
            return predict_splits(ensemble, splits, preprocess, device, seed, spread, progress, keep)
        if spread:
            raise EnsdiagError("a budget or precision target chooses examples in one process: run it without torchrun")
        with measuring(ensemble, seed):
            return predict_planned(self, ensemble, splits, preprocess, device, keep, progress)

    def allowance(self, generic: float) -> float:
        """Seconds an analyzer without a vectorised resampler may spend re-running for its intervals."""
        return generic if self.seconds is None else min(generic, max(self.remaining() / 10, 1.0))

    def spent(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        return math.inf if self.seconds is None else max(0.0, self.seconds * (1 - RESERVE) - self.spent())

    def record(self, step: str, **facts) -> None:
        self.steps.append({"step": step, **facts})

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "precision_target": self.precision, "spent_seconds": round(self.spent(), 2),
                "costs": {key: round(value, 6) for key, value in self.costs.items()}, "steps": self.steps,
                "skipped": self.skipped, **({"full_estimate_seconds": round(self.estimate, 1)}
                                            if getattr(self, "estimate", None) is not None else {})}
