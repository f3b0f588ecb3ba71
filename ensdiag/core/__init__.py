"""The inspection core: every ensemble, every way in, one way through.

    diagnosis = inspect(ensemble, {"id": test, "ood": ood})   # any Ensemble (ensembles/), data in any form
    diagnosis = inspect_predictions({"id": {"logits", "labels"}})  # member logits made anywhere
    diagnosis.metrics                                          # metrics.json's layout, the same on every path

- `inspection.py`: inspect() and inspect_predictions(): predict (one loop) ─▶ check (one place) ─▶
  predictions analyzers with their intervals ─▶ model analyzers ─▶ one metrics dict;
- `diagnose.py`: ensdiag.diagnose(), any ensemble and any data from Python;
- `diagnosis.py`: the `Diagnosis`, the data every path returns;
- `predict.py`: the one prediction loop; `intervals.py`: example-level intervals;
- `planning.py`, `planned_geometry.py`: a time budget and a precision target;
- `inputs.py`: what `evaluate` and `diversity` measure a model on (a preset's data or yours).

The core imports nothing from report/, export or integrations: those read a `Diagnosis`.
"""

from .diagnose import diagnose
from .diagnosis import Diagnosis
from .inspection import Context, Measure, describe, inspect, inspect_predictions, member_weights

__all__ = ["Context", "Diagnosis", "Measure", "describe", "diagnose", "inspect", "inspect_predictions", "member_weights"]
