"""One model file x a preset's evaluation data -> predictions and metrics (`ensdiag evaluate`/`diversity`)."""

from .config import PRESETS, preset_config
from .data.batching import Normalize
from .data.preset import load_preset_data
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


def _checked_config(model, preset):
    """(the preset's config, whether the model runs on other image sizes) for a model."""
    from .nn import ARCHITECTURES
    config = preset_config(preset or guess_preset(model.spec))
    flexible = ARCHITECTURES[model.spec.arch].any_input_size and config.input_shape[0] == model.spec.input_shape[0]
    if tuple(config.input_shape) != tuple(model.spec.input_shape) and not flexible:
        raise EnsdiagError(f"the {config.preset} preset has inputs {tuple(config.input_shape)}, the model "
                           f"{tuple(model.spec.input_shape)}")
    return config, flexible


def load_data(model, preset=None, data_dir="data", download=False, with_train=False):
    """A preset's data for a model; `with_train`: the training split too, where it is on disk
    (member geometry recomputes BatchNorm statistics on it), else None in its place."""
    config, _ = _checked_config(model, preset)
    if with_train:
        try:
            return load_preset_data(config, data_dir, download, with_train=True)
        except DataNotFound:
            pass
    return load_preset_data(config, data_dir, download, with_train=False)


def model_probe(model, data, preset=None, device="auto", seed=0, max_examples=None):
    """A `ModelProbe` of the model on a preset's data (analysis.geometry)."""
    from .analysis.geometry import ModelProbe
    config, _ = _checked_config(model, preset)
    device = resolve_device(device)
    return ModelProbe(model.to(device), {"id": data.test, "ood": data.ood}, Normalize(config.mean, config.std, device),
                      data.train.images if data.train is not None else None, max_examples, seed,
                      train_labels=data.train.labels if data.train is not None else None)


def evaluate_model(model, preset=None, data_dir="data", download=False, device="auto", seed=0, data=None, spread=False):
    """(predictions with pooled shift, split titles, skipped splits {name: reason}) for a model;
    `data`: the preset's data when the caller has loaded it. With `spread`, under torchrun,
    every rank predicts its share of each split and all get the whole (predict.py)."""
    from . import distributed
    config, flexible = _checked_config(model, preset)
    ranks, device = distributed.start(device) if spread else (distributed.Ranks(), resolve_device(device))
    if data is None:
        if download and not ranks.main:
            distributed.barrier()  # rank 0 downloads first
        data = load_preset_data(config, data_dir, download and ranks.main, with_train=False)
        if download and ranks.main:
            distributed.barrier()
    model = model.to(device)
    try:
        predictions = predict(model, data.eval_splits(), Normalize(config.mean, config.std, device), device, seed=seed,
                              spread=ranks.distributed)
    except (AssertionError, RuntimeError, ValueError) as error:
        if not flexible or tuple(config.input_shape) == tuple(model.spec.input_shape):
            raise
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
        raise EnsdiagError(f"the model does not run on the {config.preset} preset's {tuple(config.input_shape)} inputs "
                           f"({reason}); pass a preset whose images fit it") from None
    return with_pooled_shift(predictions), data.titles, data.skipped
