"""A diagnosis in Weights & Biases (`pip install 'ensdiag[wandb]'`; offline mode works too).

    run = wandb.init(project="ensembles")
    diagnosis.log_to(run)                 # or diagnosis.log_to(wandb): the current run

Scalars and the heatmaps (a `wandb.Image`) in one `run.log` call, the summary line and what
was not measured in the run's summary. W&B's step only grows: without a `step`, the call takes
the run's next one; `step_metric` logs the step as a number instead (as Lightning's
WandbLogger does with `trainer/global_step`).
"""

import wandb

from ..errors import EnsdiagError
from ._records import Records


def log(records: Records, run, step: int | None = None, step_metric: str | None = None) -> None:
    data = dict(records.scalars)
    try:
        data.update({name: wandb.Image(image, caption=name) for name, image in records.images.items()})
        if step_metric is not None and step is not None:
            data[step_metric] = step
            run.log(data)
        else:
            run.log(data, step=step)
        for name, text in records.texts.items():
            run.summary[name] = text
    except wandb.Error as error:  # (a finished run, a name W&B refuses)
        raise EnsdiagError(f"W&B refused the records: {str(error)[:300]}") from error


def run_of(target):
    if getattr(target, "__name__", None) == "wandb":
        if target.run is None:
            raise EnsdiagError("no W&B run: call wandb.init() first, or pass the run")
        return target.run
    return target
