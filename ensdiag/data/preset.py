"""A preset's data in one place: train/validation/test, shift sets, OOD set, normalisation.

Shift and OOD sets that are not on disk are skipped with the reason recorded (a damaged one
is an error: it must not silently vanish from the results); missing training data is an
error that names the files and the --download flag.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import DataNotFound, EnsdiagError
from ..io import is_path
from .files import load_files
from .registry import Split, get_dataset


@dataclass
class PresetData:
    train: Split | None  # the full training split (None when only evaluating); validation is held out per seed
    test: Split
    shift: dict[str, Split]  # corruption -> split
    ood: Split | None
    skipped: dict[str, str] = field(default_factory=dict)  # split -> why it was skipped
    titles: dict[str, str] = field(default_factory=dict)  # split -> what it really is

    def eval_splits(self) -> dict[str, Split]:
        """Evaluation splits under the names of predictions files: id, shift/<c>, ood."""
        splits = {"id": self.test}
        splits.update({f"shift/{name}": split for name, split in self.shift.items()})
        if self.ood is not None:
            splits["ood"] = self.ood
        return splits


def load_preset_data(config, data_dir, download=False, with_train=True) -> PresetData:
    data_dir = Path(data_dir)
    dataset = get_dataset(config.dataset)
    try:
        train = dataset.load(data_dir, "train", download) if with_train else None
        test = dataset.load(data_dir, "test", download)
    except DataNotFound as error:
        raise DataNotFound(f"{'training' if with_train else 'test'} data missing: {error}"
                           + ("" if "--download" in str(error) else " (or pass --download)")) from None
    skipped, titles = {}, {"id": f"{dataset.title} test"}
    shift, ood = shift_set(config, data_dir, titles, skipped), ood_set(config, data_dir, download, titles, skipped)
    present = [split for split in [train, test, *shift.values(), ood] if split is not None]
    for split in present:
        if tuple(split.images.shape[1:]) != tuple(config.input_shape):
            raise EnsdiagError(f"{split.source}: images of shape {tuple(split.images.shape[1:])}, "
                               f"the {config.preset} preset expects {tuple(config.input_shape)}")
        if split.labels is not None and len(split.labels) and int(split.labels.max()) >= config.num_classes:
            raise EnsdiagError(f"{split.source}: label {int(split.labels.max())} out of range for {config.num_classes} classes")
    return PresetData(train, test, shift, ood, skipped, titles)


def shift_set(config, data_dir, titles, skipped) -> dict[str, Split]:
    """The shift set: a registered dataset (missing files: skipped, with the reason) or your files."""
    if is_path(config.shift):
        split = load_files(config.shift, config.input_shape, "--shift")
        titles["shift"] = split.source
        return {"files": split}
    dataset = get_dataset(config.shift)
    options = {"severity": config.shift_severity} if config.shift == "cifar10-c" else {}
    try:
        shift = dataset.load(data_dir, "test", **options)
    except DataNotFound as error:  # only missing data is skipped: a damaged file is an error
        skipped["shift"] = str(error)
        return {}
    details = [f"severity {config.shift_severity}"] if options else []
    details += [note] if (note := dataset.coverage(shift)) else []  # a partial set says so wherever it is shown
    titles["shift"] = dataset.title + (f" ({'; '.join(details)})" if details else "")
    return shift


def ood_set(config, data_dir, download, titles, skipped) -> Split | None:
    """The OOD set, unlabelled (its classes are not the model's): a registered dataset or your files."""
    if is_path(config.ood):
        ood = load_files(config.ood, config.input_shape, "--ood")
        titles["ood"] = ood.source
        return Split(ood.images, None, ood.source)
    dataset = get_dataset(config.ood)
    try:
        ood = dataset.load(data_dir, config.ood_split, download)
    except DataNotFound as error:
        skipped["ood"] = str(error)
        return None
    titles["ood"] = f"{dataset.title} {config.ood_split}"
    return Split(ood.images, None, ood.source)


def training_source(kept: int, held: int, seed: int) -> str:
    """What a training split is, in words: the examples the members trained on."""
    if not held:
        return f"the training split ({kept} examples, none held out)"
    return f"the training split without its {held} validation examples ({kept} examples; held out at training, seed {seed})"


def training_examples(model, train):
    """The training split as `model` was trained on it: without the validation examples its file
    records holding out (`ensdiag.holdout`), else whole, and its `source` says which."""
    if train is None:
        return None
    recorded = getattr(model, "holdout", None)
    if recorded is not None and recorded["train_size"] == len(train):
        kept, held = holdout(len(train), recorded["fraction"], recorded["seed"])
        return Split(train.images[kept], train.labels[kept], training_source(len(kept), len(held), recorded["seed"]))
    return Split(train.images, train.labels, f"the whole training split ({len(train)} examples; the model file does not "
                                             "record which were held out for validation, so they may be among them)")


def holdout(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, validation indices): a seeded split of 0..n-1; no validation for fraction 0."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(n * fraction)) if fraction > 0 else 0
    return order[n_val:].sort().values, order[:n_val].sort().values
