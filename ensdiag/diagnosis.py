"""`ensdiag.diagnose`: any PyTorch ensemble, on any data, from Python.

    import ensdiag
    diagnosis = ensdiag.diagnose([net_a, net_b, net_c], id=(x_test, y_test), ood=x_ood,
                                 layers=["layer1", "layer4", "fc"])
    diagnosis.metrics["analyzers"]["disagreement"]["splits"]["id"]["mean"]["value"]
    diagnosis.save("runs/mine", method="deep-ensemble", seed=0)   # then: ensdiag report runs/mine
    print(diagnosis.to_markdown())

Members may be an `EnsembleModel` (ensdiag's own, or imported), a list of `nn.Module`s (each
maps a batch [B, ...] to logits [B, C]), or a callable mapping a batch to logits [k, B, C]
(predictions only). Data may be `(x, y)` tensors, an unlabelled tensor `x`, a torch Dataset
of `(x, y)` items, or any iterable of batches (a DataLoader). Inputs go to the members as
given (pass `normalize=` to transform each batch first).

Predictions stream batch by batch (memory: the logits, k·N·C floats). Member geometry reads
at most `geometry_examples` inputs per split, kept from the first batches. On plain modules:
weight similarity compares the parameters all members have under the same name and shape;
CKA hooks the modules named in `layers` (default: every top-level child); paths interpolate
the members' state dicts; alignment needs an architecture that declares its permutation
groups, which plain modules do not, and says so.
"""

import copy
import json
from contextlib import contextmanager
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from .errors import EnsdiagError

GEOMETRY_EXAMPLES = 2000  # inputs per split kept for member geometry (CKA, paths)
LAYOUTS = ("channels-first", "channels-last", "tokens")


def diagnose(members, id, ood=None, shift=None, val=None, *, train=None, normalize=None, layers=None,
             geometry: bool = True, geometry_examples: int = GEOMETRY_EXAMPLES, device="cpu", seed: int = 0,
             progress: bool | None = None, path_points: int | str = 11) -> "Diagnosis":
    """Every predictions analyzer on the splits given, and member geometry where the members are
    networks. `train`: labelled training inputs (BatchNorm statistics and the training loss along
    paths). `layers`: the modules CKA reads, as names or {name: layout} with layout one of
    `LAYOUTS` (default: [B, C, ...] outputs are channels-first, [B, T, D] tokens). `progress`: a
    bar per split while predicting (default: when stderr is a terminal). `path_points`: points on
    each path between members, or "adaptive" (fewer where the curve is flat; recorded)."""
    import sys

    from .quickcheck import path_points_option
    path_points = path_points_option(path_points)
    from .analysis import analyze_model, analyze_predictions
    progress = sys.stderr.isatty() if progress is None else progress
    device = torch.device(device)
    normalize = normalize or (lambda x: x)
    model, run = as_ensemble(members, layers)
    if model is not None:
        model.to(device)
    with evaluating(model):
        splits, kept = _predict_splits(run, (("id", id), ("shift", shift), ("ood", ood), ("val", val)), normalize,
                                       device, geometry_examples, progress)
    if "id" not in splits:
        raise EnsdiagError("diagnose needs in-distribution data (id=)")
    weights = model.member_weights() if model is not None else None
    metrics = analyze_predictions(splits, weights=weights)
    if geometry and model is not None and model.num_members > 1:
        from .analysis.geometry import ModelProbe
        from .data.registry import Split
        train_split = _first(_batches(train, "train"), geometry_examples) if train is not None else None
        probe = ModelProbe(model, {name: Split(*kept[name]) for name in ("id", "ood") if name in kept}, normalize,
                           train_split[0] if train_split else None, seed=seed,
                           train_labels=train_split[1] if train_split else None, path_points=path_points)
        metrics["analyzers"].update(analyze_model(probe))
    titles = {name: f"{name} (given to diagnose)" for name in splits}
    return Diagnosis(metrics, splits, titles)


def as_ensemble(members, layers=None):
    """(model with member weights or None, forward: batch -> logits [k, B, C]) for any accepted members."""
    from .nn.model import EnsembleModel
    if isinstance(members, EnsembleModel):
        return members, members
    if isinstance(members, (list, tuple)) and members and all(isinstance(m, nn.Module) for m in members):
        model = ModuleEnsemble(members, layers)
        return model, model
    if callable(members) and not isinstance(members, nn.Module):
        return None, members
    raise EnsdiagError("members must be an EnsembleModel, a non-empty list of nn.Modules, or a callable "
                       "returning logits [k, B, C]")


