"""Figures with matplotlib's object API on the Agg backend (no display, no global pyplot state).

- `heatmap_grid`: the paper's Figure 2 — rows of k×k matrices (disagreement per split,
  weight cosine) on one shared colour scale, e.g. Deep Ensemble above BatchEnsemble.
- `reliability_figure`, `smooth_reliability_figure` (SmoothECE's curve), `ood_histogram_figure`,
  `training_curves_figure`, `risk_coverage_figure` for reports.
"""

import hashlib
import io
import json
import math
import textwrap
from pathlib import Path

from typing import TYPE_CHECKING

from .. import __version__
from ..errors import EnsdiagError
from ..io import atomic_write_bytes, atomic_write_text, plain_file, read_json
from ..text import terminal

if TYPE_CHECKING:
    from matplotlib.figure import Figure


FIGURE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg")


def new_figure(figsize) -> "Figure":
    """A matplotlib Figure with constrained layout (matplotlib is imported here, when something is drawn:
    a report whose figures are all up to date never imports it)."""
    from matplotlib.figure import Figure
    return Figure(figsize=figsize, layout="constrained")


def panel_figure(columns: int, panel, left=0.6, right=0.15, top=0.35, bottom=0.5, gap=0.55, legend=0.0,
                 rows=1, row_gap=0.1, height_ratios=None):
    """A Figure and its [rows, columns] axes (numpy array), every size in inches: `panel` (width,
    height) is one axes' area, the margins hold its labels, `legend` is a column on the right for
    `side_legend`. A fixed layout draws in half the time constrained layout takes (it measures
    every tick label twice); the margins fit the labels these figures draw (tests/test_figure_layout.py)."""
    from matplotlib.figure import Figure
    width = left + columns * panel[0] + (columns - 1) * gap + right + legend
    height = top + rows * panel[1] + (rows - 1) * row_gap + bottom
    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(left=left / width, right=1 - (right + legend) / width, bottom=bottom / height,
                           top=1 - top / height, wspace=gap / panel[0], hspace=row_gap / panel[1])
    axes = figure.subplots(rows, columns, squeeze=False, sharex="col" if rows > 1 else False,
                           gridspec_kw={"height_ratios": height_ratios} if height_ratios else None)
    for ax in axes.flat:
        ax.tick_params(which="both", labelsize=8)  # minor ticks too: a log axis within a decade labels them
    return figure, axes


def side_legend(figure, handles_labels, top=0.35, fontsize=7) -> None:
    """The figure's legend in the column `panel_figure(legend=…)` kept right of the axes, level with their top."""
    right_edge = figure.subplotpars.right
    figure.legend(*handles_labels, loc="upper left", bbox_to_anchor=(right_edge + 0.08 / figure.get_figwidth(),
                                                                   1 - top / figure.get_figheight()), fontsize=fontsize)


def plain(text) -> str:
    """A name from a file as matplotlib should draw it: a '$' is a dollar sign, never mathtext, and
    control characters are drawn as their escapes (text.terminal)."""
    return terminal(text).replace("$", r"\$")


def figure_bytes(figure: "Figure", fmt: str = "png", dpi: int = 130) -> bytes:
    """The figure drawn in memory as `fmt` (every layout here fits its figure: no tight bbox pass)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=dpi)
    return buffer.getvalue()


def save_figure(figure: "Figure", path, formats=None) -> list[Path]:
    """Write the figure atomically: in the format its path names (`heat.pdf`, no suffix: PNG),
    or as each of `formats` (the path's suffix replaced)."""
    path = Path(path)
    if path.is_dir():
        raise EnsdiagError(f"cannot draw {path}: it is a directory; name an image file")
    if formats is None:
        fmt = path.suffix.lower().lstrip(".") or "png"
        if fmt not in FIGURE_FORMATS:
            raise EnsdiagError(f"cannot draw {path}: unknown image format .{fmt}; use "
                               + ", ".join(f".{f}" for f in FIGURE_FORMATS))
        formats, path = (fmt,), path if path.suffix else path.with_suffix(".png")
    return [atomic_write_bytes(path if len(formats) == 1 and path.suffix.lower() == f".{fmt}"
                               else path.with_suffix(f".{fmt}"), figure_bytes(figure, fmt)) for fmt in formats]


def fingerprint(value) -> str:
    """A digest of a figure's inputs (nested dicts, lists, numbers, strings, arrays): equal inputs, equal digest."""
    def array(x):  # NumPy arrays by their type, shape and bytes (anything else JSON does not take: by repr)
        return f"<{x.dtype}{x.shape}>{x.tobytes().hex()}" if hasattr(x, "tobytes") and hasattr(x, "dtype") else repr(x)
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=array).encode()).hexdigest()


