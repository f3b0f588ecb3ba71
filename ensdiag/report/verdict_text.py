"""The verdict in words: per method, what each question's interval answers, then one overall line
naming its evidence; and once per report, how to read them (intervals, the rule, multiplicity).

    answer("BatchEnsemble", entry)     # "BatchEnsemble (k = 4) ≡ a Deep Ensemble of 1.1 [1.0, 1.3] members; like a
                                       #  single model on diversity; NLL not settled by 3 seeds (would need ≈ 12 seeds)."
    sentence("BatchEnsemble", entry)   # "Diversity: like a single model — 0.07× [0.07, 0.08] of the Deep Ensemble's. …"
    how_to_read(entries)               # the rule, the intervals and the multiplicity rule, once

Questions with the same answer share one clause, so nothing is said twice.

The first screen: what the main job ends with, in an 80 × 24 terminal.

    print(to_summary(report, written))    # `ensdiag report RUN --format summary`

One line per method, led by its effective ensemble size (effective_size.py: "BatchEnsemble (k = 4) ≡
a Deep Ensemble of 1.1 [1.0, 1.3] members"), then what the seeds settle and what would settle the
rest (`answer`); where the report is and the command that opens it. Lines are wrapped at
`WIDTH` with a hanging indent, never inside an interval; every table, figure and number behind them
is in the report.
"""

import math
from pathlib import PurePath

from .. import text as sink
from ..console import wrapped
from ..seeds.stats import BASELINE, ENSEMBLE_LIKE, MOST_SEEDS, REFERENCE, SINGLE_LIKE
from ..text import counted

QUESTIONS = (("nll", "NLL"), ("ece", "ECE"), ("auroc", "OOD AUROC"), ("shift_nll", "NLL under shift"),
             ("diversity", "diversity"))
SHARES = QUESTIONS[:4]
SUBJECTS = {"nll": "NLL gain", "ece": "ECE gain", "auroc": "OOD AUROC gain", "shift_nll": "NLL gain under shift",
            "diversity": "diversity"}
WORDS = {"ensemble": "like an ensemble", "single": "like a single model",
         "between": "between a single model and an ensemble"}
WHY = {"no gain": "the Deep Ensemble gains nothing over the single model",
       "worse": "the Deep Ensemble is worse than the single model",
       "noise": "the Deep Ensemble's own gain is within noise"}


def _join(items):
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _unsettled(n: int) -> str:
    return f"not settled by {counted(n, 'seed')}"


def _bounds(interval, fmt: str, missing: str = "") -> str:
    """" [low, high]", each bound formatted by `fmt`; `missing` where there is no interval."""
    return missing if interval is None else f" [{fmt.format(interval[0])}, {fmt.format(interval[1])}]"


def _figure(key, found) -> str:
    """'40 % [−31 %, 112 %]' for a share, '0.07× [0.07, 0.08]' for the diversity ratio."""
    if key == "diversity":
        return f"{found['value']:.2f}×" + _bounds(found["interval"], "{:.2f}", " [unbounded]")
    interval = None if found["interval"] is None else [bound * 100 for bound in found["interval"]]
    return f"{found['value'] * 100:.0f} %" + _bounds(interval, "{:.0f} %", " [unbounded]")


def _number(value, interval) -> str:
    return f"{value:.3g}" + _bounds(interval, "{:.3g}")


def _answers(entry) -> dict:
    """{answer: [question key]} over the questions that have one (a share the Deep Ensemble's own
    gain leaves undetermined has none), in the questions' order."""
    found = {}
    for key, _ in QUESTIONS:
        answer = entry.get(key, {}).get("answer")
        if answer is not None and entry[key].get("value") is not None:
            found.setdefault(answer, []).append(key)
    return found


NAMES = dict(QUESTIONS)


def _size(value: float) -> str:
    return "∞" if value == math.inf else f"{value:.1f}" if value < 9.95 else f"{value:,.0f}"


def printed_size(sizes: dict | None, metric: str = "cnll") -> tuple | None:
    """(value, [low, high]) where the first screen prints a size as a point with its interval; None where
    it says it in words (the reference, no size, or an interval that holds 1 and is unbounded above)."""
    found = (sizes or {}).get(metric) or {}
    if (sizes or {}).get("reference") or found.get("value") is None or not found.get("interval"):
        return None
    low, high = found["interval"]
    return None if low <= 1 + 1e-9 and high == math.inf or low == high else (found["value"], [low, high])


