"""Results as flat numbers and tidy tables: for pandas, spreadsheets and experiment trackers.

    flat = flat_metrics(diagnosis.metrics)          # {"calibration/id/accuracy": 0.97, ...}
    flat.reasons["disagreement/id/mean"]           # why a number is NaN: "needs at least two members (k = 1)"
    rows = report_rows(report)                      # one row per (table, method, column, seed)
    text = to_csv(rows, REPORT_FIELDS)              # pandas.read_csv reads it back
    rows = example_rows(predictions)                # per example: prediction, confidence, entropy, JSD, ...

Names. A number's name is its analyzer and its key path in the analyzer's result, joined by
"/", without the leading "splits" and the trailing "value": `calibration/id/accuracy`,
`disagreement/ood/mean`, `ood/scores/msp/auroc`, `paths/train_loss_barrier`. The headline
numbers are the report columns every analyzer declares (analysis/registry.py's `Column`), each
per split where its path names one ("{split}"): the same names exist for every ensemble,
whatever its k, splits or analyzers that ran. A number that was not measured is NaN, and
`reasons` says why (the analyzer's skip reason, a split that is missing, "not defined for these
inputs", ...). `full=True` adds every other scalar the analyzers stored (those names depend on
what ran). pandas is optional: these are plain dicts and lists; `frame` makes a DataFrame.
"""

import csv
import io
import math
from pathlib import Path

from .errors import EnsdiagError, path_argument
from .io import atomic_write_text
from .layout import SPLIT_TABLES, lookup
from .registry import Registry
from .text import csv_cell

STATUS_REASONS = {"n/a": "not defined for these inputs", "empty": "the split has no samples",
                  "omitted": "not stored for this many members", "missing": "not computed by the ensdiag that wrote it",
                  "nan": "the value is nan (non-finite inputs)", "non-finite": "non-finite entries"}


def flat_name(analyzer: str, path) -> str:
    """`calibration/id/accuracy` for ("splits", "id", "accuracy", "value") of `calibration`."""
    parts = list(path)
    if parts and parts[-1] == "value":
        parts = parts[:-1]
    if parts and parts[0] == "splits":
        parts = parts[1:]
    return "/".join([analyzer, *parts])


class FlatMetrics(dict):
    """{name: float}, NaN where a number was not measured; `reasons` {name: why} for those."""

    def __init__(self, values=(), reasons=None):
        super().__init__(values)
        self.reasons = dict(reasons or {})


def headline_entries() -> list[dict]:
    """Every declared report column of every registered analyzer (plug-ins included), one entry
    per split where its path names one: {name, analyzer, path, split, label, definition, since}."""
    from .analysis import all_analyzers
    entries = {}
    for analyzer in all_analyzers().values():
        for column in analyzer.columns:
            variants = [(column.path, column.since, column.label, column.definition)]
            if column.peer is not None:
                variants.append((column.peer, column.peer_since, f"{column.label} (torch-uncertainty)",
                                 f"{column.definition}; computed as torch-uncertainty does"))
            for path, since, label, definition in variants:
                splits = (([s for s in SPLIT_TABLES if s in column.tables] or list(SPLIT_TABLES))
                          if "{split}" in "".join(path) else [column.split])
                for split in splits:
                    key = tuple(part.replace("{split}", split or "") for part in path)
                    name = flat_name(analyzer.name, key)
                    entries.setdefault(name, {"name": name, "analyzer": analyzer.name, "path": key, "split": split,
                                              "label": label, "definition": definition, "since": since,
                                              "needs": analyzer.needs, "tables": column.tables})
    return list(entries.values())


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # a 400-digit integer from a damaged file
        return None


def _status_reason(entry: dict) -> str:
    status = entry.get("status")
    if isinstance(entry.get("note"), str):
        return entry["note"]
    reason = STATUS_REASONS.get(status, f"status {status}")
    definition = entry.get("definition")
    if status == "n/a" and isinstance(definition, str) and "N/A" in definition:  # e.g. "...; N/A for k = 1"
        reason += f" ({definition[definition.index('N/A'):]})"
    return reason


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _metric_value(node: dict) -> tuple[float, str | None]:
    """(value, None) of a metric() entry, or (NaN or ±inf, why) where it holds no finite number."""
    value = _number(node["value"])
    if value is not None:
        return value, None
    status = node.get("status")
    if status in NON_FINITE:
        return NON_FINITE[status], None if status != "nan" else _status_reason(node)
    return math.nan, _status_reason(node)