@contextmanager
def evaluating(module):
    """The module (and its children) in eval mode inside, each back in its own mode after."""
    if module is None:
        yield
        return
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _predict_splits(run, named, normalize, device, keep, progress):
    splits, kept = {}, {}
    for name, data in named:
        if data is None:
            continue
        logits, labels, sample = _predict(run, _batches(data, name), normalize, device, keep, progress, name)
        if labels is not None and name == "ood":
            labels = None  # OOD splits are unlabelled for every analyzer
        splits[name] = {"logits": logits, "labels": labels}
        kept[name] = sample
    return splits, kept


@dataclass
class Diagnosis:
    """What `diagnose` found: `metrics` (the metrics.json layout), `predictions` ({split:
    {"logits", "labels"}}) and the split titles."""

    metrics: dict
    predictions: dict
    titles: dict = field(default_factory=dict)
    source: str = "ensdiag.diagnose"  # what made it, recorded in the saved run's meta.json

    def save(self, folder, method: str = "ensemble", seed: int = 0, overwrite: bool = False) -> Path:
        """Write this diagnosis as `folder/<method>/seed-<seed>/` (metrics.json, predictions, meta.json)
        and list it in `folder/experiment.json`, so `ensdiag report folder` reads it beside others. An
        analysis already saved there is replaced only with `overwrite=True` (runs.save_result)."""
        from .runs import PREDICTIONS, save_result
        return save_result(folder, method, seed, PREDICTIONS, self.metrics, {
            "run": method, "method": method, "seed": seed, "splits": self.titles, "source": self.source},
            self.titles, self.predictions, overwrite)

    def _report(self, fmt: str) -> str:
        from .report import make_report, render
        with tempfile.TemporaryDirectory() as scratch:
            self.save(scratch, "ensemble", 0)
            report = make_report(scratch, write=False)
            report["run"] = "ensdiag.diagnose"
            return render(report, fmt, scratch)

    def to_markdown(self) -> str:
        return self._report("markdown")

    def to_json(self) -> str:
        from .analysis import finite
        return json.dumps(finite(self.metrics), indent=2, allow_nan=False) + "\n"

    def _repr_html_(self) -> str:  # Jupyter
        return self._report("html")

    def __repr__(self) -> str:
        splits = ", ".join(f"{name} n={split['logits'].shape[1]}" for name, split in self.predictions.items())
        k = next(iter(self.predictions.values()))["logits"].shape[0]
        return f"Diagnosis(k={k}, {splits}, analyzers: {', '.join(self.metrics['analyzers'])})"


# ---------------------------------------------------------------- data


def _batches(data, name):
    """An iterator of (x, y | None) batches from any of the accepted forms."""
    if isinstance(data, torch.Tensor):
        return iter([(data, None)])
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(d, torch.Tensor) for d in data):
        x, y = data
        if len(x) != len(y):
            raise EnsdiagError(f"{name}: {len(x)} inputs but {len(y)} labels")
        return iter([(x, y)])
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        data = torch.utils.data.DataLoader(data, batch_size=256)
    if not hasattr(data, "__iter__") or isinstance(data, (str, bytes, dict)):
        raise EnsdiagError(f"{name}: give (x, y) tensors, a tensor x, a Dataset or an iterable of batches, "
                           f"not {type(data).__name__}")
    return (_batch(item, name) for item in data)


def _batch(item, name):
    if isinstance(item, torch.Tensor):
        return item, None
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor):
        labels = item[1] if len(item) > 1 and isinstance(item[1], torch.Tensor) else None
        return item[0], labels
    raise EnsdiagError(f"{name}: a batch must be a tensor or an (inputs, labels) pair, not {type(item).__name__}")


def _first(batches, limit):
    """(inputs, labels) of at most `limit` examples from the batches, or None."""
    xs, ys = [], []
    count = 0
    for x, y in batches:
        xs.append(x[:limit - count])
        ys.append(None if y is None else y[:limit - count])
        count += len(xs[-1])
        if count >= limit:
            break
    if not xs:
        return None
    return torch.cat(xs), None if any(y is None for y in ys) else torch.cat(ys)


