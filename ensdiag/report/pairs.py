"""The member-pair matrices (analyzer `member-pairs`) as heatmaps beside the disagreement matrices,
in reports and in `ensdiag diversity`, and as terminal tables.

    rows = pair_rows(metrics["analyzers"]["member-pairs"])     # heatmap_grid rows, one per split
"""

from .figures import heatmap_grid, plottable
from .load import dig, first_ran
from .terminal import cell, heatmap_table

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