def size_phrase(sizes: dict | None, metric: str = "cnll") -> str | None:
    """"(k = 4) ≡ a Deep Ensemble of 1.1 [1.0, 1.3] members" (effective_size.py, on calibrated NLL), with
    "extrapolated" where the law reads beyond the Deep Ensemble's own size; in words where a point would say
    more than the data: the Deep Ensemble itself (k by construction), a size the seeds cannot tell from one
    member (its interval holds 1 and is unbounded above), an interval of zero width; None without a size."""
    found = (sizes or {}).get(metric) or {}
    if found.get("value") is None:
        return None
    k, members = sizes["reference_members"], f"(k = {sizes['members']})"
    if sizes.get("reference"):
        return f"{members}: the reference, ≡ {k} members by construction"
    low, high = found["interval"] or (None, None)
    if low is None:
        return f"{members} ≡ a Deep Ensemble of {_size(found['value'])} members (no interval)"
    if printed_size(sizes, metric) is None:  # [1, ∞), or an interval of zero width
        return (f"{members}: {counted(sizes['seeds'], 'seed')} cannot tell it from one Deep-Ensemble member" if high > low
                else f"{members} ≡ no more than one Deep-Ensemble member, on every resample" if high <= 1 + 1e-9
                else f"{members} ≡ more than any Deep Ensemble, on every resample" if low == math.inf
                else f"{members} ≡ a Deep Ensemble of {_size(found['value'])} members on every resample")
    beyond = (f", extrapolated beyond its {k}" if found["value"] > k * (1 + 1e-9)
              else f", upper bound extrapolated beyond its {k}" if found.get("extrapolated") else "")
    bounds = f" [{_size(low)}, {_size(high)}{')' if high == math.inf else ']'}"
    return f"{members} ≡ a Deep Ensemble of {_size(found['value'])}{bounds} members{beyond}"


def needed(found: dict) -> str | None:
    """"≈ 12 seeds (5 to 300)", "over 1,000 seeds (at least 350)", "a larger test set": what would settle an
    open question; the range is the count at each end of the seed-to-seed spread's own 95 % interval."""
    need = found.get("seeds_needed")
    if not need:
        return None
    low, high = need.get("range") or (None, None)
    if need.get("seeds"):
        ends = f" ({low:,} to {f'{high:,}' if high else f'over {MOST_SEEDS:,}'})" if low else ""
        return f"≈ {need['seeds']:,} seeds{ends}"
    if need.get("why") == "too many":
        return f"over {MOST_SEEDS:,} seeds" + (f" (at least {low:,})" if low else "")
    return {"test set": "a larger test set", "no spread": "a larger test set",
            "one seed": "a second seed to tell"}.get(need.get("why"))


def answer(label: str, entry: dict) -> str:
    """The overall line: the method's effective size where there is one (`entry["effective_size"]`),
    what the settled questions say, naming them; what stays open, briefly, and what would settle it."""
    found = _answers(entry)
    settled = [(category, found[category]) for category in WORDS if category in found]
    open_keys = found.get("unsettled", [])
    open_ = [NAMES[key] for key in open_keys]
    n = entry["seeds"]
    phrase = size_phrase(entry.get("effective_size"))
    lead = f"{label} {phrase};" if phrase else f"{label}:"
    needs = [(NAMES[key], text) for key in open_keys if (text := needed(entry[key]))]
    would = ""
    if needs and len(needs) == len(open_keys):  # "NLL would need ≈ 12 seeds (5 to 300), diversity ≈ 40 seeds (…)"
        would = f"would need {needs[0][1]}" if len(needs) == 1 else ", ".join(
            f"{name} {'would need ' * (index == 0)}{text}" for index, (name, text) in enumerate(needs))
    if not settled:
        if would:
            return f"{lead} {_unsettled(n)} on any question: " + (f"{open_[0]} " * (len(needs) == 1)) + f"{would}."
        return f"{lead} {_unsettled(n)} on any question" + (f" ({_join(open_)})." if open_ else ".")
    said = "; ".join(f"{WORDS[category]} on {_join(NAMES[key] for key in keys)}"
                     + (f" ({caveat})" if category == "ensemble" and "diversity" in keys and (caveat := _weaker(entry))
                        else "") for category, keys in settled)
    text = f"{lead} {'mixed — ' if len(settled) > 1 else ''}{said}"
    if open_:
        text += f"; {_join(open_)} {_unsettled(n)}" + (f": {would}" if would else "")
    return text + "."


def _weaker(entry: dict) -> str | None:
    """Why a diversity like an ensemble's buys no ensemble, in one clause: the method is worse than the single
    model on NLL, or its members are individually worse than the Deep Ensemble's and their geometric-mean
    ensemble is no better (drivers); None otherwise."""
    drivers = entry.get("diversity", {}).get("drivers") or {}
    ensemble = (drivers.get("geometric_nll_difference") or {}).get("interval")
    if ensemble is not None and ensemble[1] < 0:  # a better ensemble: the diversity pays
        return None
    share = entry.get("nll", {}).get("value")
    if share is not None and share < 0:
        return "but worse than the single model on NLL: the diversity comes from weaker members"
    members = (drivers.get("member_nll_difference") or {}).get("interval")
    if members is not None and members[0] > 0:
        return "but from weaker members, not a better ensemble"
    return None