@torch.no_grad()
def _predict(run, batches, normalize, device, keep: int, progress: bool, name: str):
    """(logits [k, N, C] float32 on the CPU, labels | None, (kept inputs, kept labels) | None)."""
    from .precision import exact_math
    if progress:
        from rich.console import Console
        from rich.progress import track
        batches = track(batches, description=f"diagnose: {name}", transient=True, console=Console(stderr=True))
    chunks, labels, kept_x, kept_y, unlabelled = [], [], [], [], False
    with exact_math():
        for x, y in batches:
            logits = run(normalize(x.to(device)))
            if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[1] != len(x):
                raise EnsdiagError(f"{name}: the members must return logits [k, B, C] for a batch of {len(x)}, got "
                                   f"{tuple(getattr(logits, 'shape', ())) or type(logits).__name__}")
            chunks.append(logits.float().cpu())
            unlabelled |= y is None
            labels.append(y)
            room = keep - sum(len(k) for k in kept_x)
            if room > 0:
                kept_x.append(x[:room].cpu())
                kept_y.append(None if y is None else y[:room].cpu())
    if not chunks:
        raise EnsdiagError(f"{name}: no data")
    labels = None if unlabelled else torch.cat(labels).long().cpu()
    kept = None
    if kept_x:
        kept = (torch.cat(kept_x), None if unlabelled else torch.cat(kept_y).long())
    return torch.cat(chunks, dim=1), labels, kept


# ---------------------------------------------------------------- plain modules as an ensemble


class _Member(nn.Module):
    """One member as ensdiag's geometry reads a plain network: logits [1, B, C], its weights
    under `body.`, and its representation points."""

    def __init__(self, module: nn.Module, layers: dict):
        super().__init__()
        self.body = module
        self.spec = SimpleNamespace(arch=f"user module {type(module).__name__}")
        self.layers = layers

    def forward(self, x):
        return self.body(x).unsqueeze(0)

    def representation_points(self) -> dict:
        return {name: (self.body.get_submodule(name), layout) for name, layout in self.layers.items()}


class ModuleEnsemble(nn.Module):
    """A list of `nn.Module` members seen through the interface ensdiag's analyzers read."""

    def __init__(self, members, layers=None):
        super().__init__()
        self.members = nn.ModuleList(members)  # the user's modules themselves: their mode is theirs (`evaluating`)
        self.layers = _layers(self.members[0], layers)
        for member in self.members[1:]:
            missing = [name for name in self.layers if not _has(member, name)]
            if missing:
                raise EnsdiagError(f"layer {missing[0]!r} is not a module of every member")
        self.kit = SimpleNamespace(one_weight_set=False, own_weights=True, rank_one_by_construction=False)
        self.method, self.spec, self.initial_cosine = "user modules", None, None

    num_members = property(lambda self: len(self.members))

    def forward(self, x):
        return torch.stack([member(x) for member in self.members])

    def member_network(self, i: int) -> _Member:
        """A copy of member i (paths overwrite its weights; the user's module stays as it was)."""
        return _Member(copy.deepcopy(self.members[i]), self.layers).eval()

    def member_weights(self):
        """Each member's floating-point parameters that every member has under the same name and shape."""
        from .nn.model import MemberWeights
        states = [dict(member.named_parameters()) for member in self.members]
        shared = [key for key, value in states[0].items() if value.is_floating_point()
                  and all(key in state and state[key].shape == value.shape for state in states[1:])]
        return MemberWeights([{key: state[key].detach().clone() for key in shared} for state in states])


def _has(module, name) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def _layers(module, layers) -> dict:
    """{name: layout} from the user's `layers` (names, or {name: layout}), or every top-level child."""
    if layers is None:
        layers = [name for name, _ in module.named_children()]
    if not isinstance(layers, dict):
        layers = {name: None for name in layers}
    for name, layout in layers.items():
        if not isinstance(name, str) or not _has(module, name):
            raise EnsdiagError(f"layer {name!r} is not a module of the members (named_modules() lists them)")
        if layout is not None and layout not in LAYOUTS:
            raise EnsdiagError(f"layer {name!r}: layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return dict(layers)
