"""One model file x a preset's evaluation data -> predictions and metrics (`ensdiag evaluate`/`diversity`)."""

from dataclasses import dataclass, replace
from types import SimpleNamespace

from .config import PRESETS, preset_config
from .data.batching import Normalize
from .data.preset import PresetData, load_preset_data
from .errors import DataNotFound, EnsdiagError
from .device import resolve_device
from .predict import predict
from .predictions import with_pooled_shift


def guess_preset(spec) -> str:
    """The preset whose architecture and input shape match the model's."""
    for name, config in PRESETS.items():
        if config.arch == spec.arch and tuple(config.input_shape) == tuple(spec.input_shape) \
                and config.num_classes == spec.num_classes:
            return name
    raise EnsdiagError(f"no preset fits a {spec.arch} on inputs {tuple(spec.input_shape)} with {spec.num_classes} "
                       f"classes; pass --preset ({', '.join(PRESETS)})")


@dataclass(frozen=True)
class DataChoice:
    """What `evaluate` and `diversity` measure on: a preset's data (given, or the one the model
    fits), with any set replaced: `data` (your test images), `shift`, `ood` (a registered
    dataset or your files), `normalize` ("MEAN,…:STD,…", "none", or None for the preset's)."""

    preset: str | None = None
    data: str | None = None
    shift: str | None = None
    ood: str | None = None
    normalize: str | None = None


def _checked_config(model, choice: DataChoice):
    """(the preset's config with the choice's sets, whether the model runs on other image sizes);
    (None, False) when only your data is measured and no preset fits the model."""
    from .nn import ARCHITECTURES
    try:
        preset = choice.preset or guess_preset(model.spec)
    except EnsdiagError:
        if choice.data is None:
            raise
        return None, False
    config = preset_config(preset, shift=choice.shift, ood=choice.ood)
    flexible = ARCHITECTURES[model.spec.arch].any_input_size and config.input_shape[0] == model.spec.input_shape[0]
    if choice.data is not None:
        config = replace(config, input_shape=tuple(model.spec.input_shape))
    elif tuple(config.input_shape) != tuple(model.spec.input_shape) and not flexible:
        raise EnsdiagError(f"the {config.preset} preset has inputs {tuple(config.input_shape)}, the model "
                           f"{tuple(model.spec.input_shape)}")
    return config, flexible


def normalization(model, choice: DataChoice, config) -> tuple[tuple, tuple]:
    """(mean, std) per channel: --normalize, else the preset's."""
    channels = model.spec.input_shape[0]
    if choice.normalize is None:
        if config is None:
            raise EnsdiagError("no preset fits this model, so its input normalisation is unknown: pass --normalize "
                               "MEAN,…:STD,… (one value per channel) or --normalize none")
        return tuple(config.mean), tuple(config.std)
    if choice.normalize == "none":
        return (0.0,) * channels, (1.0,) * channels
    from .quickcheck import normalize_option
    return normalize_option(choice.normalize, channels)


def load_data(model, choice: DataChoice | str | None = None, data_dir="data", download=False, with_train=False):
    """The data a model is measured on; `with_train`: the preset's training split too, where it
    is on disk (member geometry recomputes BatchNorm statistics on it), else None in its place."""
    choice = choice if isinstance(choice, DataChoice) else DataChoice(preset=choice)
    config, _ = _checked_config(model, choice)
    if choice.data is not None:
        return _your_data(model, choice, config, data_dir, download)
    if with_train:
        try:
            return load_preset_data(config, data_dir, download, with_train=True)
        except DataNotFound:
            pass
    return load_preset_data(config, data_dir, download, with_train=False)


def _your_data(model, choice, config, data_dir, download) -> PresetData:
    """--data as the test split; shift and OOD from --shift/--ood, else the fitting preset's, else none."""
    from .data.files import load_files
    from .data.preset import _ood, _shift
    test = load_files(choice.data, model.spec.input_shape, "--data")
    if test.labels is not None and len(test.labels) and int(test.labels.max()) >= model.num_classes:
        raise EnsdiagError(f"--data {choice.data}: label {int(test.labels.max())} out of range for {model.num_classes} classes")
    titles, skipped = {"id": test.source}, {}
    sets = config or SimpleNamespace(shift=choice.shift, ood=choice.ood, input_shape=tuple(model.spec.input_shape),
                                     shift_severity=5, ood_split="test")
    shift = _shift(sets, data_dir, titles, skipped) if sets.shift else {}
    ood = _ood(sets, data_dir, download, titles, skipped) if sets.ood else None
    for name, given in (("shift", sets.shift), ("ood", sets.ood)):
        if not given:
            skipped[name] = f"no {name} set given (--{name} DATASET|PATH)"
    for split in [*shift.values(), *([ood] if ood is not None else [])]:
        if tuple(split.images.shape[1:]) != tuple(model.spec.input_shape):
            raise EnsdiagError(f"{split.source}: images of shape {tuple(split.images.shape[1:])}, the model takes "
                               f"{tuple(model.spec.input_shape)}")
    return PresetData(None, test, shift, ood, skipped, titles)


def model_probe(model, data, choice: DataChoice | str | None = None, device="auto", seed=0, max_examples=None,
                path_points=11):
    """A `ModelProbe` of the model on its data (analysis.geometry)."""
    from .analysis.geometry import ModelProbe
    choice = choice if isinstance(choice, DataChoice) else DataChoice(preset=choice)
    config, _ = _checked_config(model, choice)
    device = resolve_device(device)
    mean, std = normalization(model, choice, config)
    return ModelProbe(model.to(device), {"id": data.test, "ood": data.ood}, Normalize(mean, std, device),
                      data.train.images if data.train is not None else None, max_examples, seed,
                      train_labels=data.train.labels if data.train is not None else None, path_points=path_points)


def evaluate_model(model, choice: DataChoice | str | None = None, data_dir="data", download=False, device="auto", seed=0,
                   data=None, spread=False):
    """(predictions with pooled shift, split titles, skipped splits {name: reason}) for a model;
    `data`: the data (`load_data`) when the caller has loaded it. With `spread`, under torchrun,
    every rank predicts its share of each split and all get the whole (predict.py)."""
    from . import distributed
    choice = choice if isinstance(choice, DataChoice) else DataChoice(preset=choice)
    config, flexible = _checked_config(model, choice)
    mean, std = normalization(model, choice, config)
    ranks, device = distributed.start(device) if spread else (distributed.Ranks(), resolve_device(device))
    if data is None:
        if download and not ranks.main:
            distributed.barrier()  # rank 0 downloads first
        data = load_data(model, choice, data_dir, download and ranks.main)
        if download and ranks.main:
            distributed.barrier()
    model = model.to(device)
    try:
        predictions = predict(model, data.eval_splits(), Normalize(mean, std, device), device, seed=seed,
                              spread=ranks.distributed)
    except EnsdiagError:
        raise  # already one line for the user
    except (AssertionError, RuntimeError, ValueError) as error:
        if not flexible or config is None or tuple(config.input_shape) == tuple(model.spec.input_shape):
            raise
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
        raise EnsdiagError(f"the model does not run on the {config.preset} preset's {tuple(config.input_shape)} inputs "
                           f"({reason}); pass a preset whose images fit it") from None
    return with_pooled_shift(predictions), data.titles, data.skipped