class Drawn:
    """The record of which inputs each figure of a folder was drawn from (`drawn.json` beside them),
    so a report redraws only what changed. The record is read like any file of a run folder: a
    damaged or foreign one only means every figure is drawn again."""

    def __init__(self, folder: Path):
        self.path, self.version = Path(folder) / "drawn.json", __version__
        try:
            found = read_json(self.path, "figure record") if self.path.is_file() else {}
        except Exception:
            found = {}
        self.keys = found if isinstance(found, dict) and all(isinstance(v, str) for v in found.values()) else {}

    def _key(self, name, formats, inputs) -> str:
        return fingerprint([self.version, name, list(formats), list(inputs)])

    def stale(self, name: str, formats, inputs) -> bool:
        """Whether the figure is to be drawn: other inputs, or a file of it missing or not a file of its own
        (a link is replaced, never followed: report.html would embed what it leads to)."""
        files = [self.path.parent / f"{name}.{fmt}" for fmt in formats]
        return self.keys.get(name) != self._key(name, formats, inputs) or not all(plain_file(f) for f in files)

    def done(self, name: str, formats, inputs) -> None:
        self.keys[name] = self._key(name, formats, inputs)
        atomic_write_text(self.path, json.dumps(self.keys, indent=1, sort_keys=True) + "\n")


def plottable(matrix):
    """A stored k×k matrix for a heatmap: None when it was not stored (k > 256, empty split),
    undefined entries (null in metrics.json) as NaN, which the heatmap leaves blank."""
    if matrix is None:
        return None
    return [[float("nan") if value is None else value for value in row] for row in matrix]


SCALES = {  # quantity: (vmin, vmax, colour map, colour bar label); vmax None: the largest value drawn
    "disagreement": (0.0, 1.0, "viridis", "disagreement (high: members differ)"),
    "cosine": (-1.0, 1.0, "RdBu_r", "weight cosine (high: members alike)"),
    "kl": (0.0, None, "viridis", "KL(row ‖ column), nats"),
    "jsd": (0.0, math.log(2), "viridis", "JSD, nats (max log 2)"),
    "correlation": (-1.0, 1.0, "RdBu_r", "errors together (ρ, Q)"),
    "double_fault": (0.0, None, "viridis", "both wrong"),
}


def _largest(rows, quantity) -> float:
    """The largest finite entry of the panels of one quantity (1.0 when there is none above 0)."""
    values = [value for _, panels in rows for _, matrix, *kind in panels if kind and kind[0] == quantity
              for row in matrix for value in row if isinstance(value, (int, float)) and math.isfinite(value)]
    return max([v for v in values if v > 0], default=1.0)


# heatmap_grid's layout, in inches: matplotlib's constrained layout measures every tick label of
# every panel twice and was half of a report's drawing time; these panels' parts have known sizes
PANEL = 1.65  # a k×k image's side
TICKS, GAP = 0.3, 0.3  # room for a panel's row tick labels on its left; space after it
TITLE_LINE, BELOW = 0.17, 0.5  # one line of a panel title; column tick labels and "member" below
ROW_LABEL, BAR_SLOT = 0.3, 1.05  # a row's label on the left; one colour bar, its ticks and label
TITLE_CHARACTERS = 30  # a panel title wraps after this many characters (9 pt over a panel's width)
ROW_CHARACTERS = 26  # a row's label wraps after this many (9 pt along a panel's height)


