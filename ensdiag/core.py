"""The inspection core: every ensemble, every way in, one way through.

    diagnosis = inspect(ensemble, {"id": test, "ood": ood}, preprocess=normalize)
    diagnosis.metrics                    # metrics.json's layout, the same on every path

    ensemble ─▶ predict each split (one loop) ─▶ check_predictions (one place)
             ─▶ predictions analyzers ─▶ model analyzers (one probe) ─▶ one metrics dict

`ensdiag.diagnose()`, `ensdiag evaluate`, `diversity`, `analyze` and training's own evaluation
all call `inspect` (or, for predictions made elsewhere, `inspect_predictions`). The user's
modules are read, never moved or re-moded: inputs go to the device the members are on, the
members run in eval mode with the random state forked (`ensembles.measuring`), and geometry
works on copies.
"""

from contextlib import nullcontext

from . import distributed
from .analysis import all_analyzers, analyze_model, analyze_predictions
from .analysis.registry import Skip
from .checks import check_predictions
from .data.registry import Split
from .diagnosis import Diagnosis
from .ensembles import as_ensemble, forked_rng, measuring
from .errors import EnsdiagError, InputTypeError
from .intervals import GENERIC_SECONDS, add_intervals
from .predict import GEOMETRY_SPLITS, predict_splits
from .predictions import with_pooled_shift



def inspect(ensemble, splits: dict, *, preprocess=None, device=None, seed: int = 0, geometry: bool = True,
            train=None, geometry_examples: int | None = None, path_points=11, only=None, titles=None, skipped=None,
            cost=None, initial=None, spread: bool = False, progress=None, status=None, no_data: str | None = None,
            plan=None):
    """A `Diagnosis` of `ensemble` (anything `as_ensemble` takes) on `splits` ({name: data in any
    form `data.given` reads}; names id, shift, shift/<c>, ood, val).

    `preprocess`: applied to each batch on the members' device (None: as given). `train`: labelled
    training inputs (BatchNorm statistics and the training loss along paths). `geometry_examples`:
    inputs per split member geometry reads (None: all). `only`: the analyzers to run (default
    all). `initial`: {"mean", "source"}, the members' weight cosine before training (default: what
    the ensemble knows). `spread`: under torchrun, every rank predicts a share (rank 0 gets the
    Diagnosis, the others None). `progress(split)`: a function wrapping that split's batches (a bar);
    `status(text)`: a context manager around each slow step (a status line). `no_data`: there is
    nothing to predict on, and why (the weights alone are inspected). `plan`: a `planning.Plan`
    (a time budget and/or a precision target) that chooses the examples each step reads."""
    ensemble = as_ensemble(ensemble)
    device = device if device is not None else ensemble.device
    preprocess = preprocess or (lambda x: x)
    status = status or (lambda text: nullcontext())
    predictions, kept = {}, {}
    if no_data is None:
        with status("predicting every split …"):
            keep = (2**62 if geometry_examples is None else geometry_examples) if geometry else 0
            if plan is not None:
                predictions, kept = _predict_planned(plan, ensemble, splits, preprocess, device, seed, spread, progress, keep)
            else:
                predictions, kept = _predict(ensemble, splits, preprocess, device, seed, spread, progress, keep)
        if spread and not distributed.ranks().main:
            return None
    with forked_rng(ensemble):  # geometry draws (paths' BatchNorm passes, plain networks): the user's state stays
        weights = member_weights(ensemble, seed, initial)
        metrics = _analyze(predictions, weights, only, no_data, plan)
        if geometry:
            from .analysis.geometry import ModelProbe
            probe_splits = {name: kept.get(name, splits.get(name)) for name in GEOMETRY_SPLITS if name in predictions}
            train_split = _training_split(train, geometry_examples)
            probe = ModelProbe(ensemble, probe_splits, preprocess, train_split.images if train_split else None,
                               geometry_examples, train_labels=train_split.labels if train_split else None,
                               path_points=path_points, train_source=train_split.source if train_split else None)
            analyzers = all_analyzers()
            if plan is not None:
                from .planned_geometry import run_geometry
                metrics["analyzers"].update(run_geometry(plan, probe, _names(only, "model"), lambda name: analyze_model(
                    probe, only=[name], without_data=no_data), status))
            else:
                for name in _names(only, "model"):
                    with status(f"member geometry: {analyzers[name].description} …"):  # paths on a ResNet take minutes
                        metrics["analyzers"].update(analyze_model(probe, only=[name], without_data=no_data))
    if plan is not None:
        from .planned_geometry import estimate_full
        estimate_full(plan, {**metrics, "ensemble": describe(ensemble)}, geometry_examples, path_points)
        metrics["budget"] = plan.to_json()
    titles = dict(titles) if titles is not None else {name: name for name in predictions}
    metrics["split_titles"], metrics["skipped_splits"] = titles, dict(skipped or {})
    metrics["ensemble"] = describe(ensemble)
    return Diagnosis(metrics, predictions, titles, cost=dict(cost or {}))


