"""Figures of member geometry (analysis/geometry.py), for `ensdiag diversity --plot` and reports.
Each takes {name: result} — a method's (report) or a split's (diversity) analyzer result —
and draws one line per name:
- `cka_layers_figure`: mean off-diagonal CKA per layer, ID solid and OOD dashed;
- `alignment_figure`: weight cosine per layer as trained (dotted), aligned (solid) and the aligned
  null baseline of untrained members (dashed);
- `paths_figure`: test loss and accuracy along the line between members;
- `tracking_figure`: disagreement, JSD and weight cosine per epoch (`train --track-diversity`).
The member-pair matrices (analyzer `member-pairs`) as heatmaps beside the disagreement matrices, in reports and
in `ensdiag diversity` (`pair_rows`: heatmap_grid rows, one per split), and as terminal tables.
"""

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .figures import heatmap_grid, new_figure, plottable
from .load import _damaged, dig, first_ran, first_run
from .terminal import cell, heatmap_table

NAN = float("nan")


def _value(entry):
    value = entry.get("value") if isinstance(entry, dict) else entry
    return NAN if value is None else value


def cka_layers_figure(results: dict) -> "Figure":
    """results: {name: cka result}; one panel, layers on the x axis."""
    figure = new_figure((6.0, 3.0))
    ax = figure.subplots()
    layers = []
    for index, (name, result) in enumerate(results.items()):
        for split, style in (("id", "-"), ("ood", "--")):
            found = result.get("splits", {}).get(split)
            if not found:
                continue
            names = list(found["layers"])
            layers = names if len(names) > len(layers) else layers
            ax.plot(range(len(names)), [_value(found["layers"][n]["mean_linear"]) for n in names], style, marker="o",
                    markersize=3, color=f"C{index}", label=f"{name} ({split})")
    ax.set_xticks(range(len(layers)), layers, rotation=45, ha="right", fontsize=7)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("linear CKA between members\n(mean off-diagonal)", fontsize=8)
    ax.legend(fontsize=7)
    return figure


