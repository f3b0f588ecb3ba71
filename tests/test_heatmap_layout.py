"""heatmap_grid places its panels itself (no layout engine): whatever the rows, every label is drawn
inside the figure, and no panel, colour bar or label overlaps another's."""

import itertools

import pytest

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
}


def _boxes(figure):
    """(what, its axes, display box) of every visible text and every axes' own area, after drawing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    found = [(f"axes {i}", ax, ax.get_window_extent(renderer)) for i, ax in enumerate(figure.axes)]
    for ax in figure.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label,
                 *(t.label1 for t in ax.xaxis.get_major_ticks()), *(t.label1 for t in ax.yaxis.get_major_ticks()),
                 *(t.label2 for t in ax.yaxis.get_major_ticks())]
        found += [(repr(t.get_text()), ax, t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]
    found += [(repr(t.get_text()), None, t.get_window_extent(renderer)) for t in figure.texts if t.get_text()]
    return found, figure.bbox


@pytest.mark.parametrize("title", [None, "inspect: a model, k=4"])
@pytest.mark.parametrize("name", LAYOUTS)
def test_every_label_is_inside_the_figure_and_nothing_overlaps(name, title):
    figure = heatmap_grid(LAYOUTS[name], title=title)
    boxes, page = _boxes(figure)
    for what, _, box in boxes:
        assert page.x0 - 0.5 <= box.x0 and box.x1 <= page.x1 + 0.5 and page.y0 - 0.5 <= box.y0 and box.y1 <= page.y1 + 0.5, \
            f"{what} is drawn outside the figure"
    for (a, ax_a, box_a), (b, ax_b, box_b) in itertools.combinations(boxes, 2):
        if ax_a is ax_b:
            continue  # a panel's own labels sit around its area, placed by matplotlib
        overlap_x = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        overlap_y = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        assert overlap_x <= 1 or overlap_y <= 1, f"{a} overlaps {b}"


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
