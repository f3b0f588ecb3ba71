"""The report's figures place their panels themselves (no layout engine, which took half the drawing
time): whatever the inputs, every label and legend is drawn inside the figure, and no panel, colour
bar, legend or label overlaps another's."""

import itertools
import math

import pytest

from ensdiag.report import figures
from ensdiag.report.figures import heatmap_grid


def _matrix(k, value=0.3):
    return [[1.0 if i == j else value for j in range(k)] for i in range(k)]


LAYOUTS = {
    "one row, two scales": [("Deep Ensemble (seed 42)", [("disagreement: id", _matrix(4), "disagreement"),
                                                         ("weight cosine (own layers) (init 0.71)", _matrix(4), "cosine")])],
    "rows of unequal length": [("MC Dropout (seed 1)", [("disagreement: id", _matrix(3), "disagreement"),
                                                        ("disagreement: ood", _matrix(3), "disagreement")]),
                               ("BatchEnsemble (seed 1)", [("disagreement: id", _matrix(3), "disagreement"),
                                                           ("disagreement: ood", _matrix(3), "disagreement"),
                                                           ("weight cosine", _matrix(3), "cosine")])],
    "a scale in non-adjacent columns": [("pairs", [("KL", _matrix(5, 0.1), "kl"), ("JSD", _matrix(5, 0.1), "jsd"),
                                                   ("KL again", _matrix(5, 0.2), "kl")])],
    "long titles, no quantity, many members": [("members", [("a split name that a user chose, long enough to wrap "
                                                              "twice over", _matrix(9)), ("b", _matrix(2))])],
    "long row labels, an empty row, 64 members": [
        ("a method name a user chose, long enough to wrap (seed 12345)", [("disagreement: id", _matrix(64), "disagreement")]),
        ("nothing stored (k > 256)", []),
        ("another method with a long name of its own (seed 7)", [("disagreement: id", _matrix(64), "disagreement")])],
}


def _tick_labels(axis):
    """The tick labels matplotlib draws: those of ticks within the axis' view (a locator places more)."""
    low, high = sorted(axis.get_view_interval())
    span = high - low
    return [label for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]
            if low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span for label in (tick.label1, tick.label2)]


