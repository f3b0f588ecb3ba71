"""Render a report dict (aggregate.build_report) as Markdown, LaTeX, HTML, a rich table or JSON.

Best per column in bold and second best underlined (Markdown: **x** / <ins>x</ins>; LaTeX:
\\textbf / \\underline; HTML: <b> / <u>; terminal: green / yellow), arrows ↑/↓ in headers.
Every string of the report passes its format's sink in text.py on the way out (names, titles
and reasons may come from files: a split or subtask named `<img src=x onerror=…>` is text in
every format); JSON escapes control characters and every non-ASCII character itself.
"""

import base64
import io
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import text as sink
from ..console import natural_width, show, wrapped
from ..export import REPORT_FIELDS, report_rows, to_csv
from ..io import open_regular
from ..layout import finite, non_finite
from ..registry import Registry
from .example_level import bounds_text, example_text
from .verdict_text import to_summary

ARROWS = {"up": " ↑", "down": " ↓", None: ""}
ON_REQUEST = "Detail figures, drawn by `ensdiag report --detail`:"  # (the figures a report left out)
FORMATS = Registry("--format")  # name -> (file extension, renderer(report, run_dir) -> text): `report --format NAME`


def report_format(name: str, extension: str):
    """Register a renderer `(report, run_dir) -> text` as `ensdiag report --format NAME`, written to
    `report.EXTENSION` by `--out FOLDER` (the command checks the name against ensdiag/names.py, made
    from this registry, before anything heavy is imported)."""
    return lambda function: FORMATS.add(name, (extension, function))[1]


def render(report: dict, fmt: str, run_dir=None) -> str:
    """The report in a registered format (`FORMATS`)."""
    return FORMATS[fmt][1](report, run_dir or report["run"])


def non_finite_word(value):
    """"nan", "inf" or "-inf" for such a number, else None."""
    return next(iter(non_finite(value)[1]), None) if isinstance(value, (int, float)) else None


def format_number(value, table_id, column_index):
    """'0.964' (cost: '1,234' / '12.3'); N/A for a missing value; nan, inf or -inf for a non-finite one."""
    if value is None:
        return "N/A"
    if isinstance(value, str):
        return value
    if word := non_finite_word(value):
        return word
    if isinstance(value, int) and not isinstance(value, bool):  # counts: members, seeds
        return f"{value:,}"
    if table_id == "effective-size":  # members
        return f"{value:.2f}"
    if table_id.startswith("lora"):  # overlaps, nulls and 1 − cosine of effective weights span decades
        return f"{value:.4g}"
    if table_id == "cost":
        return f"{value:,.0f}" if column_index == 0 else f"{value:.1f}"
    return f"{value:.3f}"


def cell_text(cell, table_id, column_index, compact=False):
    """'0.964 ± 0.012', with '(n=2/3)' when seeds are missing; N/A when nothing was measured.
    `compact` (the terminal's 80 columns): the test set's own interval only where no seed-level one
    is given (one seed), without its example count (the table's footnote gives the rest)."""
    if cell.get("mean") is None:
        return "N/A"
    text = format_number(cell["mean"], table_id, column_index)
    if non_finite_word(cell["mean"]):  # no interval around nan/inf
        return text
    if cell.get("ci") is not None and not (table_id == "cost" and column_index == 0):  # counts need no interval
        text += f" ± {format_number(cell['ci'], table_id, column_index)}"
    elif isinstance(cell.get("interval"), (list, tuple)) and len(cell["interval"]) == 2:  # an interval of its own (the verdict's)
        text += " [" + ", ".join(format_number(bound, table_id, column_index) for bound in cell["interval"]) + "]"
    example = cell.get("example")
    if example and compact and "low" in example and cell.get("ci") is None:  # one seed: its interval is the only one
        text += bounds_text(example, lambda value: format_number(value, table_id, column_index))
    elif example and not compact:  # the test set's own sampling error, beside the seeds' (report/example_level.py)
        text += example_text(example, lambda value: format_number(value, table_id, column_index))
    if cell.get("expected") and cell.get("n") is not None and cell["n"] < cell["expected"]:
        text += f" (n={cell['n']}/{cell['expected']})"
    return text


def _header(table):
    return ["Method"] + [column["name"] + ARROWS[column["direction"]] for column in table["columns"]]


