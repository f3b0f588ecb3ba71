"""Analyzers over member logits and member weights; `analyze_predictions` runs them all.

    result = analyze_predictions(predictions, weights=model.member_weights())
    result["analyzers"]["ood"]["scores"]["msp"]["auroc"]["value"]
"""

from .. import __version__
from ..precision import exact_math
from ..registry import import_all
from ..errors import Skip  # (a plug-in's contract: `from ensdiag.analysis import Skip, metric, register_analyzer`)
from ..layout import SPLIT_TABLES, finite, is_ood_split, metric
from .registry import ANALYZERS, CATALOGUE_LEFT_OUT, PLUGIN_ERRORS, Column, all_analyzers, load_plugins, register_analyzer, without_ood_labels

METRICS_SCHEMA = "ensdiag.metrics/2"  # 2: example-level intervals beside the headline numbers ("intervals")

# The built-in analyzers: every module of this package registers its own on import (adding an
# analyzer is adding a module here, or a plug-in); nothing keeps a list. Alphabetical order is
# the order they run and appear in metrics.json.
import_all(__name__)


def analyze_predictions(predictions, weights=None, only=None, without_data: str | None = None,
                        catalogue: bool = True) -> dict:
    """Every registered analyzer (or those named in `only`) on the predictions; metrics.json's content.
    `without_data`: there are no predictions, and why: analyzers that read them are skipped with it
    (those that read only the member weights, `reads_data=False`, still run). `catalogue=False`: the
    detail catalogue is left out (its analyzers skipped, saying so; others' detail parts N/A)."""
    predictions = without_ood_labels(predictions)  # OOD is unlabelled for every analyzer
    results = plugin_failures() if only is None else {}
    for name in predictions_analyzers(only):
        results[name] = run_analyzer(name, predictions, weights, without_data, catalogue)
    return envelope(predictions, weights, results)


def predictions_analyzers(only=None) -> list[str]:
    """The names `analyze_predictions` runs, in order: every predictions analyzer, or those in `only`."""
    return [name for name, analyzer in all_analyzers().items() if analyzer.needs == "predictions"] if only is None else list(only)


def plugin_failures() -> dict:
    """A plug-in that failed to import is a failed analyzer, in every result."""
    load_plugins()
    return {name: {"status": "failed", "reason": f"plug-in failed to import ({error})"}
            for name, error in PLUGIN_ERRORS.items()}


def run_analyzer(name: str, predictions, weights=None, without_data: str | None = None, catalogue: bool = True) -> dict:
    """One predictions analyzer's entry of metrics.json (predictions already without OOD labels)."""
    return _entry(name, lambda analyzer: analyzer(predictions, weights, catalogue=catalogue), without_data, catalogue)


def _entry(name: str, call, without_data: str | None, catalogue: bool = True) -> dict:
    """An analyzer's entry of metrics.json: `call(analyzer)`'s result, or why it was skipped."""
    analyzer = all_analyzers()[name]
    try:
        if without_data and analyzer.reads_data:
            raise Skip(without_data)
        if analyzer.detail and not catalogue:
            raise Skip(CATALOGUE_LEFT_OUT)
        return {"status": "ok", "description": analyzer.description, "version": analyzer.version, **call(analyzer)}
    except Skip as reason:
        return {"status": "skipped", "description": analyzer.description, "reason": str(reason)}


def envelope(predictions, weights, results: dict) -> dict:
    """metrics.json around the analyzers' results: schema, sizes, conventions."""
    first = next(iter(predictions.values()))["logits"] if predictions else None
    return {"schema": METRICS_SCHEMA, "ensdiag_version": __version__,
            "num_members": first.shape[0] if first is not None else len(weights) if isinstance(weights, list) else None,
            "num_classes": first.shape[2] if first is not None else None,
            "splits": {name: {"n": split["logits"].shape[1], "labelled": split["labels"] is not None}
                       for name, split in predictions.items()},
            "conventions": {"log": "natural", "p̄": "mean of member softmax probabilities",
                            "ood_positive": "OOD", "ood_default_score": "1 − MSP",
                            "ood_labels": "never used: OOD splits are unlabelled for every analyzer"},
            "analyzers": results}


def analyze_model(probe, only=None, without_data: str | None = None) -> dict:
    """{name: result} of every model analyzer (or those in `only`) on a `ModelProbe`: entries to
    merge into metrics.json's "analyzers". Forward passes run in exact fp32 (precision.py).
    `without_data`: there is no data, and why: analyzers that read data are skipped with it."""
    analyzers = all_analyzers()
    names = [name for name, analyzer in analyzers.items() if analyzer.needs == "model"] if only is None else list(only)
    results = {}
    with exact_math():
        for name in names:
            try:
                results[name] = finite(_entry(name, lambda analyzer: analyzer.function(probe), without_data))
            except Exception as error:  # e.g. extreme weights: the trained model must still be saved
                message = " ".join(str(error).split())[:200]
                results[name] = {"status": "failed", "description": analyzers[name].description,
                                 "reason": f"{type(error).__name__}: {message}" if message else type(error).__name__}
    return results


__all__ = ["analyze_model", "ANALYZERS", "Column", "METRICS_SCHEMA", "SPLIT_TABLES", "Skip", "all_analyzers", "analyze_predictions", "is_ood_split",
           "load_plugins", "metric", "register_analyzer", "without_ood_labels"]
