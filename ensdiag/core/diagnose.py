"""`ensdiag.diagnose()`: every analyzer on any ensemble and any data, from Python (docs/own-models.md).

    diagnosis = ensdiag.diagnose([net_a, net_b], test=(x, y), ood=x_ood)

The members and data are turned into an `Ensemble` and splits, checked like user input, and handed
to the one inspection (inspection.py); nothing here measures anything itself.
"""

import sys
from dataclasses import replace
from numbers import Real

import torch

from ..data.batching import Normalize
from ..ensembles import as_ensemble
from ..errors import EnsdiagError, InputTypeError, Skip, unknown
from ..numbers import integer, parse_precision, parse_seconds, path_points_option, seed as checked_seed
from ..stats import metrics as M
from .diagnosis import Diagnosis, checked_cost
from .inspection import Context, Measure, inspect, member_weights

GEOMETRY_EXAMPLES = 2000  # inputs per split diagnose() keeps for member geometry (CKA, paths)


def diagnose(members, test=None, ood=None, shift=None, val=None, *, train=None, normalize=None,
             measure: Measure = Measure(), context: Context = Context()) -> Diagnosis:
    """Every analyzer on any ensemble and any data, from Python (docs/own-models.md, "From Python").

    `members`: an `EnsembleModel` (ensdiag's, loaded or imported), a list of `nn.Module`s (each maps
    a batch [B, …] to logits [B, C]), one `nn.Module` returning [k, B, C], a callable returning
    [k, B, C], model file paths, or `ensdiag.as_ensemble(members, …)` of any of them with what ensdiag
    cannot see itself (`num_members` of a module returning [k·B, C], `member_weights`, `modules`,
    CKA's `layers`). `test`, `ood`, `shift`, `val`, `train`: `(x, y)` tensors, a tensor `x`, a
    Dataset or an iterable of batches. `normalize`: None applies the preprocessing an ensdiag model
    records (others get their inputs as given), "none" none, a (mean, std) pair per channel, or a
    function of a batch.

    `measure` (`ensdiag.Measure`, as the commands' inspection takes it): `geometry`,
    `geometry_examples` (inputs per split member geometry reads; None: 2,000), `path_points`,
    `seed`, `detail` (intervals for the detail catalogue too: every declared column, CKA,
    barriers; the headline tables' numbers always have theirs), `budget` (a time the whole
    diagnosis may take: "5m", "90s", seconds) and/or `precision` (an interval half-width at which
    a step stops reading examples; `metrics["budget"]` says what was measured, with what precision,
    what was skipped and why). `context` (`ensdiag.Context`): `device` (where inputs go; default:
    where the members are, which are never moved), `titles` ({split: what the data is}), `cost`
    ({"parameters", "train_seconds"} for the report's cost table; parameters are counted when not
    given), `initial` (the members before training, as `members` are given, a `Tracker` (its epoch
    0) or a number: the weight cosine the trained one is read against), `progress` (a bar per
    split; default: when stderr is a terminal)."""
    if not isinstance(measure, Measure) or not isinstance(context, Context):
        raise InputTypeError("measure and context must be an ensdiag.Measure and an ensdiag.Context")
    if test is None:
        raise EnsdiagError("diagnose needs in-distribution test data: test=(x, y)")
    examples = GEOMETRY_EXAMPLES if measure.geometry_examples is None else measure.geometry_examples
    if isinstance(examples, bool) or not isinstance(examples, int):
        raise InputTypeError(f"geometry_examples must be a whole number, got {type(examples).__name__}")
    measure = replace(measure, geometry_examples=integer(examples, "geometry_examples", 1), detail=bool(measure.detail),
                      path_points=path_points_option(measure.path_points, "path_points"),
                      seed=checked_seed(measure.seed, "seed"), budget=parse_seconds(measure.budget),
                      precision=parse_precision(measure.precision))
    ensemble = as_ensemble(members)
    device = ensemble.device if context.device is None else checked_device(context.device, ensemble)
    given = {"id": test, "shift": shift, "ood": ood, "val": val}
    names = {name: f"{name} (given to diagnose)" for name, data in given.items() if data is not None}
    titles = {} if context.titles is None else context.titles
    if not isinstance(titles, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in titles.items()):
        raise InputTypeError("titles must map split names (test, id, ood, shift, val) to strings")
    for name in titles:
        if name not in ("test", "id", "ood", "shift", "val"):
            raise unknown("split in titles", name, ("test", "id", "ood", "shift", "val"))
    names.update({("id" if name == "test" else name): text for name, text in titles.items()})
    progress = context.progress if callable(context.progress) else _bars(context.progress)
    return inspect(ensemble, given, preprocess=preprocessing(normalize, ensemble, device), train=train, measure=measure,
                   context=replace(context, device=device, titles=names,
                                   cost=_cost(ensemble, context.cost), progress=progress,
                                   initial=initial_cosine(context.initial, ensemble, measure.seed)))


