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

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from .. import distributed
from ..analysis import all_analyzers, analyze_model
from ..analysis.diversity_gap import TRAINING_SAMPLE
from ..analysis.geometry import ModelProbe
from ..analysis.registry import CATALOGUE_LEFT_OUT
from ..checks import check_predictions
from ..data.given import batches, first
from ..data.registry import Split
from ..ensembles import as_ensemble, seeded
from ..errors import EnsdiagError, Skip
from ..geometry.baselines import recorded_or_rebuilt
from ..geometry.paths import seeded_sample
from ..predictions import with_pooled_shift
from .analyzed import analyzed
from .diagnosis import Diagnosis
from .intervals import GENERIC_SECONDS
from .planned_geometry import estimate_full, run_geometry
from .planning import Plan
from .predict import GEOMETRY_SPLITS, Interrupted

@dataclass(frozen=True)
class Measure:
    """What an inspection measures (the defaults are the commands')."""

    geometry: bool = True  # member geometry (CKA, alignment, paths, rank) where a model is at hand
    geometry_examples: int | None = None  # inputs per split member geometry reads (None: all; diagnose(): 2,000)
    path_points: int | str = 11  # points on each path between members, or "adaptive"
    only: tuple | None = None  # the analyzers to run (None: every registered one)
    detail: bool = False  # intervals for the detail catalogue too, not only the headline tables'
    catalogue: bool = True  # the detail catalogue's numbers (a training grid's runs: only with `train --detail`)
    seed: int = 0  # MC Dropout's masks (geometry's own draws are fixed)
    budget: float | str | None = None  # a time the inspection may take ("5m", "90s", seconds; planning.py)
    precision: float | None = None  # an interval half-width at which a step stops reading examples


@dataclass(frozen=True)
class Context:
    """Where an inspection runs, how it shows progress, and what its outputs say of the data."""

    device: object = None  # where inputs go (default: where the members are; they are never moved)
    spread: bool = False  # under torchrun, every rank predicts a share (rank 0 gets the Diagnosis)
    titles: dict | None = None  # {split: what the data is}
    skipped: dict | None = None  # {split: why it is absent}
    cost: dict | None = None  # {"parameters", "train_seconds"} for the report's cost table
    initial: dict | None = None  # {"mean", "source"}: the members' weight cosine before training
    no_data: str | None = None  # there is nothing to predict on, and why (the weights alone are inspected)
    progress: object = None  # progress(split) -> a wrapper of that split's batches (a bar); diagnose(): True/False too
    status: object = None  # status(text) -> a context manager around each slow step (a status line)
    draws: object = None  # bootstrap.Draws shared by several inspections (a grid's runs: the same splits, drawn once)


INTERRUPTED = "interrupted (Ctrl-C) before this step"


def inspect(ensemble, splits: dict, *, preprocess=None, train=None, measure: Measure = Measure(),
            context: Context = Context()):
    """A `Diagnosis` of `ensemble` (anything `as_ensemble` takes) on `splits` ({name: data in any
    form `data.given` reads}; names id, shift, shift/<c>, ood, val). `preprocess`: applied to each
    batch on the members' device (None: as given); `train`: labelled training inputs (BatchNorm
    statistics and the training loss along paths).

    Interrupted (Ctrl-C) after the in-distribution split was read, it keeps what it finished: the
    splits read so far are analysed, the steps not reached say so, and `metrics["interrupted"]`
    says where it stopped (the commands print or save it, then exit 130)."""
    ensemble, plan = as_ensemble(ensemble), Plan.of(measure.budget, measure.precision, measure.geometry)
    device = context.device if context.device is not None else ensemble.device
    preprocess = preprocess or (lambda x: x)
    status = context.status or (lambda text: nullcontext())
    predictions, kept, skipped, interrupted = {}, {}, dict(context.skipped or {}), None
    train = _training_split(train, measure.geometry_examples)
    if context.no_data is None:
        splits = {**splits, **_training_sample(train, splits, measure.only)}
        keep = (2**62 if measure.geometry_examples is None else measure.geometry_examples) if measure.geometry else 0
        try:
            with status("predicting every split …"):
                found, kept = plan.predict(ensemble, splits, preprocess, device, measure.seed, context.spread,
                                           context.progress, keep)
        except Interrupted as stopped:
            if "id" not in stopped.found:  # nothing measured yet: nothing to keep
                raise KeyboardInterrupt from None
            found, kept, interrupted = stopped.found, stopped.kept, f"while predicting {stopped.split}"
            skipped.update({name: INTERRUPTED for name in stopped.left})
        if context.spread and not distributed.ranks().main:
            return None
        if "id" not in found:
            raise EnsdiagError("nothing to measure on: in-distribution data (the test split) is needed")
        predictions = with_pooled_shift(check_predictions(found, "the data given", need_id=True))
    with seeded(ensemble, None):  # geometry draws (paths' BatchNorm passes, plain networks): the user's state stays
        weights = member_weights(ensemble, measure.seed, context.initial)
        metrics = _analyze(predictions, weights, measure, context.no_data, plan, context.draws)
        if measure.geometry:
            results, stopped = _geometry(ensemble, splits, kept, predictions, train, preprocess, measure, context,
                                         plan, status, interrupted)
            metrics["analyzers"].update(results)
            interrupted = interrupted or stopped
    if plan.limited:
        estimate_full(plan, {**metrics, "ensemble": describe(ensemble)}, measure.geometry_examples, measure.path_points,
                      measure.detail)
        metrics["budget"] = plan.to_json()
    if interrupted:
        metrics["interrupted"] = f"Ctrl-C {interrupted}: what was finished before is kept, the rest says so"
    titles = dict(context.titles) if context.titles is not None else {name: name for name in predictions}
    if "train" in predictions and "train" not in titles:
        titles["train"] = getattr(splits["train"], "source", None) or "training examples"
    metrics["split_titles"], metrics["skipped_splits"] = titles, skipped
    metrics["ensemble"] = describe(ensemble)
    return Diagnosis(metrics, predictions, titles, cost=dict(context.cost or {}))