def read_entry(metrics: dict, entry: dict) -> tuple[float, str | None]:
    """(value, None) or (NaN, why it is missing) of one headline entry in a metrics dict."""
    result = metrics.get("analyzers", {}).get(entry["analyzer"])
    if not isinstance(result, dict):
        why = ("member geometry did not run here (it needs a model of two or more member networks, and geometry on)"
               if entry.get("needs") == "model" else "the analyzer did not run here")
        return math.nan, why
    if result.get("status") != "ok":
        return math.nan, str(result.get("reason") or result.get("status"))
    version = result.get("version", 1)
    if isinstance(version, int) and not isinstance(version, bool) and version < entry["since"]:
        return math.nan, f"written by version {version} of the {entry['analyzer']} analyzer, before this number existed"
    split = entry["split"]
    if split is not None and split not in metrics.get("splits", {}):
        return math.nan, f"no {split} split"
    path = entry["path"]
    holder, found = lookup(result, path[:-1] if path[-1] == "value" else path)
    if not found:
        return math.nan, "not in the analyzer's result"
    if isinstance(holder, dict) and "value" in holder:
        return _metric_value(holder)
    value = _number(holder)
    return (value, None) if value is not None else (math.nan, "not a number")


def _stored_scalars(analyzer: str, node, path=()):
    """(name, metric dict) of every scalar metric() entry under an analyzer's result."""
    if not isinstance(node, dict):
        return
    if "value" in node and "status" in node and not isinstance(node["value"], (list, dict)):
        yield flat_name(analyzer, path), node
        return
    for key, child in node.items():
        if isinstance(key, str):
            yield from _stored_scalars(analyzer, child, (*path, key))


def metric_entries(metrics: dict, full: bool = False) -> list[dict]:
    """One entry per number: {name, analyzer, split, label, definition, value, reason} (the
    headline numbers always; with `full`, every other scalar the analyzers stored)."""
    entries = []
    for entry in headline_entries():
        value, reason = read_entry(metrics, entry)
        entries.append({key: entry[key] for key in ("name", "analyzer", "split", "label", "definition", "tables")}
                       | {"value": value, "reason": reason})
    if full:
        known = {entry["name"] for entry in entries}
        for analyzer, result in metrics.get("analyzers", {}).items():
            if not isinstance(result, dict) or result.get("status") != "ok":
                continue
            for name, node in _stored_scalars(analyzer, {k: v for k, v in result.items() if k != "status"}):
                if name in known:
                    continue
                known.add(name)
                value, reason = _metric_value(node)
                parts = name.split("/")
                split = parts[1] if len(parts) > 2 and parts[1] in metrics.get("splits", {}) else None
                entries.append({"name": name, "analyzer": analyzer, "split": split, "label": parts[-1],
                                "definition": node.get("definition"), "tables": (), "value": value, "reason": reason})
    return entries


def flat_metrics(metrics: dict, full: bool = False) -> FlatMetrics:
    """{name: value} of a metrics dict (metrics.json's layout), NaN where not measured, with the
    reasons alongside (`.reasons`); the same names for every k (see the module's docstring)."""
    entries = metric_entries(metrics, full)
    return FlatMetrics({e["name"]: e["value"] for e in entries},
                       {e["name"]: e["reason"] for e in entries if e["reason"] is not None})


# ---------------------------------------------------------------- report tables, long and tidy

REPORT_FIELDS = ("table", "method", "label", "column", "split", "key", "seed", "value", "mean", "ci", "low", "high",
                 "n", "expected", "mark", "direction", "reference")


def report_rows(report: dict) -> list[dict]:
    """Every number of a report (aggregate.build_report) as long, tidy rows: one per table,
    method, column and seed (`value`: that seed's number, NaN where the seed has none), each
    with its cell's aggregate beside it (`mean`, `ci` half-width, `low`–`high` the 95 %
    interval, `n` seeds that have the number, `mark` best/second). Cells that are not averages
    over seeds (the verdict's shares, the bias-variance decomposition, published numbers) have
    one row with no seed. `key` is the number's flat name where it comes from an analyzer."""
    rows = []
    for table in report["tables"]:
        for row in table["rows"]:
            for column, cell in zip(table["columns"], row["cells"]):
                mean = _number(cell.get("mean"))
                ci = _number(cell.get("ci"))
                interval = cell.get("interval")
                low, high = ((_number(interval[0]), _number(interval[1])) if isinstance(interval, (list, tuple))
                             and len(interval) == 2 else (mean - ci, mean + ci) if ci is not None and mean is not None
                             else (None, None))
                common = {"table": table["id"], "method": row["method"], "label": row["label"], "column": column["name"],
                          "split": column.get("split"), "key": column.get("key"), "mean": mean, "ci": ci, "low": low,
                          "high": high, "n": cell.get("n"), "expected": cell.get("expected"), "mark": cell.get("mark"),
                          "direction": column.get("direction"), "reference": bool(row.get("reference"))}
                seeds = row.get("seeds")
                if seeds is None:
                    rows.append({**common, "seed": None, "value": mean})
                    continue
                by_seed = dict(zip(cell.get("seeds") or [], cell.get("values") or []))
                rows += [{**common, "seed": seed, "value": _number(by_seed.get(seed))} for seed in seeds]
    return rows


# ---------------------------------------------------------------- per example

