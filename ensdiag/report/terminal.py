"""Rich renderings for the terminal: heatmap tables and metric summaries (stderr/stdout chosen by the caller), and
the conformal analyzer's result: coverage and set size of LAC and APS sets at α = 0.1 on the held-out questions,
overall and per subtask, and what the split and the guarantee are (analysis/conformal.py computes them)."""

import math

from rich.table import Table
from rich.text import Text

from ..console import natural_width
from ..text import terminal
from .example_level import bounds_text
from .load import dig
from .render import non_finite_word


def _text(value) -> Text:
    """A cell or title as literal text: never markup, control characters escaped (text.terminal)."""
    return Text(terminal(value))


def titled(title, columns, left=(0,), **options) -> Table:
    """A Table with `columns`, those at the places in `left` left-aligned and the others right (`options`: rich's)."""
    table = Table(title=title, **options)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index in left else "right")
    return table


def _cell(value, low: float, high: float) -> Text:
    """The value on a background from dark (low) to bright (high) blue; N/A, nan or ±inf on grey."""
    if value is None or not math.isfinite(value := float(value)):
        return Text(f" {cell(value):^5} ", style="white on rgb(90,90,90)")
    t = 0.0 if high <= low else min(max((value - low) / (high - low), 0.0), 1.0)
    r, g, b = int(20 + 40 * t), int(30 + 120 * t), int(60 + 195 * t)
    return Text(f" {value:.3f} ", style=f"{'black' if t > 0.6 else 'white'} on rgb({r},{g},{b})")


def heatmap_table(matrix, title: str, low: float = 0.0, high: float = 1.0, missing: str = "matrix not stored") -> Table:
    """The k×k matrix as coloured cells; a matrix that is None (not stored, empty split) as one line saying so."""
    if matrix is None:
        table = Table(title=_text(title), show_header=False, box=None)
        table.add_column("")
        table.add_row(missing)
        return table
    table = Table(title=_text(title), show_header=True, header_style="bold", box=None, padding=(0, 0))
    table.add_column("")
    for j in range(len(matrix)):
        table.add_column(f"m{j}", justify="center")
    for i, row in enumerate(matrix):
        table.add_row(f"m{i} ", *[_cell(v, low, high) for v in row])
    return table


def cell(value, digits=3, interval=False):
    """A table cell: "N/A" for a missing value, "nan", "inf" or "-inf" for a non-finite number.

    A metric dict (value, definition, status) whose value is None shows its status word when
    that says why ("nan", "inf", "-inf", "empty", "omitted", …); "ok" and "n/a" show the value.
    `interval`: a metric's example-level interval after it, "0.031 [0.024, 0.039]"; "n" also
    its examples, "0.031 [0.024, 0.039] (n = 10,000)"."""
    if isinstance(value, dict):
        status = value.get("status")
        if value.get("value") is None and isinstance(status, str) and status not in ("ok", "n/a"):
            return status
        if interval and value.get("value") is not None:
            return cell(value["value"], digits) + interval_text(value.get("interval"), digits, interval == "n")
        value = value.get("value")
    if value is None:
        return "N/A"
    if isinstance(value, str):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return non_finite_word(number) or f"{number:.{digits}f}"


def interval_text(entry, digits=3, with_n=True) -> str:
    """" [0.024, 0.039] (n = 10,000)": an example-level interval entry (intervals.py) after its
    value; its examples "n = 1,000 of 10,000" where a budget measured a subsample, "n = 10,000 id
    + 10,000 ood" for a stratified resample; "" where there is none."""
    if not isinstance(entry, dict) or entry.get("low") is None or entry.get("high") is None:
        return ""
    text = bounds_text(entry, lambda value: cell(value, digits))
    if not with_n:
        return text
    strata = entry.get("strata")
    examples = (" + ".join(f"{count:,} {split}" for split, count in strata.items()) if isinstance(strata, dict)
                else f"{entry.get('n', 0):,}")
    full = entry.get("full_split")
    return text + f" (n = {examples}" + (f" of {full['of']:,}" if isinstance(full, dict) else "") + ")"


