"""Why an ensemble is or is not one, in a report: what the tables of the diversity gap, of
disagreement against error, of calibration against refinement and of EPKL/RMI say, and each
method's gain over the single model split into calibration and refinement.

    tables, definitions = with_diagnostics(tables, runs, expected, make_table)   # aggregate.build_report

The per-run numbers are the analyzers' declared columns (their tables are built like any plug-in's);
this adds what needs several methods at once:
- the diversity-gap table's note flags every method whose train − test gap exceeds the Deep
  Ensemble's with intervals apart (its low end above the Deep Ensemble's high end). The intervals
  are the cells' own: over seeds, mean ± t·s/√n, where a method has two or more seeds; for one
  seed, that run's test-set interval (metrics.json, with `--detail`); a method with neither is
  said to be not compared. It is a note, not part of the verdict;
- a table of each method's gain over the single model in NLL and Brier on the in-distribution test
  set, and how much of it is calibration (what temperature scaling would also buy the single
  model) and how much refinement (what it cannot): gain = single − method for each part, per seed
  the two share, then mean ± t·s/√n over those seeds. The parts add up to the gain.
"""

import math

from ..seeds.stats import BASELINE, REFERENCE
from .load import dig

GAPS = ("disagreement gap (train − test)", "KL gap (train − test)")
NOTES = {
    "diversity-gap": "Diversity on a fixed sample of training examples, on the validation and on the test split, and "
                     "its train − test gap. Jointly trained members can disagree on their training data in a way that "
                     "does not generalise (learner collusion, Jeffares et al. 2023): a gap above the Deep Ensemble's "
                     "is its sign.",
    "disagreement-error": "D/E: the members' mean pairwise disagreement over their mean error on the same examples. "
                          "Independently trained members disagree about as often as they err (D/E ≈ 1, Jiang et al. "
                          "2022); members that collapsed onto one function disagree far less than they err (identical "
                          "members: 0). N/A where no member errs (the ratio is undefined).",
    "refinement": "Each loss = calibration + refinement (Berta et al. 2025): calibration is what temperature scaling of "
                  "p̄, cross-fitted on the split's own examples (5 folds), removes; refinement what remains, what the "
                  "predictions can still tell apart. Calibration may fall a little below 0 for a calibrated model.",
    "uncertainty": "EPKL = MI + RMI ≥ MI (Malinin & Gales 2020): the expected pairwise KL between members and the "
                   "reverse mutual information beside the mutual information (JSD). ρ(AU, EU): Spearman's rank "
                   "correlation of each example's aleatoric and epistemic parts; near ±1 the two rank the examples "
                   "alike and do not separate two sources (Mucsányi et al. 2024).",
}
GAIN_PARTS = (("NLL gain", "nll", "loss"), ("NLL: from calibration", "nll", "calibration"),
              ("NLL: from refinement", "nll", "refinement"), ("Brier gain", "brier", "loss"),
              ("Brier: from calibration", "brier", "calibration"), ("Brier: from refinement", "brier", "refinement"))
GAIN_DEFINITIONS = {label: f"the single model's {part} of the {loss.upper() if loss == 'nll' else 'Brier score'} minus "
                           "the method's, on the in-distribution test set, per seed both have, then averaged"
                    for label, loss, part in GAIN_PARTS}


def with_diagnostics(tables: list, runs: dict, expected: int, make_table) -> tuple[list, dict]:
    """(the tables with the diagnostics' notes and, after the refinement table, the gain table;
    {label: definition} of the gain table's columns). `make_table` is aggregate's `_table`."""
    for table in tables:
        if table["id"] in NOTES:
            table["note"] = " ".join(part for part in (NOTES[table["id"]], table.get("note", "")) if part)
        if table["id"] == "diversity-gap":
            table["note"] += " " + gap_flags(table)
    gain = gain_table(runs, expected, make_table)
    if gain is None:
        return tables, {}
    at = next((index + 1 for index, table in enumerate(tables) if table["id"] == "refinement"), len(tables))
    return [*tables[:at], gain, *tables[at:]], GAIN_DEFINITIONS


