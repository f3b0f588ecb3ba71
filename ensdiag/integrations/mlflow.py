"""A diagnosis in MLflow (`pip install 'ensdiag[mlflow]'`: the tracking client, mlflow-skinny).

    with mlflow.start_run():
        diagnosis.log_to(mlflow)                       # the active run
    diagnosis.log_to(mlflow.get_run(run_id))           # or any run; log(records, client, run_id)

Scalars as the run's metrics at `step` (one batch call), the heatmaps as an image artifact,
the summary line and what was not measured as text artifacts, and metrics.json itself under
`ensdiag/`. MLflow keeps metric names of letters, digits, '_', '-', '.', ' ' and '/': other
characters become '_'.
"""

import re
import time

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ..errors import EnsdiagError, public
from ._records import Records, checked_step, diagnosis_records


def _key(name: str) -> str:
    return re.sub(r"[^\w\-. /]", "_", name)


def log(records: Records, client: MlflowClient, run_id: str, step: int | None = None) -> None:
    stamp = int(time.time() * 1000)
    metrics = [Metric(_key(name), value, stamp, step or 0) for name, value in records.scalars.items()]
    try:
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(run_id, metrics=metrics[start:start + 1000])
        for name, image in records.images.items():
            client.log_image(run_id, image, artifact_file=f"{name}.png")
        for name, text in records.texts.items():
            client.log_text(run_id, text, f"{name}.txt")
        for name, document in records.documents.items():
            client.log_dict(run_id, document, name)
    except MlflowException as error:  # (a run id or a name MLflow refuses, a store it cannot reach)
        raise EnsdiagError(f"MLflow refused to log to run {str(run_id)[:80]!r}: {str(error)[:300]}") from error


def run_id_of(target) -> str:
    """The run id of the `mlflow` module (its active run), a Run, an ActiveRun or a run id."""
    if isinstance(target, str):
        return target
    if getattr(target, "__name__", None) == "mlflow":
        active = target.active_run()
        if active is None:
            raise EnsdiagError("no active MLflow run: log inside `with mlflow.start_run():` or pass the run")
        return active.info.run_id
    info = getattr(target, "info", None)
    if info is not None and isinstance(getattr(info, "run_id", None), str):
        return info.run_id
    raise EnsdiagError(f"not an MLflow run: {type(target).__name__} (pass mlflow, a Run or a run id)")


@public
def log_diagnosis(diagnosis, target, step: int | None = None, prefix: str = "ensdiag", client=None) -> None:
    checked_step(step, prefix)
    log(diagnosis_records(diagnosis.metrics, prefix), client or MlflowClient(), run_id_of(target), step)