def _marked(escape, best: str, second: str):
    """decorate(text, mark): a cell's text escaped for its format, put into `best` or `second` ("{}": the text)."""
    return lambda text, mark: {"best": best, "second": second}.get(mark, "{}").format(escape(text))


def _cells(table, decorate, compact=False):
    for row in table["rows"]:
        yield row, [decorate(cell_text(cell, table["id"], index, compact), cell.get("mark"))
                    for index, cell in enumerate(row["cells"])]


def test_set_footnote(table) -> str:
    """What compact cells leave out: the test set's own half-width per column (the largest over the
    methods, each the mean over seeds of the seeds' half-widths), for the terminal."""
    widest = {}
    for row in table["rows"]:
        for index, cell in enumerate(row["cells"]):
            half = (cell.get("example") or {}).get("half_width")
            if half is not None and cell.get("ci") is not None and math.isfinite(half):
                widest[index] = max(widest.get(index, 0.0), half)
    if not widest:
        return ""
    columns = " · ".join(f"{table['columns'][index]['name']} {format_number(half, table['id'], index)}"
                         for index, half in sorted(widest.items()))
    return (f"± over seeds. The test set's own ± (largest over methods): {columns}; every cell with it in report.md "
            "(--format markdown).")


@report_format("markdown", "md")
def to_markdown(report, run_dir=None) -> str:
    md, decorate = sink.markdown, _marked(sink.markdown, "**{}**", "<ins>{}</ins>")
    lines = [f"# ensdiag report — {md(report['preset'])} preset", "",
             f"Run `{md(report['run'])}`; methods {md(', '.join(report['methods']))}; "
             f"seeds {md(', '.join(map(str, report['seeds'])))}.",
             f"Cells: {md(report['aggregation'])}" + (f"; {md(report['examples'])}" if report.get("examples") else "")
             + f". **Best** and <ins>second best</ins>: {md(report.get('marks', 'per ↑/↓ column'))}.", ""]
    lines += [f"- `{md(split)}`: {md(title)}" for split, title in report["splits"].items()]
    lines += [f"- `{md(split)}`: **skipped** — {md(reason)}" for split, reason in report["skipped_splits"].items()]
    lines += [f"- {md(note)}" for note in report.get("notes", [])]
    lines += [f"- {md(method)}: no metrics yet for seed(s) {md(', '.join(map(str, seeds)))} (n per cell shows it)"
              for method, seeds in report["missing_seeds"].items()]
    for table in report["tables"]:
        lines += ["", f"## {md(table['title'])}", ""]
        if table.get("note"):
            lines += [md(table["note"], keep="\n"), ""]
        header = [md(name) for name in _header(table)]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
        for row, texts in _cells(table, decorate):
            label = f"*{md(row['label'])}*" if row.get("reference") else md(row["label"])
            lines.append("| " + " | ".join([label] + texts) + " |")
    if report["figures"]:
        lines += ["", "## Figures", ""]
        for figure in report["figures"]:
            lines += [f"### {md(figure['title'])}", "", f"![{md(figure['title'])}]({md(figure['png'])})", ""]
    if report.get("figures_on_request"):
        lines += ["", f"{ON_REQUEST} " + "; ".join(md(title) for title in report["figures_on_request"]) + ".", ""]
    for run, notes in report.get("budgets", {}).items():  # what a budget chose, and what it skipped
        lines += ["", f"## Budget of {md(run)}", "", *[f"- {md(note)}" for note in notes]]
    lines += ["", "Definitions: " + "; ".join(f"{md(k)}: {md(v)}" for k, v in report["definitions"].items()) + "."]
    return "\n".join(lines).rstrip() + "\n"


@report_format("latex", "tex")
def to_latex(report, run_dir=None) -> str:
    tex, decorate = sink.latex, _marked(sink.latex, r"\textbf{{{}}}", r"\underline{{{}}}")
    parts = [f"% ensdiag report: {tex(report['preset'])} preset, seeds {tex(report['seeds'])}; needs "
             "\\usepackage{booktabs}",
             f"% cells: {tex(report['aggregation'])}",
             f"% bold and underlined: {tex(report.get('marks', 'best and second best per column'))}"]
    for table in report["tables"]:
        header = [tex(h) for h in _header(table)]
        parts += [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{tex(table['title'])}}}",
                  rf"\begin{{tabular}}{{l{'c' * (len(header) - 1)}}}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
        for row, texts in _cells(table, decorate):
            parts.append(" & ".join([tex(row["label"])] + texts) + r" \\")
        parts += [r"\bottomrule", r"\end{tabular}"]
        if table.get("note"):  # the table's note (the verdict's sentences, definitions of a column) below it
            parts += [r"\par\smallskip", r"\parbox{\linewidth}{\footnotesize " + tex(table["note"]) + "}"]
        parts += [r"\end{table}", ""]
    return "\n".join(parts)


