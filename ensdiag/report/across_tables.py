"""The report's tables of the statistics across seeds (seeds/): the verdict, each method's effective
ensemble size (effective_size.py), for every question the verdict leaves open the seeds that would settle
it (verdict.py's `seeds_needed`), and bias–variance–diversity (across.py).

    verdict_table(verdicts, reasons, expected, groups)   # (the table or None, the verdict entries with their lines)
    effective_size_table(sizes)      # {"id": "effective-size", "columns", "rows", "note"} or None
    seeds_needed_table(verdicts)     # {"id": "seeds-needed", …} or None where nothing is open
    bvd_table(decompositions)        # {"id": "bvd", …} or None without a method of two seeds
"""

import math

from ..nn.methods import run_label
from ..stats.scaling import FOLDS, REPEATS
from ..seeds.effective_size import METRICS
from .verdict_text import QUESTIONS, answer, how_to_read, sentence

VERDICT = "Verdict: is each efficient method an ensemble? (ratios to the Deep Ensemble)"
SHARES = (("NLL share", "nll", "up"), ("ECE share", "ece", "up"), ("OOD AUROC share", "auroc", "up"),
          ("shift NLL share", "shift_nll", "up"), ("diversity ×", "diversity", "up"))
COLUMNS = (("k", None), ("CNLL ≡ n", "cnll"), ("Brier ≡ n", "brier"), ("AUROC ≡ n", "auroc"))
SIZE_DEFINITIONS = {
    "k": "the method's members (MC Dropout: its passes)",
    "CNLL ≡ n": "effective ensemble size: the number n of Deep-Ensemble members whose calibrated NLL "
                "(temperature-scaled p̄) equals the method's, read off the power law a + b·n^(−c) of the Deep "
                "Ensemble's sub-ensembles (docs/conventions.md, \"Effective ensemble size\")",
    "Brier ≡ n": "the same on the Brier score of p̄",
    "AUROC ≡ n": "the same on OOD AUROC with the score 1 − max p̄"}
TEMPERATURES = {"validation": "the temperature fitted on the validation split",
                "cross-validation": f"the temperature cross-fitted on the test set (each of {FOLDS} folds scored with "
                                    f"the T fitted on the others, {REPEATS} fold assignments averaged; a run without a "
                                    "validation split)"}


def _cell(found: dict | None, seeds) -> dict:
    found = found or {}
    interval = found.get("interval")
    return {"mean": found.get("value"), "ci": None, "n": seeds, "values": [],
            "interval": None if interval is None else [bound if math.isfinite(bound) else math.inf for bound in interval]}


def verdict_table(found: dict, reasons: dict, expected: int, groups=None) -> tuple[dict | None, dict]:
    """The verdict (seeds/verdict.py) as a table of ratios with their intervals; per method, its overall
    line (led by its effective size) and what each question answers (verdict_text.py), then how to read
    them, as the note; `reasons`: why a method has none. The table carries no best/second marks: the
    answers are the verdict's tests."""
    missing = [f"{run_label(method)}: no verdict — {reason}." for method, reason in reasons.items() if method not in found]
    if not found and (not missing or not groups):
        return None, {}
    rows = []
    for method, entry in found.items():
        entry["sentence"] = sentence(run_label(method), entry)
        entry["answer"] = answer(run_label(method), entry)
        rows.append({"method": method, "label": run_label(method), "cells": [
            {"mean": entry.get(key, {}).get("value"), "ci": None, "n": entry["seeds"], "values": [],
             "interval": entry.get(key, {}).get("interval"), "answer": entry.get(key, {}).get("answer"),
             "expected": expected} for _, key, _ in SHARES]})
    note = "\n\n".join([*(f"{entry['answer']}\n\n{entry['sentence']}" for entry in found.values()), *missing,
                        *([how_to_read(found)] if found else [])])
    columns = [{"name": label, "direction": direction} for label, _, direction in SHARES] if found else []
    return {"id": "verdict", "title": VERDICT, "note": note, "columns": columns, "rows": rows}, found