def size_line(label: str, sizes: dict) -> str:
    """A method's line without a verdict: its effective size, or why it has none."""
    phrase = size_phrase(sizes)
    if phrase:
        return f"{label} {phrase}."
    why = sizes.get("reason") or (sizes.get("cnll") or {}).get("reason") or "no calibrated NLL to compare"
    return f"{label}: no effective size — {why}."


def sentence(label: str, entry: dict) -> str:
    """Each answered question with its number, questions of one answer in one clause; shares not
    given and why; and, for a diversity above the Deep Ensemble's, what drives it."""
    n = entry["seeds"]
    clauses = []
    for category, keys in _answers(entry).items():
        words = WORDS.get(category) or _unsettled(n)
        shares = [key for key in keys if key != "diversity"]
        parts = []
        if shares:
            gains = _join(_number(entry[key]["reference_gain"], entry[key]["reference_gain_interval"]) for key in shares)
            parts.append(f"{_join(_figure(key, entry[key]) for key in shares)} of the Deep Ensemble's ({gains})")
        if "diversity" in keys:
            parts.append(f"{_figure('diversity', entry['diversity'])} the Deep Ensemble's diversity")
        subject = _join(SUBJECTS[key] for key in keys)
        needs = [f"{text} ({NAMES[key]})" if len(keys) > 1 else text for key in keys if (text := needed(entry[key]))]
        settle = f"; settling {'them' if len(keys) > 1 else 'it'} would need {_join(needs)}" if needs else ""
        clauses.append(f"{subject[0].upper()}{subject[1:]}: {words} — {_join(parts)}{settle}.")
    notes = _outside(entry)
    if notes:
        clauses.append(notes)
    reasons = {}
    for key, name in SHARES:
        why = entry.get(key, {}).get("undetermined")
        if why:
            reasons.setdefault(why, []).append((name, _number(entry[key]["reference_gain"],
                                                              entry[key]["reference_gain_interval"])))
    for why, gains in reasons.items():
        tell = [f"{text} ({name})" for key, name in SHARES if entry.get(key, {}).get("undetermined") == why
                and (text := needed(entry[key]))]
        clauses.append(f"No share of the {_join(name for name, _ in gains)} gain{'s' if len(gains) > 1 else ''}: "
                       f"{WHY[why]} ({', '.join(f'{name} {gain}' for name, gain in gains)})"
                       + (f"; telling it from 0 would need {_join(tell)}" if tell else "") + ".")
    diversity = entry.get("diversity", {})
    if diversity.get("undetermined") == "rounding":
        clauses.append("Diversity not compared: the Deep Ensemble's own diversity is at rounding level.")
    elif diversity.get("value") is not None and diversity["value"] > 1:
        clauses.append(drivers(diversity["drivers"]))
    return f"{label} ({counted(n, 'seed')}): " + " ".join(clauses)


def _outside(entry) -> str:
    """What a share outside 0–100 % means, said once for the method."""
    printed = [bound for key, _ in SHARES if entry.get(key, {}).get("value") is not None
               for bound in [entry[key]["value"], *(entry[key]["interval"] or [])]]
    notes = [*(["below 0 % is worse than the single model"] if printed and min(printed) < 0 else []),
             *(["above 100 % is more than the Deep Ensemble gains"] if printed and max(printed) > 1 else [])]
    text = "; ".join(notes)
    return f"{text[:1].upper()}{text[1:]}." if notes else ""


def _direction(found, subject: str) -> str:
    """"<subject> worse", "… better" or "… neither better nor worse by these seeds": where its interval lies."""
    low, high = found["interval"] or (None, None)
    return f"{subject} " + ("worse" if low is not None and low > 0 else "better" if high is not None and high < 0
                            else "neither better nor worse by these seeds")


def drivers(found: dict) -> str:
    """Why a diversity exceeds the Deep Ensemble's, from KL diversity = members' mean NLL − the NLL
    of their normalised geometric mean (analysis/gain.py): weaker members, or a better ensemble."""
    members, ensemble = found["member_nll_difference"], found["geometric_nll_difference"]
    member_words = _direction(members, "its members are individually")
    ensemble_words = _direction(ensemble, "its geometric-mean ensemble is")
    text = (f"Diversity above the Deep Ensemble's (KL diversity = members' mean NLL − NLL of their geometric mean): "
            f"{member_words} (member NLL {found['member_nll']['value']:.3f} vs {found['reference_member_nll']['value']:.3f}, "
            f"{_signed(members)}) and {ensemble_words} ({found['geometric_nll']['value']:.3f} vs "
            f"{found['reference_geometric_nll']['value']:.3f}, {_signed(ensemble)})")
    weaker, better = member_words.endswith(" worse"), ensemble_words.endswith(" is better")
    if better:
        return text + ": the extra diversity buys a better ensemble."
    if weaker:
        return text + ": the extra diversity makes up for weaker members, it is not a better ensemble."
    return text + ": what drives it is not settled by these seeds."