def _cell_text(ax, k, matrix, low, high, colours) -> None:
    """Each entry of a small matrix written on its cell, in black or white, whichever reads on the colour."""
    for i in range(k):
        for j in range(k):
            value = matrix[i][j]
            middle = abs(value - (low + high) / 2) < 0.3 * (high - low) if colours == "RdBu_r" else \
                (value - low) < 0.6 * (high - low)
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color=("black" if middle else "white") if colours == "RdBu_r" else ("white" if middle else "black"))


def heatmap_grid(rows, vmin=0.0, vmax=1.0, cmap="viridis", colorbar_label="", title=None) -> "Figure":
    """rows: [(row label, [(panel title, k×k matrix[, quantity]), ...]), ...]. Panels of one quantity
    share one labelled colour scale (`SCALES`, or the arguments for panels without a quantity), its
    bar right of the last column that shows the quantity, as tall as the rows that do."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, MaxNLocator
    rows = [(textwrap.fill(terminal(label), ROW_CHARACTERS), panels) for label, panels in rows if panels]
    if not rows:
        raise ValueError("heatmap_grid: no panel to draw")
    ncols = max(len(panels) for _, panels in rows)
    quantity_of = [[panel[2] if len(panel) > 2 else None for panel in panels] for _, panels in rows]
    last_column = {}  # quantity -> the rightmost column that shows it (its bar goes after it)
    for kinds in quantity_of:
        for c, quantity in enumerate(kinds):
            last_column[quantity] = max(c, last_column.get(quantity, 0))
    titles = [[textwrap.fill(terminal(panel[0]), TITLE_CHARACTERS) for panel in panels] for _, panels in rows]
    lines = max(title.count("\n") + 1 for row in titles for title in row)
    row_height = TITLE_LINE * lines + 0.12 + PANEL + BELOW
    # a colour bar's label runs along a row: a figure of one row is drawn that tall at least
    row_height = max(row_height, 2.45 if len(rows) == 1 else 0)
    top = 0.45 if title else 0.05
    label_lines = max(label.count("\n") + 1 for label, _ in rows)
    lefts, bars, x = [], {}, ROW_LABEL + TITLE_LINE * (label_lines - 1)  # each column's image left edge; each bar's
    for c in range(ncols):
        lefts.append(x + TICKS)
        x += TICKS + PANEL + GAP
        for quantity in [q for q, last in last_column.items() if last == c]:
            bars[quantity] = x - GAP + 0.15
            x += BAR_SLOT
    width, height = x + 0.05, top + row_height * len(rows) + 0.05
    figure = Figure(figsize=(width, height))

    def box(left, bottom, w, h):  # inches from the top-left corner -> figure fractions
        return [left / width, 1 - (bottom + h) / height, w / width, h / height]

    images, spans = {}, {}  # quantity -> an image of it; the rows that show it
    for r, (label, panels) in enumerate(rows):
        image_top = top + r * row_height + TITLE_LINE * lines + 0.12
        for c, (name, matrix, *_) in enumerate(panels):
            quantity = quantity_of[r][c]
            low, high, colours, _ = SCALES.get(quantity, (vmin, vmax, cmap, colorbar_label))
            high = _largest(rows, quantity) if high is None else high
            ax = figure.add_axes(box(lefts[c], image_top, PANEL, PANEL))
            images[quantity] = ax.imshow(matrix, vmin=low, vmax=high, cmap=colours)
            spans.setdefault(quantity, set()).add(r)
            k = len(matrix)
            for axis in (ax.xaxis, ax.yaxis):  # every member named up to 12; beyond, a readable few
                axis.set_major_locator(MaxNLocator(nbins=8, integer=True) if k > 12 else FixedLocator(range(k)))
            ax.set_xlabel("member", fontsize=7)
            ax.set_title(titles[r][c], fontsize=9)  # split names may come from files
            if k <= 6:
                _cell_text(ax, k, matrix, low, high, colours)
            if c == 0:
                ax.set_ylabel(label, fontsize=9)
    for quantity, image in images.items():
        first, last = min(spans[quantity]), max(spans[quantity])  # the bar spans their images
        bar_top = top + first * row_height + TITLE_LINE * lines + 0.12
        span = (last - first) * row_height + PANEL
        bar = figure.colorbar(image, cax=figure.add_axes(box(bars[quantity], bar_top, 0.16, span), label="<colorbar>"))
        bar.set_label(SCALES.get(quantity, (None, None, None, colorbar_label))[3], fontsize=7)
    if title:
        figure.suptitle(terminal(title), fontsize=10, y=1 - 0.12 / height, va="top")
    return figure


def reliability_figure(curves) -> "Figure":
    """curves: [(method, bins dict with lower/upper/count/accuracy/confidence)] — one panel each, and
    below it the examples in each bin (log scale), so a bar of 3 examples does not look like one of 300."""
    figure, grid = panel_figure(len(curves), (2.2, 1.55), rows=2, row_gap=0.12, height_ratios=[3, 1], legend=1.05)
    axes, count_axes = grid[0], grid[1]
    for ax, counts, (name, bins) in zip(axes, count_axes, curves):
        centres = [(lo + hi) / 2 for lo, hi in zip(bins["lower"], bins["upper"])]
        width = bins["upper"][0] - bins["lower"][0]
        filled = [(x, a, c) for x, a, c, n in zip(centres, bins["accuracy"], bins["confidence"], bins["count"]) if n]
        ax.bar([x for x, _, _ in filled], [a for _, a, _ in filled], width=width, edgecolor="black", linewidth=0.4,
               label="accuracy")
        ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8)
        ax.plot([c for _, _, c in filled], [a for _, a, _ in filled], "o", markersize=2.5, color="tab:red",
                label="(conf, acc)")
        ax.set(xlim=(0, 1), ylim=(0, 1))
        ax.set_title(name, fontsize=9)
        counts.bar([x for x, _, _ in filled], [n for n in bins["count"] if n], width=width, color="tab:grey",
                   edgecolor="black", linewidth=0.4)
        counts.set_yscale("log")
        counts.set_ylim(bottom=0.7)  # a bin of one example still shows
        counts.set_xlabel("confidence max p̄", fontsize=8)
        counts.tick_params(labelsize=7)
    axes[0].set_ylabel("accuracy", fontsize=8)
    count_axes[0].set_ylabel("examples", fontsize=8)
    side_legend(figure, axes[0].get_legend_handles_labels())  # off the bars
    return figure


def ood_histogram_figure(panels, score_name="1 − MSP", value_range=(0, 1)) -> "Figure":
    """panels: [(method, id scores, ood scores)] — overlaid histograms per method; `value_range` None:
    each panel's own range (scores that are not bounded, such as the energy)."""
    figure, axes = panel_figure(len(panels), (2.2, 1.75), left=0.75, gap=0.7, legend=0.6)  # densities like 0.0005
    axes = axes[0]
    for ax, (name, id_scores, ood_scores) in zip(axes, panels):
        both = [float(v) for v in [*id_scores, *ood_scores] if math.isfinite(v)]
        span = value_range or ((min(both), max(both)) if both and min(both) < max(both) else None)
        ax.hist(id_scores, bins=30, range=span, alpha=0.6, density=True, label="ID", histtype="stepfilled")  # one patch, not 30
        ax.hist(ood_scores, bins=30, range=span, alpha=0.6, density=True, label="OOD", histtype="stepfilled")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(score_name, fontsize=8)
    axes[0].set_ylabel("density", fontsize=8)
    side_legend(figure, axes[0].get_legend_handles_labels())
    return figure