METRIC_COLUMNS = ("n", "Acc ↑", "NLL ↓", "ECE ↓", "Brier ↓", "H", "JSD", "disagreement")
METRIC_CELLS = (("calibration", "accuracy"), ("calibration", "nll"), ("calibration", "ece"), ("calibration", "brier"),
                ("uncertainty", "entropy"), ("uncertainty", "jsd"), ("disagreement", "mean"))  # (analyzer, key) after n


def _split_rows(metrics: dict) -> list[tuple[str, list[str]]]:
    """(split, its cells in METRIC_COLUMNS' order) of every split."""
    analyzers = metrics["analyzers"]
    return [(split, [f"{info['n']:,}", *(cell(dig(analyzers, (analyzer, "splits", split, key)), interval=True)
                                          for analyzer, key in METRIC_CELLS)])
            for split, info in metrics["splits"].items()]


def metrics_table(metrics: dict, title: str = "Metrics") -> Table:
    """One row per split: Acc, NLL, ECE, Brier, H, JSD, disagreement; and OOD rows."""
    table = titled(_text(title), ("split", *METRIC_COLUMNS))  # user-controlled strings (paths, split names) are never markup
    for split, cells in _split_rows(metrics):
        table.add_row(_text(split), *cells)
    return table


def metrics_tables(metrics: dict, title: str = "Metrics", width: int | None = None) -> list[Table]:
    """`metrics_table`, or where it is wider than `width` (a terminal's columns), the same cells
    transposed — one column per split, as many splits side by side as the width holds — so that
    no cell is cut or wrapped mid-interval."""
    table = metrics_table(metrics, title)
    if fits(table, width):
        return [table]
    return side_by_side(_split_rows(metrics), METRIC_COLUMNS, title, width)


def side_by_side(columns: list, labels, title: str, width: int) -> list[Table]:
    """Tables of `columns` ([(name, [a cell per label])]) beside a first column of `labels`, as many
    columns side by side as `width` holds (at least one; a column too wide alone folds, never cuts);
    the first table titled `title`, the others "(continued)"."""
    labels = list(labels)

    def transposed(part, heading):
        found = Table(title=_text(heading))
        found.add_column("")
        for name, _ in part:
            found.add_column(_text(name), justify="right", overflow="fold")
        for index, label in enumerate(labels):
            found.add_row(label, *[cells[index] for _, cells in part])
        return found

    tables, start = [], 0
    while start < len(columns):
        stop = start + 1
        while stop < len(columns) and natural_width(transposed(columns[start:stop + 1], title)) <= width:
            stop += 1
        tables.append(transposed(columns[start:stop], title if start == 0 else f"{title} (continued)"))
        start = stop
    return tables


def fits(table: Table, width: int | None) -> bool:
    """Whether the table, drawn as wide as it wants, fits `width` columns (None: any width)."""
    return width is None or natural_width(table) <= width


OOD_COLUMNS = {"auroc": "AUROC ↑", "aupr_out": "AUPR-Out ↑", "aupr_in": "AUPR-In ↑", "fpr95_ood_as_id": "FPR95 OOD→ID ↓",
               "fpr95_id_as_ood": "FPR95 ID→OOD ↓"}


def _ood_title(ood: dict) -> str:
    return f"OOD detection (ood vs id, {ood['n_ood']} vs {ood['n_id']}; OOD positive)"


def ood_table(metrics: dict) -> Table | None:
    ood = metrics["analyzers"].get("ood", {})
    if ood.get("status") != "ok":
        return None
    table = titled(_ood_title(ood), ("score", *OOD_COLUMNS.values()))
    for name, entry in ood["scores"].items():
        table.add_row(_text(entry["score"]), *[cell(entry.get(key), interval=True) for key in OOD_COLUMNS])
    return table


def ood_tables(metrics: dict, width: int | None = None) -> tuple[list[Table], list[str]]:
    """([`ood_table`], []), or where it is wider than `width`: the same cells transposed — one
    column per score under its short name (a note defines each), as many side by side as the width
    holds — so that no cell is cut or wrapped mid-interval."""
    table = ood_table(metrics)
    if table is None:
        return [], []
    if fits(table, width):
        return [table], []
    scores = metrics["analyzers"]["ood"]["scores"]
    columns = [(name, [cell(entry.get(key), interval=True) for key in OOD_COLUMNS]) for name, entry in scores.items()]
    return (side_by_side(columns, OOD_COLUMNS.values(), _ood_title(metrics["analyzers"]["ood"]), width),
            ["OOD scores: " + "; ".join(f"{name}: {entry['score']}" for name, entry in scores.items())])


