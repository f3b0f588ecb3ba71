"""The analyzer registry: built-ins by decorator, plug-ins through the entry-point group.

An analyzer is a function `(predictions, weights) -> result dict`, registered with
`@register_analyzer("name", description=..., columns=[Column(...), ...])`; the columns say what a
report shows of its result (reports are built from them). `predictions` maps split names to
{"logits": float [k, N, C], "labels": int64 [N] | None}; `weights` is a model's
`member_weights()` or None. It raises `Skip("reason")` when its inputs are missing.
Analyzers never print and never read files. Every reported number goes through `metric()`:
NaN and ±inf become null with a status saying which, so metrics.json is always valid JSON;
a split without samples gives null metrics with status "empty".

A model analyzer (`needs="model"`) is a function `(probe) -> result dict` instead: it reads the
model itself and data through a `ModelProbe` (analysis/geometry.py: member networks,
evaluation images, training images for BatchNorm); `analyze_model` runs those, where a model
is at hand (training, `ensdiag diversity`), and their results sit beside the others.

Third-party analyzers: in your package's pyproject.toml
    [project.entry-points."ensdiag.analyzers"]
    my-analyzer = "my_package.module:my_function"
where `my_function` is decorated with `@ensdiag.analysis.register_analyzer("my-analyzer")`
(or is a plain function of the same signature, registered under the entry point's name).
"""

import inspect
from dataclasses import dataclass, replace
from importlib.metadata import entry_points

from ..layout import HEADLINE_TABLES, SPLIT_TABLES, is_ood_split
from ..registry import Registry
from ..stats.examples import Examples

ENTRY_POINT_GROUP = "ensdiag.analyzers"
CATALOGUE_LEFT_OUT = ("the detail catalogue, left out of a training grid's runs unless `ensdiag train --detail` "
                      "(`ensdiag evaluate MODEL` or, for member geometry, `ensdiag diversity MODEL` computes it for one "
                      "model)")
ANALYZERS = Registry("analyzer")  # name -> Analyzer, in the order registered (the order they run)


def without_ood_labels(predictions: dict) -> dict:
    """{split: Examples} (examples.py), the labels of every OOD split dropped: what analyzers read.
    Splits already wrapped keep what they computed, so analyzers and intervals share it."""
    found = {}
    for name, split in predictions.items():
        split = Examples.of(split)
        found[name] = split.without_labels() if is_ood_split(name) and split.labels is not None else split
    return found


def labelled(predictions: dict, names=None) -> list:
    """[(split, Examples)] of the labelled splits that hold examples (those in `names`, where given)."""
    return [(name, Examples.of(split)) for name, split in predictions.items() if split["labels"] is not None
            and len(split["labels"]) and (names is None or name in names)]



@dataclass(frozen=True)
class Column:
    """A number an analyzer puts into the report: where it is in the analyzer's result, how it
    is labelled, which way is better, what it means, and in which report tables it appears.

    `path` may contain "{split}", replaced by the split of a per-split table (`SPLIT_TABLES`);
    `split` names the split a column of another table depends on (dropped when that split was
    skipped). `peer` is the path of the same quantity computed as a peer library does, which a
    report shows instead when asked (`--conventions torch-uncertainty`). `tables` are table ids: "id", "shift", "ood", "diversity", or any other name (a
    table of its own, e.g. a plug-in's). Within a table, columns are ordered by `order`.
    `examples` says which splits' test examples the number is a statistic of (`example_splits`):
    the inspection core puts a bootstrap interval over those examples beside its value."""

    label: str
    path: tuple[str, ...]
    direction: str | None  # "up", "down" or None (no better side)
    definition: str
    tables: tuple[str, ...]
    order: int = 100
    split: str | None = None
    since: int = 1  # the analyzer version that added the column: results of older versions show N/A
    peer: tuple[str, ...] | None = None  # where the peer convention's value is (`report --conventions torch-uncertainty`)
    peer_since: int = 1  # the analyzer version that added it
    examples: tuple[str, ...] | bool | None = None  # the splits whose examples it is a statistic of (below)
    # its interval's construction (constructions.py, chosen from benchmarks/interval_coverage.py's record): "percentile";
    # "basic" where its resamples carry a bias of their own (a debiased estimator re-biased by the duplicates);
    # "upper" ([0, …]) for an unsigned error a test set puts above 0 where the population's is 0; "logit" for a
    # number in [0, 1] that may sit near 1 (AUROC; "logit-debiased" where it also reads high there: AUPR);
    # "binomial:SPLIT" for a fraction of SPLIT's examples past a threshold (FPR95). A folded statistic is
    # inverted along its ray unless it says "upper"
    interval: str = "percentile"

    def example_splits(self, split: str | None = None) -> tuple[str, ...]:
        """The splits whose test examples this number is a statistic of, so the inspection core
        resamples them for its interval (`ensdiag/core/intervals.py`); () for a number of no examples.
        `examples` None (the default) means: the split of a per-split table ("{split}" in the path,
        or the table's own), else the split the column names; True the same; False none; a tuple
        names them (e.g. ("id", "ood") for an OOD detection score)."""
        if self.examples is False:
            return ()
        if isinstance(self.examples, tuple):
            return self.examples
        if "{split}" in "".join(self.path):
            return (split,) if split else ()
        if self.split is not None:
            return (self.split,)
        return tuple(table for table in self.tables if table in SPLIT_TABLES)

    @property
    def headline(self) -> bool:
        """Shown in a headline table (`HEADLINE_TABLES`): its interval is computed on every run."""
        return any(table in HEADLINE_TABLES for table in self.tables)

    def as_peer(self) -> "Column":
        """The column reading the peer convention's value (the same column without one)."""
        if self.peer is None:
            return self
        return replace(self, label=f"{self.label} (torch-uncertainty)", path=self.peer, since=self.peer_since,
                       definition=f"{self.definition}; computed as torch-uncertainty does (docs/conventions.md)")

    def key_path(self, split: str | None = None) -> tuple[str, ...]:
        return tuple(part.replace("{split}", split or "") for part in self.path)

    def reads(self, path: tuple) -> bool:
        """Whether `path` is this column's value or its peer's (any split in place of "{split}")."""
        return any(declared is not None and len(declared) == len(path)
                   and all(part == key or "{split}" in part for part, key in zip(declared, path))
                   for declared in (self.path, self.peer))