def training_curves_figure(curves) -> "Figure":
    """curves: {method: [history rows of one seed each]} — loss and validation accuracy per epoch."""
    # room for a log axis' minor labels (6×10⁻¹) where the loss stays within a decade
    figure, ((loss_ax, acc_ax),) = panel_figure(2, (2.9, 1.95), left=0.85, gap=0.75, bottom=0.5, top=0.3)
    no_validation = False
    for index, (name, histories) in enumerate(curves.items()):
        color = f"C{index}"
        for seed_index, rows in enumerate(histories):
            epochs = [row["epoch"] for row in rows]
            label = name if seed_index == 0 else None
            loss_ax.plot(epochs, [row["loss"] for row in rows], color=color, alpha=0.7, linewidth=1, label=label)
            validated = all(row.get("val_accuracy") is not None for row in rows)
            no_validation = no_validation or not validated
            key = "val_accuracy" if validated else "accuracy"
            acc_ax.plot(epochs, [row.get(key) if row.get(key) is not None else float("nan") for row in rows], color=color,
                        alpha=0.7, linewidth=1, linestyle="-" if validated else "--")
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("epoch", fontsize=8)
    loss_ax.set_ylabel("training loss (per member)", fontsize=8)
    acc_ax.set_xlabel("epoch", fontsize=8)
    acc_ax.set_ylabel("validation accuracy", fontsize=8)
    if no_validation:
        acc_ax.set_title("dashed: training accuracy (no validation split)", fontsize=7)
    loss_ax.legend(fontsize=7)
    return figure


