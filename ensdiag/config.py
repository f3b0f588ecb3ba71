"""Run configuration: the presets of docs/conventions.md as dataclasses, with JSON round-trip.

    config = preset_config("digits", epochs=20)       # overrides are recorded
    config.to_dict()["overrides"] == {"epochs": 20}
"""

import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from .data.constants import CIFAR10_MEAN, CIFAR10_STD, DIGITS_MEAN, DIGITS_STD, MNIST_MEAN, MNIST_STD
from .data.registry import all_datasets
from .errors import EnsdiagError, unknown as unknown_name
from .io import is_path


@dataclass(frozen=True)
class TrainConfig:
    preset: str
    arch: str
    dataset: str  # in-distribution dataset (train/validation/test)
    shift: str  # shift dataset: pooled over its corruptions and per corruption
    ood: str  # out-of-distribution dataset
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    methods: tuple[str, ...] = ("single", "mc-dropout", "deep-ensemble", "batch-ensemble")
    seeds: tuple[int, ...] = (42, 69, 123, 456, 789)
    epochs: int = 75
    lr: float = 0.05
    batch_size: int = 128
    optimizer: str = "adam"  # adam | sgd
    momentum: float = 0.9  # sgd
    nesterov: bool = True  # sgd
    betas: tuple[float, float] = (0.9, 0.999)  # adam
    eps: float = 1e-8  # adam
    weight_decay: float = 1e-4
    milestones: tuple[int, ...] = (25, 50)
    gamma: float = 0.1
    early_stopping: bool = True  # on validation accuracy
    patience: int = 10
    min_delta: float = 0.001
    val_fraction: float = 0.1  # held out of the training set, seeded by the run's seed; 0: none
    augment: bool = False  # CIFAR: 4-pixel zero-pad random crop + horizontal flip
    members: int = 4
    dropout: float = 0.05
    mc_dropout_train: str = "on"  # on: dropout in training too (torch-uncertainty, the paper's code); off: paper's text
    be_variant: str = "channel"
    be_init: str = "normal:0.5"
    be_layout: str = "original"  # original | paper (nn/kits/batch_ensemble.py); paper presets: paper
    be_loss: str = "mean"  # mean CE over all k·B rows | sum over members (ensdiag before 0.2)
    be_split_batch: bool = False  # original split mode: each member gets B/k disjoint examples
    be_fast_weight_decay: bool = True  # weight decay on r, s as the paper's stack did
    method_options: dict = field(default_factory=dict)  # method -> {option: value}, from --option METHOD.NAME=VALUE
    track_diversity: bool = False  # disagreement, JSD, weight cosine on the validation split per epoch
    geometry: bool = True  # member geometry (CKA, alignment, paths, rank) after training
    detail: bool = False  # each run's diagnosis computes the detail catalogue too, with its intervals (train --detail)
    catalogue: bool = False  # the detail catalogue's numbers alone (grids started before 0.8 computed them on every run)
    precision: str = "auto"  # training arithmetic: auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 (precision.py)
    shift_severity: int = 5  # CIFAR-10-C
    ood_split: str = "test"
    overrides: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data, source="run config") -> "TrainConfig":
        """A stored config, checked like user input: field names, types, then `validate`."""
        if not isinstance(data, dict):
            raise EnsdiagError(f"{source}: 'config' must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EnsdiagError(f"{source} has unknown fields {', '.join(map(repr, unknown))}")
        missing = sorted({f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
                         - set(data))
        if missing:
            raise EnsdiagError(f"{source} lacks the fields {', '.join(missing)}")
        data = {**LEGACY_DEFAULTS, **data}  # a run started by an older ensdiag resumes as it began
        if "method_options" not in data and data.get("preset") in PRESETS:  # before 0.3: no method ran with any
            data["method_options"] = PRESETS[data["preset"]].method_options
        config = cls(**{key: _typed(key, value, getattr(PRESETS["digits"], key), source)
                        for key, value in data.items()})
        validate(config, stored=True)
        return config

    def model_options(self, run: str) -> tuple[str, dict]:
        """(method, build_model options) for one run name."""
        from .nn.methods import METHODS, run_methods
        method, fixed = run_methods()[run]
        return method, {**METHODS[method].options_from(self), **fixed}

    def build(self, run: str):
        """The untrained model of one run name, on torch's default device (`with torch.device("meta")`: no memory)."""
        from .nn import build_model
        from .nn.methods import members_for
        method, options = self.model_options(run)
        return build_model(self.arch, method, members_for(method, self.members), self.num_classes, self.input_shape,
                           **options)


PRESETS = {
    # paper §4: ResNet-18 on CIFAR-10, SGD with Nesterov momentum, 75 epochs, on all 50,000
    # training images (no validation split, no early stopping: the last epoch's weights)
    "cifar10": TrainConfig(
        preset="cifar10", arch="resnet18", dataset="cifar10", shift="cifar10-c", ood="svhn",
        num_classes=10, input_shape=(3, 32, 32), mean=CIFAR10_MEAN, std=CIFAR10_STD,
        epochs=75, lr=0.05, batch_size=128, optimizer="sgd", weight_decay=5e-4,
        milestones=(25, 50), early_stopping=False, val_fraction=0.0, augment=True, dropout=0.1, be_layout="paper",
        method_options={"packed-ensemble": {"alpha": 2.0, "gamma": 2}}),  # the Packed-Ensembles paper's ResNet-18
    # paper §5: the 64-32-16 MLP on MNIST, Adam at lr 0.05 as the paper states
    "mnist": TrainConfig(
        preset="mnist", arch="mlp", dataset="mnist", shift="mnist-c", ood="fashion-mnist",
        num_classes=10, input_shape=(1, 28, 28), mean=MNIST_MEAN, std=MNIST_STD,
        epochs=75, lr=0.05, batch_size=128, optimizer="adam", weight_decay=1e-4,
        milestones=(25, 50), early_stopping=True, patience=10, min_delta=0.001, dropout=0.05, be_layout="paper"),
    # the embedded default: the mnist protocol scaled to scikit-learn's 8x8 digits so the whole
    # grid runs in well under two minutes on 2 CPU cores; lr 0.01 because 0.05 is unstable here
    "digits": TrainConfig(
        preset="digits", arch="mlp", dataset="digits", shift="digits-c", ood="natural-patches",
        num_classes=10, input_shape=(1, 8, 8), mean=DIGITS_MEAN, std=DIGITS_STD,
        seeds=(42, 69, 123), epochs=40, lr=0.01, batch_size=64, optimizer="adam", weight_decay=1e-4,
        milestones=(15, 30), early_stopping=True, patience=10, min_delta=0.001, dropout=0.05, be_layout="paper"),
}


def preset_config(preset: str, **overrides) -> TrainConfig:
    """The preset with the given options (None = not given) replaced, and the change recorded."""
    if preset not in PRESETS:
        raise unknown_name("preset", preset, PRESETS)
    given = {key: value for key, value in overrides.items() if value is not None}
    known = {f.name for f in fields(TrainConfig)} - {"overrides", "preset"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise EnsdiagError(f"unknown option(s) {', '.join(unknown)}")
    for key in ("methods", "seeds", "milestones"):
        if key in given:
            given[key] = tuple(given[key])
    if "method_options" in given:  # given options over the preset's, method by method
        preset_options = PRESETS[preset].method_options
        given["method_options"] = {method: {**preset_options.get(method, {}), **given["method_options"].get(method, {})}
                                   for method in {**preset_options, **given["method_options"]}}
    config = replace(PRESETS[preset], **given)
    validate(config)
    changed = {key: value for key, value in given.items() if getattr(PRESETS[preset], key) != value}
    return replace(config, overrides={key: list(value) if isinstance(value, tuple) else value
                                      for key, value in changed.items()})


def _fits(value, example) -> bool:
    """Whether a JSON value has the type of a preset's value (an int is a float; a bool is no number)."""
    if isinstance(example, bool) or isinstance(value, bool):
        return isinstance(example, bool) and isinstance(value, bool)
    if isinstance(example, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(example))


def _typed(key, value, example, source):
    """`value` as the type of `example` (a preset's value of the field), or one clear error."""
    fits = (isinstance(value, (list, tuple)) and all(_fits(v, example[0]) for v in value) if isinstance(example, tuple)
            else _fits(value, example))
    if not fits:
        raise EnsdiagError(f"{source}: {key} must be {type(example).__name__}, got {value!r}"[:300])
    try:
        if isinstance(example, tuple):
            return tuple(float(v) if isinstance(example[0], float) else v for v in value)
        return float(value) if isinstance(example, float) else value
    except OverflowError:  # a 400-digit integer where a float belongs
        raise EnsdiagError(f"{source}: {key} is out of range"[:300]) from None


# Fields added after runs existed, whose dataclass default is not what those runs did.
LEGACY_DEFAULTS = {"be_loss": "sum", "catalogue": True}  # (before 0.8 every run computed the catalogue)

FLOAT_OPTIONS = {"lr": "--lr", "dropout": "--dropout", "val_fraction": "--val-fraction", "momentum": "momentum",
                 "eps": "eps", "weight_decay": "weight_decay", "gamma": "gamma", "min_delta": "min_delta"}


def validate(config: TrainConfig, stored: bool = False) -> None:
    """Every field checked as user input (also for configs read back from a run folder, which
    may hold kernel-wise BatchEnsemble on the mlp: older ensdiag accepted it)."""
    from .nn import ARCHITECTURES, METHODS
    from .nn.methods import members_for, resolve_options, run_methods
    if config.preset not in PRESETS:
        raise unknown_name("preset", config.preset, PRESETS)
    for name, option in FLOAT_OPTIONS.items():
        if not math.isfinite(getattr(config, name)):
            raise EnsdiagError(f"{option} must be a finite number, got {getattr(config, name)}")
    for name in ("betas", "mean", "std"):
        if not all(math.isfinite(v) for v in getattr(config, name)):
            raise EnsdiagError(f"{name} must be finite numbers, got {getattr(config, name)}")
    unknown_runs = [m for m in config.methods if m not in run_methods()]
    if unknown_runs:
        raise unknown_name("method", unknown_runs[0], run_methods())
    if not config.methods or not config.seeds:
        raise EnsdiagError("give at least one method and one seed")
    if not all(-2**63 <= seed < 2**64 for seed in config.seeds):  # what torch.manual_seed accepts
        raise EnsdiagError(f"--seeds must lie in -2^63..2^64-1, got {', '.join(map(str, config.seeds))}"[:300])
    if len(set(config.methods)) != len(config.methods) or len(set(config.seeds)) != len(config.seeds):
        raise EnsdiagError("methods and seeds must not repeat")
    checks = [(config.epochs >= 1, "--epochs must be at least 1"), (config.lr > 0, "--lr must be positive"),
              (config.batch_size >= 1, "--batch-size must be at least 1"),
              (config.members >= 1, "--members must be at least 1"),
              (config.members <= 4096, "--members must be at most 4096 (the largest ensemble a model file may hold)"),
              (config.mc_dropout_train in ("on", "off"), "--mc-dropout-train must be on or off"),
              (config.precision in ("auto", "fp32", "bf16"), "--precision must be auto, fp32 or bf16"),
              (config.optimizer in ("adam", "sgd"), "optimizer must be adam or sgd"),
              (config.patience >= 1, "--patience must be at least 1"),
              (config.weight_decay >= 0, "weight_decay must be >= 0"),
              (all(m >= 1 for m in config.milestones), "milestones must be epochs >= 1"),
              (len(config.betas) == 2 and all(0 <= b < 1 for b in config.betas), "betas must be two numbers in [0, 1)"),
              (config.eps > 0 and config.gamma > 0 and config.momentum >= 0, "eps and gamma must be > 0, momentum >= 0"),
              (len(config.mean) == len(config.std) == config.input_shape[0] if config.input_shape else False,
               "mean and std need one value per input channel"),
              (all(v > 0 for v in config.std), "std must be positive"),
              (config.shift_severity in range(1, 6), "shift severity must be 1..5"),
              (config.ood_split in ("train", "test"), "ood split must be train or test"),
              (config.num_classes >= 2 and all(d >= 1 for d in config.input_shape), "num_classes >= 2 and input dims >= 1"),
              (config.min_delta >= 0, "min_delta must be >= 0"),
              (0 <= config.val_fraction < 1, "--val-fraction must lie in [0, 1)")]
    for ok, message in checks:
        if not ok:
            raise EnsdiagError(message)
    # the shift and OOD sets: a registered dataset's name or files that exist (a stored run's files are checked
    # when its data is loaded, where a missing one says so)
    for option, value in (("--shift", config.shift), ("--ood", config.ood)):
        if is_path(value) and not stored and not Path(value).exists():
            raise EnsdiagError(f"{option} {value} does not exist")
        if not is_path(value) and value not in all_datasets():
            raise EnsdiagError(f"{option}: unknown dataset {value!r}; give a registered one (`ensdiag datasets`) or a "
                               "path (an image folder, .npz or .npy)")
    if config.early_stopping and config.val_fraction == 0:
        raise EnsdiagError("early stopping needs a validation split: pass --val-fraction (e.g. 0.1) or --no-early-stopping")
    if config.track_diversity and config.val_fraction == 0:
        raise EnsdiagError("--track-diversity measures on the validation split: pass --val-fraction (e.g. 0.1)")
    if config.be_split_batch and config.batch_size % config.members:
        raise EnsdiagError(f"--be-split-batch needs --batch-size divisible by --members ({config.members})")
    builder = ARCHITECTURES.named(config.arch)
    if builder.whole_networks:
        raise EnsdiagError(f"{config.arch} networks are imported (ensdiag import), not trained by ensdiag")
    for method, options in config.method_options.items():
        if method not in METHODS:
            raise EnsdiagError(f"--option: unknown method {method!r}; choose from {', '.join(METHODS)}"[:300])
        if not isinstance(options, dict):
            raise EnsdiagError(f"method_options of {method} must map option names to values, got {options!r}"[:300])
        resolve_options(method, options, builder.default_options, builder.convolutional or stored, config.arch)
    if config.track_diversity and all(members_for(config.model_options(run)[0], config.members) == 1
                                      for run in config.methods):
        raise EnsdiagError("--track-diversity follows how members differ; every method here has one member "
                           "(add an ensemble method, or raise --members)")
    for run in config.methods:  # the method options, each checked against its kit's declaration
        method, options = config.model_options(run)
        resolve_options(method, options, builder.default_options, builder.convolutional or stored, config.arch)
        METHODS[method].check_training(config, members_for(method, config.members))


def preset_for(spec) -> str | None:
    """The preset whose architecture, input shape and classes match a model spec's, or None."""
    for name, config in PRESETS.items():
        if (config.arch, tuple(config.input_shape), config.num_classes) == (spec.arch, tuple(spec.input_shape),
                                                                          spec.num_classes):
            return name
    return None