@dataclass(frozen=True)
class Analyzer:
    name: str
    function: callable
    description: str
    version: int = 1
    source: str = "built-in"
    columns: tuple[Column, ...] = ()
    needs: str = "predictions"  # or "model": called with a ModelProbe
    reads_data: bool = True  # an analyzer that reads only the member weights says False (it runs without data)
    detail: bool = False  # all of it belongs to the detail catalogue: computed where asked for (`catalogue`)

    def __call__(self, predictions, weights=None, catalogue: bool = True):
        if not catalogue:  # its own detail part left out, where it takes a `catalogue` keyword
            try:
                takes = "catalogue" in inspect.signature(self.function).parameters
            except (TypeError, ValueError):  # a callable without a signature to read: called as (predictions, weights)
                takes = False
            if takes:
                return self.function(predictions, weights, catalogue=False)
        return self.function(predictions, weights)

    @property
    def resampler(self):
        """The analyzer's vectorised resampling of its example-level columns, or None (`register_resampler`)."""
        return RESAMPLERS.get(self.name)


RESAMPLERS = Registry("resampler")  # analyzer name -> its resampler


def register_resampler(name: str):
    """Register `function(predictions, weights, result, wanted) -> resample`: analyzer `name`'s
    example-level columns over resamples, vectorised. `result` is the analyzer's own result,
    `wanted` the key paths asked for; `resample(counts)` maps {split: [b, n] float64, how often
    each example was drawn in each of b resamples} to {key path: Tensor [b] or `constructions.Folded`}.
    With counts of ones it gives the analyzer's own values (tests/test_intervals.py checks every
    built-in against re-running its analyzer); paths it leaves out are resampled by re-running."""
    return RESAMPLERS.register(name)


def register_analyzer(name: str, description: str = "", version: int = 1, source: str = "built-in", columns=(),
                      needs: str = "predictions", reads_data: bool = True, detail: bool = False):
    """Register `function(predictions, weights) -> result` (or `function(probe)` with `needs="model"`);
    `columns` declare what reports show of it; `reads_data=False`: an analyzer that needs only the
    members' weights (it runs where there is no data); `detail=True`: the analyzer is part of the
    detail catalogue, which a training grid's runs compute only with `train --detail` (none of its
    columns may be in a headline table). A function with a `catalogue` keyword is told whether the
    catalogue is wanted, and leaves its own detail part out when it is not."""
    if needs not in ("predictions", "model"):
        raise ValueError(f"analyzer {name!r}: needs must be 'predictions' or 'model', not {needs!r}")

    def register(function):
        for column in columns:
            if not isinstance(column, Column) or column.direction not in ("up", "down", None) \
                    or not column.tables or not column.path or isinstance(column.tables, str):
                raise ValueError(f"analyzer {name!r}: column {getattr(column, 'label', column)!r} must be a Column "
                                 "with a path, a tuple of tables and a direction")
            if not (column.examples is None or isinstance(column.examples, bool) or (
                    isinstance(column.examples, tuple) and all(isinstance(split, str) for split in column.examples))):
                raise ValueError(f"analyzer {name!r}: column {column.label!r}: examples must be None, True, False or "
                                 "a tuple of split names")
        if detail and any(table in HEADLINE_TABLES for column in columns for table in column.tables):
            raise ValueError(f"analyzer {name!r}: a detail analyzer cannot fill a headline table ({', '.join(HEADLINE_TABLES)})")
        ANALYZERS.add(name, Analyzer(name, function, description or (function.__doc__ or "").strip().split("\n")[0],
                                     version, source, tuple(columns), needs, reads_data, detail))
        return function
    return register


_plugins_loaded = False
PLUGIN_ERRORS: dict[str, str] = {}  # plug-in name -> why it failed to import (reported, never silent)


def load_plugins(force: bool = False) -> dict[str, str]:
    """Import every `ensdiag.analyzers` entry point; returns {name: error} for those that failed
    (also kept in `PLUGIN_ERRORS`, which `analyze_predictions` writes into every result)."""
    global _plugins_loaded
    if _plugins_loaded and not force:
        return dict(PLUGIN_ERRORS)
    PLUGIN_ERRORS.clear()
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:  # a broken plug-in (import, or bad column declarations) must not break ensdiag
            function = point.load()
            if point.name not in ANALYZERS:  # a plain function: its columns, if any, as an attribute
                register_analyzer(point.name, source=f"plug-in {point.value}",
                                  columns=getattr(function, "columns", ()))(function)
        except Exception as error:
            PLUGIN_ERRORS[point.name] = f"{type(error).__name__}: {error}"
    _plugins_loaded = True
    return dict(PLUGIN_ERRORS)


def all_analyzers() -> dict[str, Analyzer]:
    load_plugins()
    return dict(ANALYZERS)