def inspect_predictions(predictions: dict, where: str = "predictions", titles=None, source="ensdiag analyze"):
    """A `Diagnosis` of member logits made anywhere (files, arrays, JSON lines): checked in the one
    place, then every predictions analyzer."""
    predictions = with_pooled_shift(check_predictions(predictions, where, need_id=False))
    metrics = analyze_predictions(predictions)
    add_intervals(metrics, predictions)
    titles = {name: (titles or {}).get(name, name) for name in predictions}
    metrics["split_titles"], metrics["skipped_splits"] = titles, {}
    return Diagnosis(metrics, predictions, titles, source=source)


def member_weights(ensemble, seed: int = 0, initial=None):
    """The ensemble's `MemberWeights` carrying their cosine at initialisation, or the `Skip` that
    says why there are none (the weight analyzers report its reason)."""
    try:
        weights = ensemble.member_weights()
    except Skip as reason:
        return reason
    if len(weights) > 1:
        weights.initial = initial if initial is not None else ensemble.initial_cosine(seed)
    return weights


def describe(ensemble) -> dict:
    """What was inspected, for every output: method, k, architecture where known."""
    spec = ensemble.spec
    return {"method": ensemble.method, "num_members": ensemble.num_members,
            **({"arch": spec.arch, "input_shape": list(spec.input_shape)} if spec is not None else {})}


def _predict(ensemble, splits, preprocess, device, seed, spread, progress, keep):
    """({split: {"logits", "labels"}} checked and with the pooled shift, {split: kept Split})."""
    found, kept = predict_splits(ensemble, splits, preprocess, device, seed, spread, progress, keep)
    if "id" not in found:
        raise EnsdiagError("nothing to measure on: in-distribution data (the test split) is needed")
    return with_pooled_shift(check_predictions(found, "the data given", need_id=True)), kept


def _predict_planned(plan, ensemble, splits, preprocess, device, seed, spread, progress, keep):
    """`_predict` on the examples a plan affords (planning.py), each split's choice recorded."""
    from .planning import predict_within
    if spread:
        raise EnsdiagError("a budget or precision target chooses examples in one process: run it without torchrun")
    with measuring(ensemble, seed):
        found, first = predict_within(plan, ensemble, splits, preprocess, device, keep, progress)
    if "id" not in found:
        raise EnsdiagError("nothing to measure on: in-distribution data (the test split) is needed")
    kept = {name: Split(*pair, f"{len(pair[0])} examples of {name}") for name, pair in first.items()
            if name in GEOMETRY_SPLITS}
    return with_pooled_shift(check_predictions(found, "the data given", need_id=True)), kept


def _analyze(predictions, weights, only, no_data, plan=None):
    """The predictions analyzers' metrics dict, each headline number with its example-level
    interval (intervals.py); without predictions, those that read only weights."""
    import time
    began = time.perf_counter()
    metrics = analyze_predictions(predictions, weights=weights, only=None if only is None else _names(only, "predictions"),
                                  without_data=no_data)
    if not predictions:
        return metrics
    if plan is None:
        add_intervals(metrics, predictions, weights)
    else:  # a plug-in re-run on resamples gets a tenth of what is left
        add_intervals(metrics, predictions, weights, full=plan.full,
                      allowance=min(GENERIC_SECONDS, max(plan.remaining() / 10, 1.0)))
        plan.record("analyzers and intervals", seconds=round(time.perf_counter() - began, 2))
    return metrics


def _names(only, needs: str) -> list[str]:
    """The registered analyzers of a kind ("predictions" or "model"), those in `only` where given."""
    return [name for name, analyzer in all_analyzers().items() if analyzer.needs == needs and (only is None or name in only)]


TRAINING_EXAMPLES = 10_000  # training inputs read from a loader or Dataset, for the probe's seeded samples


def _training_split(train, limit) -> Split | None:
    """The training data the probe samples from (BatchNorm statistics, the training loss along
    paths): tensors and Splits whole, so its seeded sample covers every class; from a loader or
    Dataset its first `TRAINING_EXAMPLES` (shuffle the loader if it is sorted by class)."""
    if train is None:
        return None
    if isinstance(train, Split):
        return train
    import torch
    if isinstance(train, (tuple, list)) and len(train) == 2 and all(isinstance(t, torch.Tensor) for t in train):
        from .data.given import batches
        batches(train, "train")  # checked as any split's pair is
        return Split(train[0], train[1], "training inputs")
    if isinstance(train, torch.Tensor):
        return Split(train, None, "training inputs")
    from .data.given import first
    found = first(train, max(limit or 0, TRAINING_EXAMPLES), "train")
    return None if found is None else Split(found[0], found[1], "training inputs")


GEOMETRY_EXAMPLES = 2000  # inputs per split diagnose() keeps for member geometry (CKA, paths)


