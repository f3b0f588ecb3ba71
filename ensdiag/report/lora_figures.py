"""Figures of LoRA ensembles (the `lora` section), for `ensdiag diversity ADAPTER_DIR… --plot` and reports:
- `lora_heatmaps`: the k×k ΔW cosine over all adapted layers, one row per ensemble, on the weight
  cosine's colour scale (as the weight-similarity heatmaps);
- `lora_depth_figure`: per layer index, the mean pairwise ΔW cosine and the column- and row-space
  overlaps, one line per module type, each overlap's null baseline dashed.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .figures import heatmap_grid, new_figure, plain, plottable
from .geometry_figures import _value
PANELS = (("delta_cosine", "mean", "null_rms", "ΔW cosine between members\n(null: RMS, dashed)"),
          ("column_overlap", "mean", "null", "column-space overlap\n(mean cos², null dashed)"),
          ("row_overlap", "mean", "null", "row-space overlap\n(mean cos², null dashed)"))


def lora_heatmaps(sections: dict, title=None) -> "Figure":
    """sections: {row label: lora section}."""
    rows = [(plain(label), [("ΔW cosine, all adapted layers", plottable(section["summary"]["delta_cosine"]["matrix"]),
                      "cosine")]) for label, section in sections.items()]
    return heatmap_grid(rows, title=None if title is None else plain(title))


def lora_depth_figure(sections: dict) -> "Figure":
    """One row of three panels per section; x: the layer index, a line per module type."""
    figure = new_figure((11.0, 2.8 * len(sections)))
    axes = figure.subplots(len(sections), len(PANELS), squeeze=False)
    for row, (label, section) in zip(axes, sections.items()):
        layers = [layer for layer in section["layers"] if layer["depth"] is not None]
        types = list(dict.fromkeys(layer["type"] for layer in layers))
        for ax, (key, value, null, name) in zip(row, PANELS):
            for index, kind in enumerate(types):
                found = {}  # depth -> [layers], several modules of one type may share a depth
                for layer in layers:
                    if layer["type"] == kind:
                        found.setdefault(layer["depth"], []).append(layer[key])
                depths = sorted(found)
                mean = [sum(_value(entry[value]) for entry in found[d]) / len(found[d]) for d in depths]
                baseline = [sum(_value(entry[null]) for entry in found[d]) / len(found[d]) for d in depths]
                ax.plot(depths, mean, "-", marker="o", markersize=3, color=f"C{index % 10}", label=plain(kind))
                ax.plot(depths, baseline, "--", linewidth=0.8, alpha=0.6, color=f"C{index % 10}")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_xlabel("layer index", fontsize=8)
            ax.set_ylabel(name, fontsize=8)
            ax.set_title(plain(label), fontsize=8)
        if types:
            row[-1].legend(fontsize=6, title="module", title_fontsize=6, loc="best")
    return figure
