"""The predictions analyzers, each with its example-level intervals, over forked processes where the work is large.

    metrics = analyzed(predictions, weights, detail=False)   # = analyze_predictions, then add_intervals

Each analyzer and its intervals is one task (the intervals read the per-example terms the analyzer
kept); the tasks run in forked worker processes (`ensdiag/forked.py`) when the predictions hold at
least `PARALLEL_EXAMPLES` member-examples and the machine has the cores (measured on 2 cores: a
worker computes with one torch thread, forked.py), else one after another here. Nothing is forked
where CUDA is initialised or a tensor is not on the CPU. Either way metrics.json holds the same
entries in the same order. Where something raises: in this process every analyzer runs before any
interval, forked each analyzer's intervals follow it, and the first task in order that raised
raises here (an analyzer's own error, or its intervals').
"""

from functools import partial

from .. import forked
from ..analysis import analyze_predictions, envelope, plugin_failures, predictions_analyzers, run_analyzer
from ..stats import bootstrap as B
from ..analysis.registry import without_ood_labels
from .intervals import add_intervals, interval_summary

SHARED = ("log_probs", "log_mean", "mean", "confidence", "predicted", "member_predicted", "undefined", "entropy",
          "correct", "nll")  # Examples' per-example terms (the last two: labelled splits)
PARALLEL_EXAMPLES = 100_000  # members × examples over every split below which forking gains little (measured)


def analyzed(predictions, weights=None, only=None, without_data: str | None = None, catalogue: bool = True,
             **intervals) -> dict:
    """metrics.json's content: `analyze_predictions` (`catalogue`: the detail catalogue's numbers too),
    then (where there are predictions) `add_intervals` with the keyword arguments given (detail, full,
    allowance, draws)."""
    predictions = without_ood_labels(predictions)
    names = predictions_analyzers(only)
    processes = processes_for(predictions, len(names))
    if processes == 1:
        metrics = analyze_predictions(predictions, weights, only, without_data, catalogue)
        if predictions:
            add_intervals(metrics, predictions, weights, **intervals)
        return metrics
    for split in predictions.values():  # what most analyzers read, made once here for every worker
        for name in SHARED if split.labels is not None else SHARED[:-2]:
            try:
                getattr(split, name)
            except Exception:  # (only made ahead: the analyzer that reads it meets it as it would in process)
                break
    draws = intervals.pop("draws", None) or B.Draws()  # each worker's copy fills with the counts its analyzers read
    outcomes = forked.run([partial(_with_intervals, name, predictions, weights, without_data, catalogue, draws, intervals)
                           for name in names], processes, stop=True)
    failed = next((found for ok, found in outcomes if not ok), None)
    if failed is not None:
        raise failed
    results, notes = plugin_failures() if only is None else {}, {}
    for name, (_, (result, note)) in zip(names, outcomes):
        results[name] = result
        if note:
            notes[name] = note
    metrics = envelope(predictions, weights, results)
    metrics["intervals"] = interval_summary(intervals.get("resamples", B.RESAMPLES), intervals.get("detail", False), notes)
    return metrics


def _with_intervals(name, predictions, weights, without_data, catalogue, draws, intervals) -> tuple[dict, str | None]:
    metrics = envelope(predictions, weights, {name: run_analyzer(name, predictions, weights, without_data, catalogue)})
    notes = add_intervals(metrics, predictions, weights, only=[name], draws=draws, **intervals)
    return metrics["analyzers"][name], notes.get(name)


def processes_for(predictions: dict, tasks: int | None = None) -> int:
    """The processes `analyzed` runs these predictions' analyzers in (1: this one)."""
    tasks = len(predictions_analyzers()) if tasks is None else tasks
    if not predictions or tasks < 2:
        return 1
    logits = [split["logits"] for split in predictions.values()]
    if sum(value.shape[0] * value.shape[1] for value in logits) < PARALLEL_EXAMPLES:
        return 1
    if any(value.device.type != "cpu" for value in logits):
        return 1
    return forked.workers(tasks)  # (none where CUDA is initialised)