def alignment_figure(results: dict) -> "Figure":
    figure = new_figure((8.0, 3.0))
    ax = figure.subplots()
    layers = []
    for index, (name, result) in enumerate(results.items()):
        names = list(result["layers"])
        layers = names if len(names) > len(layers) else layers
        ax.plot(range(len(names)), [_value(result["layers"][n]["raw"]) for n in names], ":", marker="o", markersize=3,
                color=f"C{index}", label=f"{name}: as trained")
        ax.plot(range(len(names)), [_value(result["layers"][n]["aligned"]) for n in names], "-", marker="o", markersize=3,
                color=f"C{index}", label=f"{name}: aligned")
        if any("null_aligned" in result["layers"][n] for n in names):
            ax.plot(range(len(names)), [_value(result["layers"][n].get("null_aligned")) for n in names], "--",
                    linewidth=1, color=f"C{index}", alpha=0.6, label=f"{name}: null (untrained members, aligned)")
    ax.set_xticks(range(len(layers)), layers, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("weight cosine between members\n(mean off-diagonal)", fontsize=8)
    figure.legend(loc="outside right upper", fontsize=6)  # beside the axes, off the lines
    return figure


PAIR_STYLES = ("-", "--", ":", "-.")  # the pairs of one method (and the seeds of one method) told apart


def paths_figure(results: dict) -> "Figure":
    """Test loss and accuracy along each pair's path: a method's colour, a line style per member
    pair, every line named in the legend (method, seed, pair)."""
    figure = new_figure((9.5, 2.8))
    loss_ax, accuracy_ax = figure.subplots(1, 2)
    for index, (name, result) in enumerate(results.items()):
        for number, pair in enumerate(result["pairs"]):
            i, j = pair.get("members", (0, number + 1))
            style = dict(color=f"C{index}", linestyle=PAIR_STYLES[number % len(PAIR_STYLES)], linewidth=1, alpha=0.8)
            loss_ax.plot(pair["t"], pair["loss"], label=f"{name}: members {i}–{j}", **style)
            accuracy_ax.plot(pair["t"], pair["accuracy"], **style)
    for ax, label in ((loss_ax, "test loss (NLL)"), (accuracy_ax, "test accuracy")):
        ax.set_xlabel("t: member 0 → member j", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
    figure.legend(loc="outside right upper", fontsize=6)  # beside the axes: a legend inside hid the curves
    return figure


# member geometry's line figures: (analyzer, file suffix, figure)
LINE_FIGURES = (("cka", "cka-layers", cka_layers_figure), ("alignment", "alignment", alignment_figure),
                ("paths", "paths", paths_figure))
TRACKED = (("disagreement", "mean pairwise disagreement"), ("jsd", "JSD"), ("weight_cosine", "weight cosine"))


def _left_out(runs: dict, drawn: dict, name: str, labels: dict) -> str:
    """'. Not drawn: BatchEnsemble (why); …' for the methods of the run a figure leaves out."""
    missing = []
    for method, seeds in runs.items():
        if method in drawn:
            continue
        _, run = first_run(seeds)
        reason = dig(run["metrics"], ("analyzers", name, "reason")) if run else "no finished seed"
        missing.append(f"{labels[method]} ({reason or 'not computed'})")
    return f". Not drawn: {'; '.join(missing)}" if missing else ""


def tracking_figure(curves: dict) -> "Figure":
    """curves: {method: {seed: rows}}, rows {"epoch", "disagreement", "jsd", "weight_cosine",
    "aligned_weight_cosine"}: a method's colour, a marker per seed (named in the legend); aligned
    cosine dashed."""
    figure = new_figure((11.0, 2.8))
    axes = figure.subplots(1, 3)
    markers = ("o", "s", "^", "v", "D", "x")
    for index, (name, seeds) in enumerate(curves.items()):
        for number, (seed, rows) in enumerate(seeds.items()):
            if all(row.get(key) is None for row in rows for key, _ in TRACKED):
                continue  # one member (single model): nothing to draw, so no legend entry either
            epochs = [row["epoch"] for row in rows]
            style = dict(color=f"C{index}", linewidth=1, alpha=0.8, marker=markers[number % len(markers)], markersize=2)
            for ax, (key, _) in zip(axes, TRACKED):
                ax.plot(epochs, [NAN if row.get(key) is None else row[key] for row in rows],
                        label=f"{name}, seed {seed}" if ax is axes[0] else None, **style)
            if any(row.get("aligned_weight_cosine") is not None for row in rows):
                axes[2].plot(epochs, [NAN if row.get("aligned_weight_cosine") is None else row["aligned_weight_cosine"]
                                      for row in rows], linestyle="--", **style)
    for ax, (_, label) in zip(axes, TRACKED):
        ax.set_xlabel("epoch (0: initialisation)", fontsize=8)
        ax.set_ylabel(label + (" (dashed: aligned)" if label == "weight cosine" else ""), fontsize=8)
    figure.legend(loc="outside right upper", fontsize=6)
    return figure


def cka_rows(result: dict, label: str) -> list[tuple]:
    """heatmap_grid rows of a cka result: one per split ("label (split)"), each layer's k×k linear CKA a panel."""
    return [(f"{label} ({split})", [(layer, plottable(entry["linear"]["value"]))
                                    for layer, entry in found["layers"].items()])
            for split, found in result["splits"].items() if found["layers"]]


def cka_layer_grid(results: dict) -> "Figure":
    """k×k linear CKA between members per layer: a row per method (its label) and split."""
    return heatmap_grid([row for method, result in results.items() for row in cka_rows(result, method)],
                        colorbar_label="linear CKA")


def add_report_figures(runs: dict, add, labels: dict) -> None:
    """The report's member-geometry figures from each method's first complete seed (tracking: every
    seed); `add(name, title, draw, *inputs)` saves one. A result of the wrong layout is a damaged file."""
    def draw(name, file, title, make, results, on_request=False):
        if not results:
            return
        _, (_, folder) = next(iter(results.items()))
        add(file, title, make, {method: result for method, (result, _) in results.items()},
            damaged=partial(_damaged, folder / "metrics.json", f"its {name} result is not of the expected layout"),
            on_request=on_request)

    for (name, file, make), title in zip(LINE_FIGURES, (
            "Linear CKA between members per layer, in-distribution (solid) and OOD (dashed); first seed",
            "Weight cosine per layer as trained (dotted), after permutation alignment (solid) and aligned untrained "
            "members, the null baseline (dashed); first seed",
            "Test loss and accuracy on the straight line between member 0 and members 1–3; first seed")):
        drawn = first_ran(runs, name)
        draw(name, file, title + _left_out(runs, drawn, name, labels), make,
             {f"{labels[method]}, seed {seed}": (run["metrics"]["analyzers"][name], run["folder"])
              for method, (seed, run) in drawn.items()})
    heatmaps = {labels[method]: (run["metrics"]["analyzers"]["cka"], run["folder"]) for method, (_, run) in first_ran(runs, "cka").items()}
    if heatmaps:
        draw("cka", "cka-heatmaps", "k×k linear CKA between members, per layer (rows: method and split; first seed)",
             cka_layer_grid, heatmaps, on_request=True)
    tracked = {method: {seed: run["tracking"] for seed, run in seeds.items() if run and run.get("tracking")}
               for method, seeds in runs.items()}
    if any(tracked.values()):
        spent = sum(row.get("seconds") or 0 for seeds in runs.values() for run in seeds.values() if run and run.get("tracking")
                    for row in run["tracking"] if isinstance(row.get("seconds"), (int, float)))
        epochs = sum(row.get("seconds") or 0 for seeds in runs.values() for run in seeds.values() if run and run.get("tracking")
                     for row in run["history"] if isinstance(row.get("seconds"), (int, float)))
        cost = f"; measuring took {spent / epochs:.1%} of the epochs' time" if epochs > 0 else ""
        add("tracking", f"Diversity over training on the validation split (epoch 0: initialisation; every seed{cost})",
            tracking_figure, {labels[method]: rows for method, rows in tracked.items() if rows})


PANELS = (  # (key in the result, panel title, colour scale in figures.SCALES)
    ("kl", "KL(row ‖ column)", "kl"),
    ("jsd", "JSD", "jsd"),
    ("error_correlation", "error correlation", "correlation"),
    ("yule_q", "Yule's Q", "correlation"),
    ("double_fault", "double-fault", "double_fault"),
)


def disagreement_panels(analyzers: dict, splits=None, prefix: str = "disagreement: ") -> tuple[list, list | None]:
    """[(prefix + split, k×k matrix, "disagreement")] of the stored disagreement matrices of `splits` (None: every
    split), and the weight cosine's matrix (None where it was not measured or not stored)."""
    found = dig(analyzers, ("disagreement", "splits")) if dig(analyzers, ("disagreement", "status")) == "ok" else None
    panels = [(prefix + split, matrix, "disagreement") for split in (splits or found or ())
              if (matrix := plottable(dig(found, (split, "matrix", "value")))) is not None]
    ok = dig(analyzers, ("weight-similarity", "status")) == "ok"
    return panels, plottable(dig(analyzers, ("weight-similarity", "matrix", "value"))) if ok else None


def pair_panels(result: dict, split: str) -> list[tuple]:
    """[(title, k×k matrix, scale)] of one split's stored matrices (unlabelled splits: KL and JSD)."""
    found = dig(result, ("splits", split)) or {}
    return [(title, matrix, scale) for key, title, scale in PANELS
            if (matrix := plottable(dig(found, (key, "matrix", "value")))) is not None]


def pair_rows(result: dict, splits=("id", "shift", "ood")) -> list[tuple]:
    """heatmap_grid rows, one per split that has matrices; none when the analyzer did not run."""
    if not isinstance(result, dict) or result.get("status") != "ok":
        return []
    return [(f"member pairs ({split})", panels) for split in splits if (panels := pair_panels(result, split))]


def add_pair_figures(runs: dict, add, labels: dict) -> None:
    """One row per method (its first finished seed), in-distribution test set: the disagreement matrix,
    then the pair matrices beside it, each quantity on one labelled colour scale."""
    rows = []
    for method, (seed, run) in first_ran(runs, "member-pairs").items():
        analyzers = run["metrics"]["analyzers"]
        panels = pair_panels(analyzers["member-pairs"], "id")
        disagreement = plottable(dig(analyzers, ("disagreement", "splits", "id", "matrix", "value")))
        if disagreement is not None:
            panels.insert(0, ("disagreement", disagreement, "disagreement"))
        if panels:
            rows.append((f"{labels[method]} (seed {seed})", panels))
    if rows:
        add("member-pairs", "Member pairs on the in-distribution test set: disagreement, KL in both directions (row ‖ "
            "column), JSD, error correlation, Yule's Q and double-fault (first seed)", heatmap_grid, rows, on_request=True)


def pair_lines(result: dict, matrices_of=("id",)) -> list:
    """For the terminal: per split, each matrix's mean off-diagonal and the ambiguity; the k×k tables
    (rich Tables) of the splits in `matrices_of` (every split's are in the JSON); or one line
    saying why there is nothing."""
    if not isinstance(result, dict) or result.get("status") != "ok":
        reason = result.get("reason", "not computed") if isinstance(result, dict) else "not computed"
        return [f"member pairs: {reason}"]
    shown = ["member pairs: KL(row ‖ column) and JSD between two members' predicted distributions (0: the same); "
             "error correlation and Yule's Q: whether two members err on the same examples (1: always together, "
             "−1: never); double-fault: the fraction both get wrong (diagonal: the member's own error); ambiguity: "
             "mean_i ‖p_i − p̄‖²"]
    for split, found in result["splits"].items():
        if "/" in split:
            continue
        means = ", ".join(f"{title} {cell(found[key]['mean'])}" for key, title, _ in PANELS if key in found)
        shown.append(f"member pairs on {split}: mean off-diagonal {means}; ambiguity {cell(found['ambiguity'])}")
        for key, title, scale in PANELS if split in matrices_of else ():
            if key in found:
                matrix = found[key]["matrix"]["value"] or []
                largest = max((v for row in matrix for v in row if v is not None), default=1.0)
                low, high = (-1.0, 1.0) if scale == "correlation" else (0.0, max(largest, 1e-12) if scale == "kl" else 1.0)
                shown.append(heatmap_table(found[key]["matrix"]["value"], f"{title} ({split})", low=low, high=high))
    return shown