def within(table: Table, width: int | None) -> Table:
    """The table held to `width` columns where it is wider (its headings wrap between words)."""
    if not fits(table, width):
        table.width = width
    return table


INTERVALS = ("[low, high]: a 95 % confidence interval for the value on the population the test examples were drawn "
             "from (a bootstrap over them; metrics.json's \"intervals\" says how), not a prediction of another test "
             "set's value; [0, …] on an unsigned calibration error: the signed error (over-confidence) decides whether "
             "the model may be calibrated; \"no interval: …\" says why a number has none")


def interval_lines(metrics: dict) -> list[str]:
    """What the intervals are, and any analyzer left without them (and why)."""
    record = metrics.get("intervals")
    if not isinstance(record, dict):
        return []
    return [INTERVALS] + [f"{name}: {note}" for name, note in record.get("skipped", {}).items()]


def skipped_lines(metrics: dict) -> list[str]:
    """One line per analyzer that did not run: skipped (inputs missing) or failed (a broken plug-in)."""
    return [f"{name}: {result['status']} — {result['reason']}" for name, result in metrics["analyzers"].items()
            if result.get("status") in ("skipped", "failed")]


def _table(title, columns, rows) -> list:
    """[the title as a line (long titles wrap as text, not to the table's width), the table]."""
    table = titled(None, [_text(column) for column in columns], header_style="bold", box=None, padding=(0, 1))
    for row in rows:
        table.add_row(*[_text(cell) for cell in row])
    return [title, table]


def geometry_tables(results: dict) -> list:
    """Member geometry (analyzers cka, alignment, paths, rank-structure) as lines (str) and tables;
    a skipped analyzer as one line saying why."""
    shown = []
    for name in ("cka", "alignment", "paths", "rank-structure"):
        result = results.get(name)
        if result is None:
            continue
        if result.get("status") != "ok":
            shown.append(f"{name}: {result.get('reason', result.get('status'))}")
            continue
        if name == "cka":
            splits = result["splits"]
            layers = list(next(iter(splits.values()))["layers"])
            columns = ["layer"] + [f"{kind} ({split}, n={found['n']})" for split, found in splits.items()
                                   for kind in ("linear", "debiased")]
            rows = [[layer] + [cell(found["layers"].get(layer, {}).get(key)) for found in splits.values()
                               for key in ("mean_linear", "mean_debiased")] for layer in layers]
            means = "; ".join(f"{split} {cell(found['mean'], interval='n')}" for split, found in splits.items())
            shown += _table(f"CKA between members per layer (mean off-diagonal); mean over layers: {means}", columns, rows)
            shown += [f"cka: layer {layer} skipped on {split} ({why})" for split, found in splits.items()
                      for layer, why in found["skipped_layers"].items()]
        elif name == "alignment":
            null = result.get("null", {})
            rows = [[layer, cell(entry["raw"]), cell(entry["aligned"]), cell(entry.get("null_aligned"))]
                    for layer, entry in result["layers"].items()]
            shown += _table(f"weight cosine per layer: as trained {cell(result['raw']['mean'])}, aligned "
                                f"{cell(result['aligned']['mean'])}, aligned null baseline "
                                f"{cell(null.get('aligned'))} ({result['groups']} permutation groups; aligned "
                                f"outputs moved by at most {cell(result['max_output_change'], 7)})",
                                ["layer", "as trained", "aligned", "aligned, null"], rows)
            shown.append("aligned, null: the same alignment applied to independently initialised, untrained members "
                         "of this architecture; an aligned cosine means shared structure only above it")
        elif name == "paths":
            pairs = result["pairs"]
            columns = ["t"] + [f"{kind} 0→{pair['members'][1]}" for pair in pairs for kind in ("loss", "acc")]
            rows = [[f"{t:.1f}"] + [cell(pair[key][i]) for pair in pairs for key in ("loss", "accuracy")]
                    for i, t in enumerate(pairs[0]["t"])]
            restarts = result.get("restarts", {})
            searched = (f"; each the least over {'/'.join(map(str, restarts['per_pair']))} restarts of weight matching "
                        f"per pair, the worst restart's test-loss barrier {cell(result.get('loss_barrier_max'))}"
                        if restarts.get("limit", 1) > 1 else "")
            shown += _table(f"paths between members (test, n={result['n']}; ends {result['ends']}; "
                                f"{result['batchnorm']}): test-loss barrier {cell(result['loss_barrier'], interval='n')}, "
                                f"error barrier {cell(result['accuracy_barrier'], interval='n')}, train-loss barrier "
                                f"{cell(result.get('train_loss_barrier', {'value': None}), interval='n')}{searched}",
                            columns, rows)
            if restarts.get("rule") and restarts.get("limit", 1) > 1:
                shown.append(f"restarts: {restarts['rule']}")
        else:
            rows = [[layer, f"{entry['rank']} of {entry['max_rank']}" if entry["rank"] is not None else entry.get("note", "N/A"),
                     f"{entry['singular_values'][1]:.1e}" if len(entry["singular_values"]) > 1 else "N/A",
                     entry.get("kernel_rank", ""), f"{entry['entries_used']:.0%}"] for layer, entry in result["layers"].items()]
            shown += _table(f"rank of W_i ⊘ W_0 per layer: {result['summary']}",
                                ["layer", "rank", "σ2/σ1", "rank per kernel", "entries used"], rows)
    return shown