def _geometry(ensemble, splits, kept, predictions, train, preprocess, measure, context, plan, status, interrupted):
    """({name: result} of the model analyzers, where a Ctrl-C stopped them or None): each step run
    through the plan; once interrupted, the steps not reached are skipped saying so."""
    names = _names(measure.only, "model")
    if interrupted:
        return {name: _skipped(name, INTERRUPTED) for name in names}, None
    left_out = {name: _skipped(name, CATALOGUE_LEFT_OUT) for name in names
                if not measure.catalogue and all_analyzers()[name].detail}
    names = [name for name in names if name not in left_out]
    probe_splits = {name: kept.get(name, splits.get(name)) for name in GEOMETRY_SPLITS if name in predictions}
    probe = ModelProbe(ensemble, probe_splits, preprocess, train.images if train else None, measure.geometry_examples,
                       train_labels=train.labels if train else None, path_points=measure.path_points,
                       train_source=train.source if train else None, detail=measure.detail)  # train: a Split or None
    results = dict(left_out)
    try:
        run_geometry(plan, probe, names, lambda name: analyze_model(probe, only=[name], without_data=context.no_data),
                     status, results)
    except KeyboardInterrupt:
        done = ", ".join(results) or "none"
        results.update({name: _skipped(name, INTERRUPTED) for name in names if name not in results})
        return results, f"during member geometry (steps finished: {done})"
    return results, None


def _skipped(name: str, reason: str) -> dict:
    analyzer = all_analyzers()[name]
    return {"status": "skipped", "description": analyzer.description, "reason": reason}


def inspect_predictions(predictions: dict, where: str = "predictions", titles=None, source="ensdiag analyze",
                        detail: bool = False):
    """A `Diagnosis` of member logits made anywhere (files, arrays, JSON lines): checked in the one
    place, then every predictions analyzer (`detail`: every declared column's interval too)."""
    predictions = with_pooled_shift(check_predictions(predictions, where, need_id=False))
    metrics = analyzed(predictions, detail=detail)  # (analyzed wraps each split once: analyzers and intervals share it)
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
        weights.initial = initial if initial is not None else recorded_or_rebuilt(ensemble.model, seed)
    return weights


def describe(ensemble) -> dict:
    """What was inspected, for every output: method, k, architecture where known."""
    spec = ensemble.spec
    return {"method": ensemble.method, "num_members": ensemble.num_members,
            **({"arch": spec.arch, "input_shape": list(spec.input_shape)} if spec is not None else {})}


def _analyze(predictions, weights, measure: Measure, no_data, plan: Plan, draws=None):
    """The predictions analyzers' metrics dict, each headline number with its example-level
    interval (intervals.py); without predictions, those that read only weights."""
    began = time.perf_counter()
    only = None if measure.only is None else _names(measure.only, "predictions")
    # a plug-in re-run on resamples gets a tenth of what a budget has left
    metrics = analyzed(predictions, weights, only, no_data, catalogue=measure.catalogue, full=plan.full, detail=measure.detail,
                       allowance=plan.allowance(GENERIC_SECONDS), draws=draws)
    if predictions and plan.limited:
        plan.record("analyzers and intervals", seconds=round(time.perf_counter() - began, 2))
    return metrics


def _names(only, needs: str) -> list[str]:
    """The registered analyzers of a kind ("predictions" or "model"), those in `only` where given."""
    return [name for name, analyzer in all_analyzers().items() if analyzer.needs == needs and (only is None or name in only)]


TRAINING_EXAMPLES = 10_000  # training inputs read from a loader or Dataset, for the probe's seeded samples


def _training_sample(train: Split | None, splits: dict, only) -> dict:
    """{"train": the seeded sample of labelled training examples the diversity gap reads
    (analysis/diversity_gap.py)}, or {} where there are no labelled training data, the caller
    gave a split of that name, or the analyzers asked for do not include it (nothing is
    predicted that no analyzer reads)."""
    if train is None or train.labels is None or len(train) == 0 or "train" in splits \
            or (only is not None and "diversity-gap" not in only):
        return {}
    pick = seeded_sample(len(train), TRAINING_SAMPLE)
    source = (f"{len(pick):,} training examples (a seeded sample of at most {TRAINING_SAMPLE:,}) of "
              f"{train.source or f'{len(train):,} training inputs'}")
    return {"train": Split(train.images[pick], train.labels[pick], source)}


def _training_split(train, limit) -> Split | None:
    """The training data the probe samples from (BatchNorm statistics, the training loss along
    paths): tensors and Splits whole, so its seeded sample covers every class; from a loader or
    Dataset its first `TRAINING_EXAMPLES` (shuffle the loader if it is sorted by class)."""
    if train is None:
        return None
    if isinstance(train, Split):
        return train
    if isinstance(train, (tuple, list)) and len(train) == 2 and all(isinstance(t, torch.Tensor) for t in train):
        batches(train, "train")  # checked as any split's pair is
        return Split(train[0], train[1], "training inputs")
    if isinstance(train, torch.Tensor):
        return Split(train, None, "training inputs")
    found = first(train, max(limit or 0, TRAINING_EXAMPLES), "train")
    return None if found is None else Split(found[0], found[1], "training inputs")