def effective_size_table(sizes: dict) -> dict | None:
    """One row per method beside a Deep Ensemble: k and its size on each metric with the 95 %
    interval; the note says how, the Deep Ensemble's measured curves, what was extrapolated and why a
    size is missing."""
    if not sizes:
        return None
    rows, beyond, missing, reference = [], {}, {}, None
    for method, entry in sizes.items():
        label = run_label(method)
        if "members" not in entry:
            missing.setdefault(entry.get("reason", "not measured"), []).append(label)
            continue
        reference = reference or entry
        rows.append({"method": method, "label": label, "cells": [
            {"mean": entry["members"], "ci": None, "n": entry["seeds"], "values": []},
            *(_cell(entry.get(metric), entry["seeds"]) for _, metric in COLUMNS[1:])]})
        for metric in METRICS:
            found = entry.get(metric) or {}
            if found.get("extrapolated"):
                beyond.setdefault(label, []).append(METRICS[metric])
            elif found.get("reason"):
                missing.setdefault(found["reason"], []).append(f"{label} ({METRICS[metric]})")
    if not rows:
        return None
    k = reference["reference_members"]
    curves = "; ".join(f"{METRICS[metric]} {', '.join(f'{value:.4g}' for value in reference[metric]['curve'])} "
                       f"(fitted c = {reference[metric]['fit']['c']:.2f})"
                       for metric in METRICS if reference.get(metric))
    temperature = TEMPERATURES[reference["temperature"]] + "".join(
        f" ({entry['temperature_note']}: {run_label(method)})" for method, entry in sizes.items()
        if entry.get("temperature_note"))
    note = (f"Each method as the number of Deep-Ensemble members that would score as well (Ashukha et al. 2020; "
            f"Lobacheva et al. 2020): the Deep Ensemble's {reference['subsets']} sub-ensembles of 1…{k} members give "
            f"its score at each size per seed; a power law a + b·n^(−c) through the sizes 1 and {k} (c by least "
            f"squares between them) is fitted per seed, and the method's size is where the mean of the seeds' curves "
            f"reaches its mean over the same seeds (the Deep Ensemble itself reads {k}; a method no better than its "
            f"average member reads 1). 95 % interval: the sizes a paired t-test over seeds does not reject, widened by "
            f"a paired bootstrap over seeds and test examples ({reference.get('resamples', 'its')} resamples); "
            f"∞ (inf): better than the curve's limit a. Calibrated NLL: "
            f"{temperature}. The Deep Ensemble's measured curve (mean over seeds, n = 1…{k}): {curves}.")
    if beyond:
        note += " Beyond its " + f"{k} members the law extrapolates: " + "; ".join(
            f"{label} ({', '.join(names)})" for label, names in beyond.items()) + "."
    note += "".join(f" No size for {', '.join(labels)}: {why}." for why, labels in missing.items())
    return {"id": "effective-size", "title": "Effective ensemble size: each method ≡ a Deep Ensemble of how many members",
            "note": note, "columns": [{"name": name, "direction": None} for name, _ in COLUMNS], "rows": rows}


def seeds_needed_table(verdicts: dict) -> dict | None:
    """Per method and open question, the seeds that would settle it (None in a cell: no number of seeds
    on this test set, or more than the most projected; settled questions are empty)."""
    rows = []
    for method, entry in verdicts.items():
        cells = [{"mean": (entry.get(key) or {}).get("seeds_needed", {}).get("seeds"), "ci": None,
                  "n": entry["seeds"], "values": []} for key, _ in QUESTIONS]
        if any("seeds_needed" in (entry.get(key) or {}) for key, _ in QUESTIONS):
            rows.append({"method": method, "label": run_label(method), "cells": cells})
    if not rows:
        return None
    return {"id": "seeds-needed", "title": "Seeds that would settle each open question",
            "note": "For a ratio the seeds leave unsettled: the seeds at which its 95 % interval would clear the line "
                    "nearer its estimate (25 % or 50 %) with 80 % probability, if seeds vary as these did (the power of "
                    "the paired t-test, noncentral t); for a share not given because the Deep Ensemble's own gain is "
                    "within noise: the seeds that would tell that gain from 0. The test examples' error the seeds "
                    "share does not shrink with seeds; where it alone spans the line, or more than 1,000 seeds would "
                    "be needed, the cell is N/A (the verdict says which).",
            "columns": [{"name": name, "direction": None} for _, name in QUESTIONS], "rows": rows}


def bvd_table(found: dict) -> dict | None:
    """Bias, variance and diversity over seeds (seeds/across.py), one row per method with ≥ 2 seeds."""
    left_out = " ".join(f"{run_label(method)}: left out, {entry['reason']}." for method, entry in found.items()
                        if "reason" in entry)
    found = {method: entry for method, entry in found.items() if "reason" not in entry}
    if not found:
        return None
    columns = [("CE bias", "cross_entropy", "bias"), ("CE variance", "cross_entropy", "variance"),
               ("CE diversity (geometric)", "cross_entropy", "diversity"),
               ("CE diversity (arithmetic)", "cross_entropy_arithmetic", "diversity"),
               ("Brier bias", "squared", "bias"), ("Brier variance", "squared", "variance"),
               ("Brier diversity", "squared", "diversity")]
    rows = [{"method": method, "label": run_label(method), "cells": [
        {"mean": entry[loss][part], "ci": None, "n": entry["seeds"], "values": []} for _, loss, part in columns]}
        for method, entry in found.items()]
    return {"id": "bvd", "title": "Bias, variance and diversity over seeds (in-distribution test set)",
            "note": "Expected loss over seeds = bias + variance − diversity, exactly (Wood et al. 2023), for each "
                    "combiner of the members' probabilities: CE with their normalised geometric mean (the combiner "
                    "whose diversity, mean_i KL(q̄ ‖ q_i), does not depend on the label) and with their arithmetic mean "
                    "p̄, the ensemble ensdiag predicts with (its diversity, the members' mean CE minus the CE of p̄, "
                    "depends on the label); Brier with their arithmetic mean. Bias and variance describe the members, "
                    "so both CE decompositions share them; the bias includes label noise. Variance is what more seeds "
                    "would average away; diversity what the members do." + (f" {left_out}" if left_out else ""),
            "columns": [{"name": label, "direction": None} for label, _, _ in columns], "rows": rows}


def damaged_lines(damaged: dict, tables: list) -> list[str]:
    """A line per run whose predictions file could not be used (seeds/across.py): below the first table over
    seeds (what the terminal shows), or, without one, as the report's notes (returned)."""
    lines = [f"{run_label(method)} seed {seed}: left out of the verdict, effective size and bias–variance — {why}."
             for method, seeds in damaged.items() for seed, why in seeds.items()]
    first = next((table for table in tables if table["id"] in ("verdict", "effective-size", "bvd")), None)
    if first is None or not lines:
        return lines
    first["note"] = "\n\n".join(part for part in (first["note"], *lines) if part)
    return []