EXAMPLE_FIELDS = ("method", "seed", "split", "index", "label", "prediction", "correct", "confidence", "nll", "entropy",
                  "expected_entropy", "jsd", "member_agreement", "disagreement")


def example_rows(predictions: dict, probabilities: bool = False) -> list[dict]:
    """One row per example of every split ({split: {"logits" [k, N, C], "labels" [N] | None}}):
    the ensemble's prediction (argmax p̄) and confidence (max p̄), whether it is right and its
    NLL −log p̄(y) (labelled splits), the predictive entropy H(p̄), the expected entropy
    mean_i H(p_i), JSD (their difference, the mutual information), the fraction of members
    whose own argmax is the ensemble's prediction, and the fraction of member pairs that
    disagree on it; with `probabilities`, p̄ per class (`p_0`, `p_1`, ...)."""
    from .stats.examples import Examples
    rows = []
    for split, found in predictions.items():
        labels = found.get("labels")
        examples = Examples(found["logits"], None if labels is None else labels.long())
        n = examples.size
        if n == 0:
            continue
        unlabelled = [None] * n
        columns = {"label": unlabelled if labels is None else labels.tolist(), "prediction": examples.predicted.tolist(),
                   "correct": unlabelled if labels is None else (examples.predicted == labels).tolist(),
                   "confidence": examples.confidence.tolist(), "nll": unlabelled if labels is None else examples.nll.tolist(),
                   "entropy": examples.entropy.tolist(), "expected_entropy": examples.expected_entropy.tolist(),
                   "jsd": examples.jsd.tolist(),
                   "member_agreement": (examples.member_predicted == examples.predicted).double().mean(0).tolist(),
                   "disagreement": examples.pair_disagreement.tolist()}
        probs = examples.mean if probabilities else None
        for index in range(n):
            row = {"split": split, "index": index, **{key: values[index] for key, values in columns.items()}}
            if probs is not None:
                row.update({f"p_{c}": value for c, value in enumerate(probs[index].tolist())})
            rows.append(row)
    return rows


# ---------------------------------------------------------------- writing

def to_csv(rows: list[dict], fields=None) -> str:
    """CSV text of the rows (a header, then one line per row); missing and NaN cells are empty,
    which pandas.read_csv reads as NaN."""
    fields = columns(rows, fields)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[csv_cell(field) for field in fields], lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({csv_cell(key): _csv_cell(row.get(key)) for key in fields})
    return buffer.getvalue()


def _csv_cell(value):
    """Empty for a missing number, every digit of a float, text through the CSV sink (text.csv_cell:
    a name from a file such as `=1+1` or `@SUM(…)` is never a formula in a spreadsheet)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return repr(value)  # every digit: a CSV round-trips the float exactly
    return csv_cell(value)


TABLE_FORMATS = Registry("table format")  # file extension -> write(rows, path, fields) -> path


@TABLE_FORMATS.register("csv")
def _write_csv(rows: list[dict], path: Path, fields) -> Path:
    return atomic_write_text(path, to_csv(rows, fields))


@TABLE_FORMATS.register("parquet")
def _write_parquet(rows: list[dict], path: Path, fields) -> Path:
    try:  # the parquet extra (pyarrow)
        from .integrations.parquet import write_parquet
    except ImportError:
        raise EnsdiagError(f"{path}: Parquet needs pyarrow (pip install 'ensdiag[parquet]'), or name a .csv file") from None
    return write_parquet(rows, path, columns(rows, fields))


def table_writer(path: Path, what: str = ""):
    """The writer of the table format `path`'s extension names (`TABLE_FORMATS`), or the one-line
    error naming them (`what`: the option it came from, for the CLI)."""
    write = TABLE_FORMATS.get(path.suffix.lower()[1:])
    if write is None or path.is_dir():
        kinds = " or ".join(f".{name}" for name in TABLE_FORMATS)
        raise EnsdiagError(f"{what}{path}{' is a folder;' if path.is_dir() else ':'} name a {kinds} file")
    return write


def write_table(rows: list[dict], path, fields=None) -> Path:
    """The rows as `path`, in the table format its extension names (CSV, Parquet), written atomically."""
    path = path_argument(path)
    return table_writer(path)(rows, path, fields)


def columns(rows: list[dict], fields=None) -> list[str]:
    """`fields`, then any other key of the first row (e.g. per-class probabilities)."""
    names = list(fields or (rows[0].keys() if rows else ()))
    return names + [key for key in (rows[0] if rows else {}) if key not in names]


def frame(rows: list[dict], fields=None):
    """The rows as a pandas DataFrame (the pandas extra: pip install 'ensdiag[pandas]')."""
    try:
        from .integrations.pandas import data_frame
    except ImportError:
        raise EnsdiagError("DataFrames need pandas (pip install 'ensdiag[pandas]'); the flat dict "
                           "(flat_metrics) and CSV (to_csv) work without it") from None
    return data_frame(rows, columns(rows, fields))
