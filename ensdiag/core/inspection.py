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

from .. import distributed
from ..analysis import all_analyzers, analyze_model, analyze_predictions
from ..analysis.registry import Skip, without_ood_labels
from ..checks import check_predictions
from ..data.registry import Split
from ..ensembles import as_ensemble, forked_rng, measuring
from ..errors import EnsdiagError
from ..predictions import with_pooled_shift
from .diagnosis import Diagnosis
from .intervals import GENERIC_SECONDS, add_intervals
from .predict import GEOMETRY_SPLITS, predict_splits



def inspect(ensemble, splits: dict, *, preprocess=None, device=None, seed: int = 0, geometry: bool = True,
            train=None, geometry_examples: int | None = None, path_points=11, only=None, titles=None, skipped=None,
            cost=None, initial=None, spread: bool = False, progress=None, status=None, no_data: str | None = None,
            plan=None, detail: bool = False):
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
    (a time budget and/or a precision target) that chooses the examples each step reads. `detail`:
    intervals for the detail catalogue too (every declared column, CKA, barriers), not only the
    headline tables'."""
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
        metrics = _analyze(predictions, weights, only, no_data, plan, detail)
        if geometry:
            from ..analysis.geometry import ModelProbe
            probe_splits = {name: kept.get(name, splits.get(name)) for name in GEOMETRY_SPLITS if name in predictions}
            train_split = _training_split(train, geometry_examples)
            probe = ModelProbe(ensemble, probe_splits, preprocess, train_split.images if train_split else None,
                               geometry_examples, train_labels=train_split.labels if train_split else None,
                               path_points=path_points, train_source=train_split.source if train_split else None,
                               detail=detail)
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


def inspect_predictions(predictions: dict, where: str = "predictions", titles=None, source="ensdiag analyze",
                        detail: bool = False):
    """A `Diagnosis` of member logits made anywhere (files, arrays, JSON lines): checked in the one
    place, then every predictions analyzer (`detail`: every declared column's interval too)."""
    predictions = with_pooled_shift(check_predictions(predictions, where, need_id=False))
    examples = without_ood_labels(predictions)  # what the analyzers and the intervals share
    metrics = analyze_predictions(examples)
    add_intervals(metrics, examples, detail=detail)
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


def _analyze(predictions, weights, only, no_data, plan=None, detail=False):
    """The predictions analyzers' metrics dict, each headline number with its example-level
    interval (intervals.py); without predictions, those that read only weights."""
    import time
    began = time.perf_counter()
    predictions = without_ood_labels(predictions)  # what the analyzers and the intervals share
    metrics = analyze_predictions(predictions, weights=weights, only=None if only is None else _names(only, "predictions"),
                                  without_data=no_data)
    if not predictions:
        return metrics
    if plan is None:
        add_intervals(metrics, predictions, weights, detail=detail)
    else:  # a plug-in re-run on resamples gets a tenth of what is left
        add_intervals(metrics, predictions, weights, full=plan.full, detail=detail,
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
        from ..data.given import batches
        batches(train, "train")  # checked as any split's pair is
        return Split(train[0], train[1], "training inputs")
    if isinstance(train, torch.Tensor):
        return Split(train, None, "training inputs")
    from ..data.given import first
    found = first(train, max(limit or 0, TRAINING_EXAMPLES), "train")
    return None if found is None else Split(found[0], found[1], "training inputs")