def diagnose(members, id=None, ood=None, shift=None, val=None, *, test=None, train=None, normalize=None, layers=None,
             num_members=None, member_weights=None, modules=None, initial=None, titles=None, cost=None,
             geometry: bool = True,
             geometry_examples: int = GEOMETRY_EXAMPLES, device=None, seed: int = 0, progress: bool | None = None,
             path_points: int | str = 11, budget=None, precision=None) -> Diagnosis:
    """Every analyzer on any ensemble and any data, from Python (README: "From Python").

    `members`: an `EnsembleModel` (ensdiag's, loaded or imported), a list of `nn.Module`s (each maps
    a batch [B, …] to logits [B, C]), one `nn.Module` returning [k, B, C] (or [k·B, C] with
    `num_members`), a callable returning [k, B, C], or model file paths. `test` (alias `id`),
    `ood`, `shift`, `val`, `train`: `(x, y)` tensors, a tensor `x`, a Dataset or an iterable of
    batches. `normalize`: None applies the preprocessing an ensdiag model records (others get their
    inputs as given), "none" none, a (mean, std) pair per channel, or a function of a batch.
    `member_weights`: a function returning each member's effective weights, for ensembles whose
    members share parameters (your own BatchEnsemble). `modules`: the `nn.Module`s a callable
    runs, so they are measured in eval mode too (their modes restored). `initial`: the members before training (the
    same kinds as `members`), a `Tracker` (its epoch 0) or a number: the weight cosine the trained
    one is read against. `titles`: {split: what the data is}. `cost`: {"parameters", "train_seconds"}
    for the report's cost table (parameters are counted when not given). `layers`: the modules CKA
    reads, as names or {name: layout}. `device`: where inputs go (default: where the members are;
    the members are never moved). `progress`: a bar per split (default: when stderr is a terminal).
    `path_points`: points on each path between members, or "adaptive". `budget`: a time the whole
    diagnosis may take ("5m", "90s", seconds) and/or `precision`: an interval half-width at which a
    step stops reading examples; each step then reads the examples its measured cost affords, and
    `metrics["budget"]` says what was measured, with what precision, and what was skipped and why."""
    from .planning import Plan
    from .numbers import integer, seed as checked_seed
    from .quickcheck import path_points_option
    path_points, seed = path_points_option(path_points, "path_points"), checked_seed(seed, "seed")
    if isinstance(geometry_examples, bool) or not isinstance(geometry_examples, int):
        raise InputTypeError(f"geometry_examples must be a whole number, got {type(geometry_examples).__name__}")
    geometry_examples = integer(geometry_examples, "geometry_examples", 1)
    plan = Plan.of(budget, precision, geometry)
    if test is not None and id is not None:
        raise EnsdiagError("give the test data once: test= (id= is its older name)")
    test = test if test is not None else id
    if test is None:
        raise EnsdiagError("diagnose needs in-distribution test data: test=(x, y)")
    ensemble = as_ensemble(members, layers=layers, num_members=num_members, member_weights=member_weights,
                           modules=modules)
    device = ensemble.device if device is None else checked_device(device, ensemble)
    given = {"id": test, "shift": shift, "ood": ood, "val": val}
    names = {name: f"{name} (given to diagnose)" for name, data in given.items() if data is not None}
    return inspect(ensemble, given, preprocess=preprocessing(normalize, ensemble, device), device=device, seed=seed,
                   geometry=geometry, train=train, geometry_examples=geometry_examples, path_points=path_points,
                   titles={**names, **_checked_titles(titles)}, cost=_cost(ensemble, cost),
                   initial=initial_cosine(initial, ensemble, seed), progress=_bars(progress), plan=plan)


def preprocessing(normalize, ensemble, device):
    """The function each batch goes through (module docstring of `diagnose`: `normalize`)."""
    from .data.batching import Normalize
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
    from numbers import Real
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
    from .analysis import metrics as M
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


def count_parameters(ensemble) -> int | None:
    """Distinct parameters (by storage) of the ensemble's modules; None for a callable."""
    seen, total = set(), 0
    for module in ensemble.modules():
        for parameter in module.parameters():
            key = (parameter.untyped_storage().data_ptr(), parameter.storage_offset(), parameter.shape)
            if key not in seen:
                seen.add(key)
                total += parameter.numel()
    return total if seen else None


def _cost(ensemble, cost) -> dict:
    from .diagnosis import checked_cost
    counted = count_parameters(ensemble)
    return checked_cost({**({"parameters": counted} if counted is not None else {}), **checked_cost(cost or {})})


def _checked_titles(titles) -> dict:
    if titles is None:
        return {}
    if not isinstance(titles, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in titles.items()):
        raise InputTypeError("titles must map split names (test, id, ood, shift, val) to strings")
    from .errors import unknown
    for name in titles:
        if name not in ("test", "id", "ood", "shift", "val"):
            raise unknown("split in titles", name, ("test", "id", "ood", "shift", "val"))
    return {("id" if name == "test" else name): text for name, text in titles.items()}


def checked_device(device, ensemble=None):
    """The device inputs go to: a real one, and where the members are (ensdiag never moves them)."""
    import torch
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
    import sys
    if not (sys.stderr.isatty() if progress is None else progress):
        return None
    from rich.console import Console
    from rich.progress import track
    return lambda name: (lambda items: track(items, description=f"diagnose: {name}", transient=True,
                                             console=Console(stderr=True)))