def preprocessing(normalize, ensemble, device):
    """The function each batch goes through (module docstring of `diagnose`: `normalize`)."""
    if normalize is None:
        return Normalize(*ensemble.preprocess, device) if ensemble.preprocess is not None else None
    if isinstance(normalize, str):
        if normalize != "none":
            raise EnsdiagError(f"normalize must be None, 'none', (mean, std) or a function, not {normalize!r}")
        return None
    if callable(normalize):
        return normalize
    try:
        mean, std = ([float(v) for v in part] for part in normalize)
    except (TypeError, ValueError):
        raise EnsdiagError("normalize must be None, 'none', a (mean, std) pair of per-channel sequences or a function")
    if len(mean) != len(std) or not all(v > 0 for v in std):
        raise EnsdiagError("normalize: one mean and one positive std per channel")
    return Normalize(mean, std, device)


def initial_cosine(initial, ensemble, seed: int) -> dict | None:
    """{"mean", "source"} of the members' weight cosine before training, from what the user gave."""
    if initial is None:
        return None  # the ensemble's own record, where it has one (inspect asks it)
    if hasattr(initial, "rows") and hasattr(initial, "measure"):  # a Tracker
        row = next((row for row in initial.rows if row["epoch"] == 0), None)
        if row is None or row.get("weight_cosine") is None:
            raise EnsdiagError("initial: the Tracker has no weight cosine at epoch 0 (measure(0) before training)")
        return {"mean": row["weight_cosine"], "source": "the Tracker's epoch 0"}
    if isinstance(initial, Real) and not isinstance(initial, bool):
        if not -1 <= float(initial) <= 1:
            raise EnsdiagError(f"initial: a cosine is in [−1, 1], got {initial!r}")
        return {"mean": float(initial), "source": "given to diagnose"}
    try:
        weights = member_weights(as_ensemble(initial), seed)
    except InputTypeError:
        raise InputTypeError(f"initial must be the members before training (as members are given), a Tracker or a "
                             f"cosine, not {type(initial).__name__}") from None
    if isinstance(weights, Skip):
        raise EnsdiagError(f"initial: {weights}")
    if len(weights) != ensemble.num_members and ensemble.num_members is not None:
        raise EnsdiagError(f"initial: {len(weights)} members at initialisation, {ensemble.num_members} trained")
    return {"mean": M.mean_off_diagonal(M.weight_cosine(weights)[0]), "source": "the initial members given to diagnose"}


def _cost(ensemble, cost) -> dict:
    """The cost table's numbers as given; where the parameters are not, the distinct parameters (by
    storage) of the ensemble's modules (none for a callable)."""
    seen, total = set(), 0
    for module in ensemble.modules():
        for parameter in module.parameters():
            key = (parameter.untyped_storage().data_ptr(), parameter.storage_offset(), parameter.shape)
            if key not in seen:
                seen.add(key)
                total += parameter.numel()
    return checked_cost({**({"parameters": total} if seen else {}), **checked_cost(cost or {})})


def checked_device(device, ensemble=None):
    """The device inputs go to: a real one, and where the members are (ensdiag never moves them)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):  # ValueError: an index beyond a long (cuda:10**30)
        raise EnsdiagError(f"device {device!r} is not a device (cpu, cuda, cuda:1, …)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EnsdiagError(f"device {str(device)!r} asked for, but torch sees no CUDA device")
    placed = {p.device for module in (ensemble.modules() if ensemble is not None else ()) for p in module.parameters()}
    if placed and all(here.type != device.type or (device.index is not None and here != device) for here in placed):
        raise EnsdiagError(f"device {str(device)!r}, but the members are on {', '.join(sorted(map(str, placed)))}: "
                           "ensdiag never moves your modules; move them there, or leave device out")
    return device


def _bars(progress):
    if not (sys.stderr.isatty() if progress is None else progress):
        return None
    from rich.console import Console
    from rich.progress import track
    return lambda name: (lambda items: track(items, description=f"diagnose: {name}", transient=True,
                                             console=Console(stderr=True)))