def _boxes(figure):
    """(what, its axes, display box) of every visible text and every axes' own area, after drawing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    found = [(f"axes {i}", ax, ax.get_window_extent(renderer)) for i, ax in enumerate(figure.axes)]
    for ax in figure.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *_tick_labels(ax.xaxis), *_tick_labels(ax.yaxis)]
        found += [(repr(t.get_text()), ax, t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]
    found += [(repr(t.get_text()), None, t.get_window_extent(renderer)) for t in figure.texts if t.get_text()]
    found += [(f"legend {i}", None, legend.get_window_extent(renderer)) for i, legend in enumerate(figure.legends)]
    return found, figure.bbox


def _bins(shift):
    lower = [i / 10 for i in range(10)]
    return {"lower": lower, "upper": [x + 0.1 for x in lower], "count": [0, 0, 1, 3, 8, 20, 40, 90, 300, 900],
            "accuracy": [0, 0, 0.0, 0.33, 0.5, 0.55, 0.6, 0.7, 0.85, 0.97], "confidence": [0, 0, *(x + 0.05 + shift for x in lower[2:])]}


def _history(epochs, validated=True):
    return [{"epoch": e, "loss": 2.0 / e, "accuracy": 1 - 1 / (e + 1), **({"val_accuracy": 1 - 1.2 / (e + 1)} if validated else {})}
            for e in range(1, epochs + 1)]


_GRID = [i / 50 for i in range(51)]
PANEL_FIGURES = {
    "reliability": lambda: figures.reliability_figure([(name, _bins(0.01 * i)) for i, name in
                                                       enumerate(["single", "deep-ensemble", "batch-ensemble-kernel"])]),
    "ood histograms": lambda: figures.ood_histogram_figure([("mc-dropout", [0.1, 0.2, 0.3], [0.5, 0.7, 0.9]),
                                                            ("batch-ensemble", [0.0, 0.05], [0.4, 0.6])]),
    "ood histograms, unbounded score": lambda: figures.ood_histogram_figure(
        [("deep-ensemble", [-12.0, -9.5, -8.0], [-3.0, -1.5])], "energy −T·logsumexp(z/T)", None),
    "training": lambda: figures.training_curves_figure({"single": [_history(30), _history(12)],
                                                        "batch-ensemble": [_history(25, validated=False)]}),
    "training, loss within a decade": lambda: figures.training_curves_figure(  # a log axis then labels minor ticks
        {"single": [[{"epoch": e, "loss": 0.9 - 0.05 * e, "val_accuracy": 0.5} for e in range(1, 15)]]}),
    "ood histograms, scores spread over thousands": lambda: figures.ood_histogram_figure(
        [("deep-ensemble", [-3000.0, -2500.0, -100.0], [-50.0, 10.0])], "energy", None),
    "smooth reliability": lambda: figures.smooth_reliability_figure(
        [(name, {"confidence": _GRID, "accuracy": [t ** 1.3 for t in _GRID], "density": [math.exp(-(t - 0.9) ** 2 * 40) for t in _GRID]},
          0.0312, 0.0312) for name in ("single", "deep-ensemble")]),
    "risk coverage": lambda: figures.risk_coverage_figure(
        [(name, {"coverage": _GRID[1:], "risk": [0.2 * t * t for t in _GRID[1:]], "member_risk": [[0.25 * t for t in _GRID[1:]]]})
         for name in ("single", "deep-ensemble")]),
}


def _drawn(case):
    kind, name, title = case
    return heatmap_grid(LAYOUTS[name], title=title) if kind == "heatmaps" else PANEL_FIGURES[name]()


CASES = [("heatmaps", name, title) for name in LAYOUTS for title in (None, "inspect: a model, k=4")] + \
        [("panels", name, None) for name in PANEL_FIGURES]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[1]}{', titled' if case[2] else ''}")
def test_every_label_is_inside_the_figure_and_nothing_overlaps(case):
    boxes, page = _boxes(_drawn(case))
    for what, _, box in boxes:
        assert page.x0 - 0.5 <= box.x0 and box.x1 <= page.x1 + 0.5 and page.y0 - 0.5 <= box.y0 and box.y1 <= page.y1 + 0.5, \
            f"{what} is drawn outside the figure"
    for (a, ax_a, box_a), (b, ax_b, box_b) in itertools.combinations(boxes, 2):
        if ax_a is ax_b:
            continue  # a panel's own labels sit around its area, placed by matplotlib
        overlap_x = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        overlap_y = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        assert overlap_x <= 1 or overlap_y <= 1, f"{a} overlaps {b}"


def test_rows_without_panels_are_left_out_and_none_at_all_is_refused():
    figure = heatmap_grid(LAYOUTS["long row labels, an empty row, 64 members"])
    assert len([ax for ax in figure.axes if ax.get_label() != "<colorbar>"]) == 2
    with pytest.raises(ValueError, match="no panel"):
        heatmap_grid([("nothing", [])])


def test_each_scale_has_one_labelled_bar_as_tall_as_the_rows_that_show_it():
    figure = heatmap_grid(LAYOUTS["rows of unequal length"])
    bars = {ax.get_ylabel(): ax for ax in figure.axes if ax.get_label() == "<colorbar>"}
    assert sorted(bars) == ["disagreement (high: members differ)", "weight cosine (high: members alike)"]
    panels = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    tops = sorted({round(ax.get_position().y1, 6) for ax in panels}, reverse=True)
    bottoms = sorted({round(ax.get_position().y0, 6) for ax in panels}, reverse=True)
    disagreement, cosine = bars["disagreement (high: members differ)"], bars["weight cosine (high: members alike)"]
    assert disagreement.get_position().y1 == pytest.approx(tops[0], abs=1e-4) and disagreement.get_position().y0 == pytest.approx(bottoms[-1], abs=1e-4)
    assert cosine.get_position().y1 == pytest.approx(tops[1], abs=1e-4) and cosine.get_position().y0 == pytest.approx(bottoms[1], abs=1e-4)
    rightmost_disagreement = max(ax.get_position().x1 for ax in panels[:4])
    assert rightmost_disagreement < disagreement.get_position().x0 < cosine.get_position().x0