CONFORMAL_COLUMNS = ("LAC coverage", "LAC set size ↓", "APS coverage", "APS set size ↓")


def _conformal_title(result: dict) -> Text:
    alpha, split = result["alpha"], result["split"]
    return Text(f"Conformal prediction sets from p̄ (α = {alpha}: coverage ≥ {1 - alpha:g} guaranteed marginally; "
                f"calibrated on {split['n_calibration']:,} questions, measured on {split['n_test']:,})")


def _conformal_cells(result: dict, subtask=None, interval=False) -> list[str]:
    lac, aps = result["scores"]["lac"], result["scores"]["aps"]
    if subtask is not None:
        lac, aps = lac["per_subtask"][subtask], aps["per_subtask"][subtask]
    return [cell(found[key], interval=interval) for found in (lac, aps) for key in ("coverage", "set_size")]


def conformal_table(result: dict) -> Table:
    table = titled(_conformal_title(result), ("questions", "n", *CONFORMAL_COLUMNS))
    lac = result["scores"]["lac"]
    table.add_row("all test questions", f"{lac['n']:,}", *_conformal_cells(result, interval=True))
    for name, entry in lac.get("per_subtask", {}).items():
        table.add_row(Text(f"  {name}"), f"{entry['n']:,}", *_conformal_cells(result, name))
    return table


def conformal_tables(result: dict, width: int | None = None) -> list[Table]:
    """[`conformal_table`], or where it is wider than `width`: every test question's numbers with
    their intervals one per row, then each subtask's (no intervals) held to the width."""
    table = conformal_table(result)
    if fits(table, width):
        return [table]
    lac = result["scores"]["lac"]
    overall = Table(title=_conformal_title(result))
    overall.add_column("")
    overall.add_column(f"all test questions (n = {lac['n']:,})", justify="right", overflow="fold")
    for label, value in zip(CONFORMAL_COLUMNS, _conformal_cells(result, interval=True)):
        overall.add_row(label, value)
    tables = [within(overall, width)]
    if lac.get("per_subtask"):
        subtasks = Table(title="Conformal prediction sets per subtask")
        subtasks.add_column("subtask", overflow="fold")  # a long name folds, never loses a character
        for label in ("n", *CONFORMAL_COLUMNS):
            subtasks.add_column(label, justify="right")
        for name, entry in lac["per_subtask"].items():
            subtasks.add_row(Text(name), f"{entry['n']:,}", *_conformal_cells(result, name))
        tables.append(within(subtasks, width))
    return tables


def conformal_notes(result: dict) -> list[str]:
    split = result["split"]
    return [f"conformal: calibration {split['calibration']}, test {split['test']}; {result['guarantee']}"]