@report_format("html", "html")
def to_html(report, run_dir=None) -> str:
    """One self-contained page: styles inline, figures embedded as data URIs. Tables fit the page:
    headers wrap (after '_' and '/' too) and a cell wraps before its '± interval', never inside a
    number; a table that still cannot fit scrolls sideways inside its own box."""
    esc = sink.html
    decorate = _marked(lambda text: esc(text).replace(" ± ", " ±\u00a0").replace(" (n=", "\u00a0(n="),
                       "<b>{}</b>", "<u>{}</u>")
    body = [f"<h1>ensdiag report — {esc(report['preset'])} preset</h1>",
            f"<p>Run <code>{esc(report['run'])}</code>; methods {esc(', '.join(report['methods']))}; "
            f"seeds {esc(', '.join(map(str, report['seeds'])))}.<br>Cells: {esc(report['aggregation'])}. "
            f"<b>Best</b> and <u>second best</u>: {esc(report.get('marks', 'per ↑/↓ column'))}.</p><ul>"]
    body += [f"<li><code>{esc(s)}</code>: {esc(t)}</li>" for s, t in report["splits"].items()]
    body += [f"<li><code>{esc(s)}</code>: <b>skipped</b> — {esc(r)}</li>" for s, r in report["skipped_splits"].items()]
    body += [f"<li>{esc(note)}</li>" for note in report.get("notes", [])]
    body.append("</ul>")
    for table in report["tables"]:
        body.append(f"<h2>{esc(table['title'])}</h2>")
        if table.get("note"):
            body += [f"<p>{esc(part)}</p>" for part in table["note"].split("\n\n")]
        wrappable = (esc(h).replace("_", "_<wbr>").replace("/", "/<wbr>") for h in _header(table))  # after '_', '/' too
        body.append("<div class=\"scroll\"><table><thead><tr>" + "".join(f"<th>{h}</th>" for h in wrappable)
                    + "</tr></thead><tbody>")
        for row, texts in _cells(table, decorate):
            label = f"<i>{esc(row['label'])}</i>" if row.get("reference") else esc(row["label"])
            body.append("<tr><td>" + label + "</td>" + "".join(f"<td>{t}</td>" for t in texts) + "</tr>")
        body.append("</tbody></table></div>")
    for run, notes in report.get("budgets", {}).items():
        body.append(f"<h2>Budget of {esc(run)}</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    if report["figures"]:
        body.append("<h2>Figures</h2>")
        for figure in report["figures"]:
            with open_regular(Path(run_dir) / figure["png"], "figure", follow=False) as handle:  # never a link's target
                data = base64.b64encode(handle.read()).decode("ascii")
            body.append(f"<figure><img alt=\"{esc(figure['title'])}\" src=\"data:image/png;base64,{data}\">"
                        f"<figcaption>{esc(figure['title'])}</figcaption></figure>")
    if report.get("figures_on_request"):
        text = esc(ON_REQUEST).replace("`ensdiag report --detail`", "<code>ensdiag report --detail</code>")
        body.append(f"<p>{text} " + "; ".join(esc(title) for title in report["figures_on_request"]) + ".</p>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             ".scroll{overflow-x:auto;margin:0.5em 0 1.5em}table{border-collapse:collapse;font-size:0.9em}"
             "th,td{padding:4px 6px;border-bottom:1px solid #ddd;text-align:right;vertical-align:top}"
             "th{font-weight:600}td:first-child{white-space:nowrap}"
             "th:first-child,td:first-child{text-align:left}thead th{border-bottom:2px solid #444;vertical-align:bottom}"
             "img{max-width:100%}figure{margin:1em 0}code{background:#f4f4f4;padding:0 3px}")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>ensdiag report</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


@report_format("summary", "txt")
def summary_format(report, run_dir=None) -> str:
    """The first screen (verdict_text.to_summary): one line per method led by its effective size, what the seeds
    settle, where the report is; at most 80 columns and 24 rows for the main job's grid."""
    return to_summary(report, report.get("written"))


@report_format("json", "json")
def to_json(report, run_dir=None) -> str:
    return json.dumps(finite(report), indent=2, allow_nan=False) + "\n"  # NaN/±inf as null


@report_format("csv", "csv")
def to_csv_rows(report, run_dir=None) -> str:
    """Every number as long, tidy rows (export.py): one per table, method, column and seed."""
    return to_csv(report_rows(report), REPORT_FIELDS)


@report_format("table", "txt")
def to_table_text(report, run_dir=None, width: int = 160) -> str:
    """The terminal's tables as plain text (what `--format table --out` writes)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width)
    for table in to_rich(report, width=width):
        show(console, table)
    return buffer.getvalue()


def to_rich(report, only=None, width=None):
    """rich Tables for the terminal (all, or the ids in `only`).

    With a `width`, a table too wide for it is shown transposed (methods as columns) when
    that fits better, so that a per-corruption table stays readable in 80 columns."""
    def decorate(text, mark):  # a cell is text, never markup
        return Text(sink.terminal(text), style="bold green" if mark == "best" else "yellow" if mark == "second" else "")

    def build(table, transposed, methods=None, label_most=None):
        header = [sink.terminal(name) for name in _header(table)]
        rows = [(sink.terminal(row["label"]), texts) for row, texts in _cells(table, decorate, compact=width is not None)]
        if transposed:
            rows = rows if methods is None else rows[methods]
            header, rows = ["", *(label for label, _ in rows)], [
                (name, [texts[index] for _, texts in rows]) for index, name in enumerate(header[1:])]
        rich_table = Table(title=Text(sink.terminal(table["title"])), pad_edge=not transposed)
        # method names stay whole ("BatchEnsemble", not "BatchEnse…"), other text wraps or folds
        label_width = None if transposed or not rows else min(max(len(label) for label, _ in rows), 24)
        for index, name in enumerate(header):
            longest_word = max((len(word) for word in name.split()), default=0)
            rich_table.add_column(Text(name), justify="left" if index == 0 else "right", overflow="fold",
                                  min_width=label_width if index == 0 else longest_word,
                                  max_width=label_most if index == 0 else None)
        for label, texts in rows:
            rich_table.add_row(Text(label), *texts)
        return rich_table

    def narrower(table, methods=None):
        """Transposed, its row labels (column names) wrapped between words where that alone makes it
        fit (never inside a word: "gaussian_noise ↑" may lose its arrow to the next line, not its name)."""
        transposed = build(table, True, methods)
        names = [column["name"] + " ↑" for column in table["columns"]]  # (the arrow: 2 characters at most)
        labels = max((len(name) for name in names), default=0)
        longest_word = max((len(word) for name in names for word in name.split()), default=0)
        excess = natural_width(transposed) - width
        if 0 < excess and labels - excess >= max(10, longest_word):
            return build(table, True, methods, labels - excess)
        return transposed

    def fitted(table) -> list:
        """The table as it fits `width`: as it is, transposed, or transposed in groups of methods."""
        rich_table = build(table, transposed=False)
        if width is None or (wide := natural_width(rich_table)) <= width:
            return [rich_table]
        transposed = narrower(table)
        if natural_width(transposed) <= width or len(table["rows"]) < 2:
            return [transposed if natural_width(transposed) < wide else rich_table]
        parts, start = [], 0
        while start < len(table["rows"]):  # as many methods side by side as the width holds
            stop = start + 1
            while stop < len(table["rows"]) and natural_width(narrower(table, slice(start, stop + 1))) <= width:
                stop += 1
            parts.append(narrower(table, slice(start, stop)))
            start = stop
        return parts

    tables = []
    for table in report["tables"]:
        if only is not None and table["id"] not in only:
            continue
        tables += fitted(table)
        note = "\n\n".join(part for part in (table.get("note"), test_set_footnote(table) if width else "") if part)
        if note:  # below the table, left-aligned, wrapped here so that no number is split
            tables.append(Text(wrapped(sink.terminal(note, keep="\n"), max(40, (width or 100) - 1)), no_wrap=True,
                               overflow="ignore"))
    return tables