def risk_coverage_figure(curves) -> "Figure":
    """curves: [(method, {"coverage", "risk", "member_risk"})] — every method on one axis (first seed), its
    members as thin lines of the same colour."""
    figure, ((ax,),) = panel_figure(1, (3.3, 2.5), top=0.1)
    for name, curve in curves:
        line, = ax.plot(curve["coverage"], curve["risk"], linewidth=1.4, label=name)
        for risk in curve.get("member_risk") or []:  # each member on its own: thin, in the method's colour
            ax.plot(curve["coverage"], risk, linewidth=0.5, alpha=0.35, color=line.get_color())
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("coverage (fraction accepted, most confident first)", fontsize=8)
    ax.set_ylabel("risk (error rate among the accepted)", fontsize=8)
    ax.legend(fontsize=7)
    return figure


def smooth_reliability_figure(curves) -> "Figure":
    """curves: [(method, {"confidence", "accuracy", "density"}, SmoothECE, bandwidth)] — one panel each: the
    kernel-smoothed accuracy against confidence (SmoothECE's curve), the density of confidences below it."""
    figure, axes = panel_figure(len(curves), (2.2, 2.0), top=0.5, legend=1.6)
    axes = axes[0]
    for ax, (name, curve, value, sigma) in zip(axes, curves):
        t, accuracy, density = curve["confidence"], curve["accuracy"], curve["density"]
        accuracy = [math.nan if a is None else a for a in accuracy]
        density = [0.0 if d is None else d for d in density]
        peak = max(density, default=0.0) or 1.0
        ax.fill_between(t, 0, [0.25 * d / peak for d in density], color="tab:grey", alpha=0.35, linewidth=0,
                        label="density of confidence")
        ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8)
        ax.plot(t, accuracy, color="tab:red", linewidth=1.4, label="smoothed accuracy")
        ax.set(xlim=(0, 1), ylim=(0, 1))
        measured = f"smECE {value:.3f}, σ* {sigma:.3f}" if isinstance(value, float) and isinstance(sigma, float) else ""
        ax.set_title(f"{plain(name)}\n{measured}".strip(), fontsize=9)
        ax.set_xlabel("confidence max p̄", fontsize=8)
    axes[0].set_ylabel("accuracy", fontsize=8)
    side_legend(figure, axes[0].get_legend_handles_labels(), top=0.5)
    return figure
