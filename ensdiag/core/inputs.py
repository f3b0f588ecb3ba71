"""What `ensdiag evaluate` and `diversity` measure a model on — a preset's data (given, or the
one whose architecture, inputs and classes fit the model) or yours, with any set replaced — and
the preprocessing: the inputs the inspection core (core/inspection.py) takes.

    inputs = prepare(model, DataChoice(data="mine.npz"), data_dir="data")
    diagnosis = inspect(model, inputs.splits, preprocess=inputs.preprocess, device=inputs.device, …)

Whether data fits a model is asked of the network itself (a forward on the meta device, no
memory), not of the input size its file records: torchvision's ResNet-18 takes CIFAR's 32×32.
"""

from contextlib import suppress
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

from ..config import PRESETS, preset_config, preset_for
from ..data.batching import Normalize
from ..data.files import load_files
from ..data.preset import PresetData, load_preset_data, ood_set, shift_set, training_examples
from ..data.registry import Split
from ..device import resolve_device
from ..errors import DataNotFound, EnsdiagError
from ..nn.model import build_from_spec
from ..numbers import normalize_option


def guess_preset(spec) -> str:
    """The preset whose architecture, input shape and classes match the model's."""
    found = preset_for(spec)
    if found is not None:
        return found
    raise EnsdiagError(f"no preset fits a {spec.arch} on inputs {tuple(spec.input_shape)} with {spec.num_classes} "
                       f"classes; pass --preset ({', '.join(PRESETS)})")


@dataclass(frozen=True)
class DataChoice:
    """What `evaluate` and `diversity` measure on: a preset's data (given, or the one the model
    fits), with any set replaced: `data` (your test images), `shift`, `ood` (a registered
    dataset or your files), `normalize` ("MEAN,…:STD,…", "none", or None for the model's own)."""

    preset: str | None = None
    data: str | None = None
    shift: str | None = None
    ood: str | None = None
    normalize: str | None = None


@dataclass
class Inputs:
    """The core's inputs for one model: {split: Split}, the preprocessing, the device, the split
    titles and skipped splits, and the training split (BatchNorm statistics along paths) or None."""

    splits: dict
    preprocess: Normalize
    device: torch.device
    titles: dict
    skipped: dict
    train: Split | None = None


def fits(model, input_shape) -> str | None:
    """None when the model maps images of `input_shape` to logits, else why not: asked of the network
    by a forward on the meta device (nothing allocated, nothing computed)."""
    try:
        with torch.device("meta"):
            skeleton = build_from_spec(model.spec)
            out = skeleton(torch.empty(2, *input_shape))
    except Exception as error:  # any failure of the user's shape is the answer, not a crash
        text = " ".join(str(error).split())[:120]
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    if out.dim() != 3 or out.shape[1] != 2 or out.shape[2] != model.num_classes:
        return f"it gives outputs of shape {tuple(out.shape)}"
    return None


def _checked_config(model, choice: DataChoice):
    """The preset's config with the choice's sets; None when only your data is measured and no
    preset fits the model."""
    try:
        preset = choice.preset or guess_preset(model.spec)
    except EnsdiagError:
        if choice.data is None:
            raise
        return None
    config = preset_config(preset, shift=choice.shift, ood=choice.ood)
    if choice.data is not None:
        return replace(config, input_shape=tuple(model.spec.input_shape))
    if tuple(config.input_shape) != tuple(model.spec.input_shape):
        reason = fits(model, config.input_shape)
        if reason is not None:
            raise EnsdiagError(f"the model does not run on the {config.preset} preset's {tuple(config.input_shape)} "
                               f"inputs ({reason}); pass a preset whose images fit it")
    return config


def normalization(model, choice: DataChoice, config) -> tuple[tuple, tuple]:
    """(mean, std) per channel: --normalize, else what the model file records, else the preset's."""
    channels = model.spec.input_shape[0]
    if choice.normalize is None:
        recorded = getattr(model, "preprocess", None)
        if recorded is not None:
            return recorded
        if config is None:
            raise EnsdiagError("no preset fits this model, so its input normalisation is unknown: pass --normalize "
                               "MEAN,…:STD,… (one value per channel) or --normalize none")
        return tuple(config.mean), tuple(config.std)
    if choice.normalize == "none":
        return (0.0,) * channels, (1.0,) * channels
    return normalize_option(choice.normalize, channels)


def _your_data(model, choice, config, data_dir, download) -> PresetData:
    """--data as the test split; shift and OOD from --shift/--ood, else the fitting preset's, else none."""
    test = load_files(choice.data, model.spec.input_shape, "--data", exact=False)
    shape = tuple(test.images.shape[1:])
    if shape != tuple(model.spec.input_shape) and (reason := fits(model, shape)) is not None:
        raise EnsdiagError(f"--data {choice.data}: the model does not run on images of shape {shape} (its file records "
                           f"{tuple(model.spec.input_shape)}; {reason})")
    if test.labels is not None and len(test.labels) and int(test.labels.max()) >= model.num_classes:
        raise EnsdiagError(f"--data {choice.data}: label {int(test.labels.max())} out of range for {model.num_classes} classes")
    titles, skipped = {"id": test.source}, {}
    sets = config or SimpleNamespace(shift=choice.shift, ood=choice.ood, shift_severity=5, ood_split="test")
    sets = SimpleNamespace(**{**vars(sets), "input_shape": shape}) if config is None else replace(config, input_shape=shape)
    shift = shift_set(sets, data_dir, titles, skipped) if sets.shift else {}
    ood = ood_set(sets, data_dir, download, titles, skipped) if sets.ood else None
    for name, given in (("shift", sets.shift), ("ood", sets.ood)):
        if not given:
            skipped[name] = f"no {name} set given (--{name} DATASET|PATH)"
    for split in [*shift.values(), *([ood] if ood is not None else [])]:
        if tuple(split.images.shape[1:]) != shape:
            raise EnsdiagError(f"{split.source}: images of shape {tuple(split.images.shape[1:])}, the test images {shape}")
    return PresetData(None, test, shift, ood, skipped, titles)


def prepare(model, choice: DataChoice | str | None = None, data_dir="data", download=False, device="auto",
            with_train=False, data: PresetData | None = None) -> Inputs:
    """The core's `Inputs` for a model (ensdiag's own: loaded or imported) on `device` (the caller puts
    the model there: it is ensdiag's object, not the user's); `with_train`: the preset's training split
    too, where it is on disk (member geometry recomputes BatchNorm statistics on it), else None in its place."""
    choice = choice if isinstance(choice, DataChoice) else DataChoice(preset=choice)
    config = _checked_config(model, choice)
    mean, std = normalization(model, choice, config)
    device = resolve_device(device) if isinstance(device, str) else device
    if data is None and choice.data is not None:
        data = _your_data(model, choice, config, data_dir, download)
    elif data is None and with_train:
        with suppress(DataNotFound):
            data = load_preset_data(config, data_dir, download, with_train=True)
    data = data or load_preset_data(config, data_dir, download, with_train=False)
    return Inputs(data.eval_splits(), Normalize(mean, std, device), device, data.titles, data.skipped,
                  training_examples(model, data.train))