def cell_interval(cell: dict) -> list[float] | None:
    """The interval a cell carries: over seeds (mean ± ci) with two or more, else its run's test-set one."""
    mean, half = cell.get("mean"), cell.get("ci")
    if isinstance(mean, (int, float)) and isinstance(half, (int, float)) and math.isfinite(half):
        return [mean - half, mean + half]
    example = cell.get("example") or {}
    if isinstance(example.get("low"), (int, float)) and isinstance(example.get("high"), (int, float)):
        return [example["low"], example["high"]]
    return None


def gap_flags(table: dict) -> str:
    """Which methods' train − test gaps exceed the Deep Ensemble's with intervals apart, in words."""
    names = [column["name"] for column in table["columns"]]
    rows = {row["method"]: row for row in table["rows"] if not row.get("reference")}
    if REFERENCE not in rows:
        return "No Deep Ensemble in this report: no gap is compared with one."
    flagged, apart, unknown = [], [], []
    for label in GAPS:
        if label not in names:
            continue
        index = names.index(label)
        reference = cell_interval(rows[REFERENCE]["cells"][index])
        for method, row in rows.items():
            if method == REFERENCE or row["cells"][index].get("mean") is None:
                continue
            own = cell_interval(row["cells"][index])
            if own is None or reference is None:
                unknown.append(f"{row['label']} ({label.split(' gap')[0]})")
            elif own[0] > reference[1]:
                flagged.append(f"{row['label']}: {label} {_number(row['cells'][index]['mean'])} "
                               f"[{_number(own[0])}, {_number(own[1])}] against the Deep Ensemble's "
                               f"[{_number(reference[0])}, {_number(reference[1])}]")
            else:
                apart.append(row["label"])
    words = ("Flagged — a train − test gap above the Deep Ensemble's, intervals apart (over seeds where a method has "
             "two or more, else the run's test-set interval): " + "; ".join(flagged) + "." if flagged else
             "No method's train − test gap exceeds the Deep Ensemble's with intervals apart." if apart else "")
    if unknown:
        words += (" Not compared (one seed without a test-set interval; `ensdiag evaluate --detail` or more seeds "
                  "give one): " + ", ".join(unknown) + ".")
    return words.strip()


def _number(value: float) -> str:
    return f"{value:.3f}" if abs(value) >= 0.001 or value == 0 else f"{value:.2e}"


def gain_table(runs: dict, expected: int, make_table) -> dict | None:
    """Each method's gain over the single model split into calibration and refinement (module docstring);
    None without a single model or without refinement numbers."""
    singles = runs.get(BASELINE)
    if not singles:
        return None
    partner = {id(run): singles.get(seed) for seeds in runs.values() for seed, run in seeds.items() if run is not None}

    def gain(loss, part):
        def value_of(run):
            single = partner.get(id(run))
            mine, theirs = (dig(found["metrics"], ("analyzers", "refinement", "splits", "id", loss, part, "value"))
                            if found is not None and dig(found["metrics"], ("analyzers", "refinement", "status")) == "ok"
                            else None for found in (run, single))
            return theirs - mine if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) else None
        return value_of

    others = {method: seeds for method, seeds in runs.items() if method != BASELINE}
    table = make_table("refinement-gain", "Each method's gain over the single model: from calibration or from "
                       "refinement (in-distribution test set)",
                       [(label, gain(loss, part), "up") for label, loss, part in GAIN_PARTS], others, expected,
                       note="Gain = the single model's loss − the method's, per seed both have; it splits exactly into "
                            "calibration (what temperature scaling would also buy the single model) and refinement "
                            "(what no recalibration of the single model buys). A gain mostly from calibration: a "
                            "temperature-scaled single model would do about as well on this loss.")
    if not any(cell.get("mean") is not None for row in table["rows"] for cell in row["cells"]):
        return None
    return table