def _signed(found) -> str:
    return f"{found['value']:+.3f}" + _bounds(found["interval"], "{:+.3f}")


def how_to_read(entries: dict) -> str:
    """Once per report: the questions, the rule that answers them, the intervals, multiplicity."""
    seeds = sorted({entry["seeds"] for entry in entries.values()})
    questions = len({key for entry in entries.values() for key, _ in QUESTIONS if key in entry})
    answers = questions * len(entries)
    how = ("Fieller's interval for the ratio of means over seeds, widened by a paired bootstrap over seeds and test "
           "examples" if max(seeds) > 1 else "a paired bootstrap over test examples only (one seed: the "
           "seed-to-seed spread is unknown)")
    return (f"How to read: each question is a ratio to the Deep Ensemble — a share of its gain over the single model "
            f"(NLL and ECE on the test set, OOD AUROC, NLL under shift) or a multiple of its diversity. An answer needs the whole 95 % interval on one side: "
            f"at or above {ENSEMBLE_LIKE * 100:.0f} % like an ensemble, at or below {SINGLE_LIKE * 100:.0f} % like a "
            f"single model, wholly between them in between; otherwise not settled (too wide to say). Intervals: {how}. "
            f"Multiplicity: each answer stands at 95 % on its own, not corrected for the {answers} answers here "
            f"({questions} questions × {counted(len(entries), 'method')}); an overall line says "
            f"\"like an ensemble\" or \"like a single model\" only where its settled questions agree, and \"mixed\" "
            f"where they do not.")


WIDTH = 80
INDENT = "  "


def _wrap(line: str, width: int = WIDTH) -> list[str]:
    """The line wrapped at `width`, continuation lines indented."""
    first, *rest = wrapped(line, width).splitlines() or [""]
    return [first, *(INDENT + part for part in wrapped(" ".join(rest), width - len(INDENT)).splitlines())] \
        if rest else [first]


def _label(method: str, report: dict) -> str:
    """The method's name as the report built it (`labels`: every method it names)."""
    return report.get("labels", {}).get(method, method)


def method_lines(report: dict) -> list[str]:
    """One line per method, in the report's order: the verdict's overall line where there is one (it
    leads with the effective size), else the effective size alone."""
    verdicts, sizes = report.get("verdict") or {}, report.get("effective_size") or {}
    lines = []
    for method in dict.fromkeys([*report.get("methods", []), *sizes, *verdicts]):
        if verdicts.get(method, {}).get("answer"):
            lines.append(verdicts[method]["answer"])
        elif sizes.get(method):
            lines.append(size_line(_label(method, report), sizes[method]))
    return lines


def _overlapping(report: dict) -> str | None:
    """"Single and BatchEnsemble" (every method whose printed size's interval overlaps another's), or None."""
    sizes = report.get("effective_size") or {}
    printed = {method: found for method in sizes if (found := printed_size(sizes[method])) is not None}
    names = [_label(method, report) for method, (_, (low, high)) in printed.items()
             if any(other != method and low <= top and bottom <= high for other, (_, (bottom, top)) in printed.items())]
    return _join(names) if names else None


def to_summary(report: dict, written: str | None = None, width: int = WIDTH) -> str:
    """The short end of a run: a line of what ≡ means, one line per method, where the report is, and
    the one command that opens it (everything else is in the files)."""
    lines = method_lines(report)
    if any(" ≡ " in line for line in lines):
        seeds = len(report.get("seeds", []))
        lines.insert(0, f"{counted(seeds, 'seed')}; ≡: the Deep-Ensemble members that score as well "
                        "(calibrated NLL), 95 % interval; ratios to the Deep Ensemble answer the rest.")
    overlap = _overlapping(report)
    if overlap:
        lines.append(f"The sizes of {overlap}: their intervals overlap, so these seeds do not rank them.")
    if not report.get("verdict"):
        lines.append(f"No verdict: it needs a single model (`{BASELINE}`) and a Deep Ensemble (`{REFERENCE}`) beside "
                     "another method, with seeds in common.")
    run = PurePath(report["run"])
    if written and written.startswith("report.md"):
        lines += [f"Report: {run / 'report.md'} and {run / 'report.html'} (every table, figure and number behind "
                  "these lines)", f"Open it: python3 -m webbrowser {run / 'report.html'}"]
    elif written:
        lines.append(f"Report not written: {written}")
    return "".join(part + "\n" for line in lines for part in _wrap(sink.terminal(line), width))
