"""Optional integrations with other libraries (each needs its extra, and each module imports
only its own library): `lightning` (DiversityCallback), `tensorboard`, `mlflow`, `wandb`.

    log_records(diagnosis_records(metrics), target, step)   # what Diagnosis.log_to does

`log_records` picks the integration from the target's type, by name (`LOGGERS`, each registered
with `LOGGERS.register`), so this module imports none of those libraries: a TensorBoard SummaryWriter, an MLflow run (the `mlflow` module with
an active run, a Run, an ActiveRun), a W&B run (or the `wandb` module), or a Lightning logger
(TensorBoardLogger, MLFlowLogger and WandbLogger through their experiment; any other logger
gets the scalars through its `log_metrics`).
"""

from ..errors import EnsdiagError, public
from ..registry import Registry
from ..report import make_report
from . import tensorboard
from ._records import checked_step, diagnosis_records, report_records


def _class_names(target) -> set[str]:
    return {cls.__name__ for cls in type(target).__mro__}


def _root(target) -> str:
    """The top-level package of the target's type (or of the target, for a module)."""
    name = getattr(target, "__name__", None) if type(target).__name__ == "module" else type(target).__module__
    return (name or "").split(".")[0]


# what it is -> write(records, target, step), tried in the order registered, for the targets `recognises(target)`
# accepts (a test of the target's type by name: no library is imported to recognise it, each `write` imports its own)
LOGGERS = Registry("logger")


@LOGGERS.register("a TensorBoard SummaryWriter or Lightning's TensorBoardLogger", recognises=lambda target: (
                  "TensorBoardLogger" in _class_names(target) or all(hasattr(target, call) for call in (
                      "add_scalar", "add_image", "add_text"))))
def _tensorboard(records, target, step):
    tensorboard.log(records, target.experiment if "TensorBoardLogger" in _class_names(target) else target, step)


@LOGGERS.register("Lightning's MLFlowLogger", recognises=lambda target: "MLFlowLogger" in _class_names(target))
def _lightning_mlflow(records, target, step):
    from .mlflow import log
    log(records, target.experiment, target.run_id, step)


@LOGGERS.register("Lightning's WandbLogger", recognises=lambda target: "WandbLogger" in _class_names(target))
def _lightning_wandb(records, target, step):
    from .wandb import log
    log(records, target.experiment, step, step_metric="trainer/global_step")


@LOGGERS.register("any other Lightning logger", recognises=lambda target: _root(target) in ("lightning",
                  "pytorch_lightning") and hasattr(target, "log_metrics"))
def _lightning_other(records, target, step):
    target.log_metrics(records.scalars, step)  # e.g. CSVLogger: numbers only


@LOGGERS.register("an MLflow run (or the mlflow module with an active run)",
                  recognises=lambda target: _root(target) == "mlflow")
def _mlflow(records, target, step):
    from .mlflow import MlflowClient, log, run_id_of
    log(records, MlflowClient(), run_id_of(target), step)


@LOGGERS.register("a W&B run (or the wandb module)", recognises=lambda target: _root(target) == "wandb")
def _wandb(records, target, step):
    from .wandb import log, run_of
    log(records, run_of(target), step)


@public
def log_records(records, target, step: int | None = None) -> None:
    """Write `records` (_records.py) to the logger `target`: the first registered logger that recognises it."""
    checked_step(step)
    if (found := LOGGERS.recognise(target)) is not None:
        return LOGGERS[found](records, target, step)
    raise EnsdiagError(f"cannot log to a {type(target).__name__}: give a TensorBoard SummaryWriter, an MLflow run "
                       "(or the mlflow module with an active run), a W&B run (or the wandb module), or a "
                       "Lightning logger")


def log_to(diagnosis, target, step: int | None = None, prefix: str = "ensdiag") -> None:
    """A diagnosis's records (every headline number, the heatmaps, the summary) to `target`."""
    checked_step(step, prefix)
    log_records(diagnosis_records(diagnosis.metrics, prefix), target, step)


@public
def log_report(run_dir, target, step: int | None = None, prefix: str = "ensdiag") -> None:
    """A run folder's report to `target`: every cell's mean over seeds (`<prefix>/<method>/<number>`),
    the verdict's shares (`<prefix>/verdict/<method>/<nll|ece|auroc|diversity>`) and answers, and its
    figures (rebuilt in the folder, as `ensdiag report` does)."""
    checked_step(step, prefix)
    report = make_report(run_dir)
    log_records(report_records(report, run_dir if report.get("figures") else None, prefix), target, step)
