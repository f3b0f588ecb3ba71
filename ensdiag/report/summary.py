"""The first screen: what the main job ends with, in an 80 × 24 terminal.

    print(to_summary(report, written))    # `ensdiag report RUN --format summary`

One line per method, led by its effective ensemble size (effective_size.py: "BatchEnsemble (k = 4) ≡
a Deep Ensemble of 1.1 [1.0, 1.3] members"), then what the seeds settle and what would settle the
rest (verdict_text.answer); where the report is and the command that opens it. Lines are wrapped at
`WIDTH` with a hanging indent, never inside an interval; every table, figure and number behind them
is in the report.
"""

from pathlib import PurePath

from .. import text as sink
from ..console import wrapped
from ..seeds.stats import BASELINE, REFERENCE
from .verdict_text import _join, printed_size, size_line

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
        lines.insert(0, f"{sink.counted(seeds, 'seed')}; ≡: the Deep-Ensemble members that score as well "
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
