"""Diversity over training in a Lightning `Trainer` (torch-uncertainty's routines included).

    from ensdiag.lightning import DiversityCallback
    trainer = lightning.Trainer(callbacks=[DiversityCallback(val_loader, num_members=4)])

Before the first epoch (epoch 0, initialisation) and after every training epoch the callback
measures the members on `val` and writes a row of `ensdiag.Tracker`'s schema to
`path` (default: `<trainer.log_dir>/diversity.jsonl`), and logs `ensdiag/disagreement`,
`ensdiag/jsd` and `ensdiag/weight_cosine` to the trainer's loggers. Only global rank 0
measures. Measuring leaves training untouched: the module runs in eval mode (no dropout, no
BatchNorm statistics updated) with the random state forked, and every mode is restored.

At the end of `fit` (on `val`) and of `test` (on the trainer's test data), the callback runs
`ensdiag.diagnose` on the members (`ood=` adds an OOD split, `geometry=True` adds member
geometry — CKA, alignment, paths: minutes on a large network —, `diagnose=False` skips it)
and logs every headline number, the heatmaps and the summary to the trainer's loggers under `ensdiag/val/` and `ensdiag/test/` (TensorBoard,
MLflow and W&B loggers get images and text too; others the numbers); `callback.diagnosis`
keeps it.

The members are read from the LightningModule: `members(module)` when given (anything
`ensdiag.diagnose` takes: a list of `nn.Module`s, an `EnsembleModel`, a callable), else the
module itself as a callable whose outputs are `[k, B, C]`, or `[k·B, C]` member-major (as
torch-uncertainty's models return them) when `num_members` is given. Weight cosine needs
member weights: given by `members`, declared by the module (`member_weights()`, as for
`ensdiag.diagnose`), or read from a torch-uncertainty routine's `.model` (any ensemble
`ensdiag import` reads from torch-uncertainty's checkpoints).
"""

from pathlib import Path

import lightning

from .core import Context, Measure
from .ensembles import as_ensemble
from .errors import EnsdiagError
from .foreign.checkpoints import ensemble_from_states
from .integrations import log_to
from .results import diagnose  # the module's modes and the random state are kept by the core itself
from .tracker import Tracker


class DiversityCallback(lightning.Callback):
    def __init__(self, val, num_members: int | None = None, members=None, path=None, every_n_epochs: int = 1,
                 diagnose: bool = True, ood=None, geometry: bool = False):
        super().__init__()
        if num_members is not None and (not isinstance(num_members, int) or num_members < 1):
            raise EnsdiagError(f"num_members must be a positive integer, got {num_members!r}")
        if not isinstance(every_n_epochs, int) or isinstance(every_n_epochs, bool) or every_n_epochs < 1:
            raise EnsdiagError(f"every_n_epochs must be a positive integer, got {every_n_epochs!r}")
        self.val, self.num_members, self.members_of, self.every = val, num_members, members, every_n_epochs
        self.path = Path(path) if path is not None else None
        self.rows: list[dict] = []
        self.final, self.ood, self.geometry = diagnose, ood, geometry
        self.diagnosis = None  # the last diagnosis (fit end: on `val`; test end: on the trainer's test data)

    def _members(self, module):
        if self.members_of is not None:
            return self.members_of(module)
        model = _torch_uncertainty_model(module)
        if model is not None:
            return model
        return as_ensemble(module, num_members=self.num_members)  # the module itself: [k, B, C] or [k·B, C]

    def _measure(self, trainer, module, epoch: int):
        if not trainer.is_global_zero:
            return
        path = self.path or Path(trainer.log_dir or ".") / "diversity.jsonl"
        tracker = Tracker(self._members(module), self.val, path=path, device=module.device)
        row = tracker.measure(epoch)
        self.rows = tracker.rows
        logged = {f"ensdiag/{key}": value for key, value in row.items()
                  if key in ("disagreement", "jsd", "weight_cosine", "aligned_weight_cosine") and value is not None}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=trainer.global_step)

    def on_fit_start(self, trainer, module):
        if trainer.current_epoch == 0:
            self._measure(trainer, module, 0)

    def on_train_epoch_end(self, trainer, module):
        epoch = trainer.current_epoch + 1
        if epoch % self.every == 0 or epoch == trainer.max_epochs:
            self._measure(trainer, module, epoch)

    def _diagnose(self, trainer, module, data, stage: str):
        """`ensdiag.diagnose` of the members on `data` (and `ood`), logged to every trainer logger under
        `ensdiag/<stage>/`; the module's modes and the random state are as they were after."""
        if not self.final or data is None or not trainer.is_global_zero:
            return
        self.diagnosis = diagnose(self._members(module), test=data, ood=self.ood, measure=Measure(geometry=self.geometry),
                                  context=Context(device=module.device, progress=False))
        for logger in trainer.loggers:
            log_to(self.diagnosis, logger, step=trainer.global_step, prefix=f"ensdiag/{stage}")

    def on_fit_end(self, trainer, module):
        self._diagnose(trainer, module, self.val, "val")

    def on_test_end(self, trainer, module):
        loaders = trainer.test_dataloaders
        self._diagnose(trainer, module, loaders[0] if isinstance(loaders, (list, tuple)) else loaders, "test")


def _torch_uncertainty_model(module):
    """An `EnsembleModel` holding the weights of a torch-uncertainty routine's `.model`, or None."""
    inner = getattr(module, "model", None)
    if inner is None or not hasattr(inner, "state_dict"):
        return None
    try:
        model = ensemble_from_states([inner.state_dict()], "the LightningModule's model")
    except EnsdiagError:
        return None
    return model.to(module.device)
