"""Reports: the paper's tables (mean ± 95 % CI over seeds) and figures from any run folder.

    report = make_report("runs/digits-20261121-120000")      # tables + figures/, report.md, report.html
    print(render(report, "markdown"))
"""

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from .. import forked
from ..errors import EnsdiagError, path_argument, public
from ..export import REPORT_FIELDS, frame, report_rows
from ..io import atomic_write_text, plain_file
from ..layout import DEFAULT_SCORE
from .cached import kept_report
from .figures import (Drawn, heatmap_grid, ood_histogram_figure, reliability_figure, risk_coverage_figure, save_figure,
                      smooth_reliability_figure, training_curves_figure)
from .geometry_figures import add_pair_figures, add_report_figures, disagreement_panels
from .load import dig, first_ran, first_run, load_runs, newest_run
from .lora import add_lora_figures
from .merge import load_folders
from .render import FORMATS, render, to_html, to_markdown, to_rich  # noqa: F401


MAX_WORKERS = 4  # beyond this the figures' sizes, not the cores, decide the time
LAYOUT_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)


@dataclass
class Job:
    name: str  # the file stem under figures/
    draw: object  # draw(*inputs) -> matplotlib Figure
    inputs: tuple
    damaged: object = None  # () -> the EnsdiagError naming the run file whose layout was wrong, or None


class _LayoutError(Exception):
    """A figure's inputs were not of the layout its drawing expects (the original error's text)."""


def _draw(job: Job, folder: Path, formats) -> None:
    try:
        figure = job.draw(*job.inputs)
    except EnsdiagError:
        raise
    except LAYOUT_ERRORS as error:
        raise _LayoutError(f"{type(error).__name__}: {error}") from None
    save_figure(figure, folder / job.name, formats=formats)


def draw_all(jobs: list[Job], folder: Path, formats, done) -> None:
    """Draw every job into `folder` in each of `formats`; `done(job)` after each one's files are
    written. Every job is drawn; then the first failure, in the order given, is raised: for a layout
    error, the job's damaged-file error where it has one. Matplotlib's Agg rendering holds the
    interpreter (threads would take turns), so the figures are spread over forked worker processes
    (`ensdiag/forked.py`: the jobs are never pickled; one figure, one core or a platform whose `fork`
    is not safe draws them in the report's own process, and so does any job of a worker that died)."""
    workers = forked.workers(len(jobs), MAX_WORKERS)
    if workers > 1:  # imported once here, before the fork, not once in every worker (a third of a second each)
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    outcomes = forked.run([partial(_draw, job, folder, formats) for job in jobs], workers,
                          each=lambda index, outcome: done(jobs[index]) if outcome[0] else None)
    job, error = next(((job, error) for job, (ok, error) in zip(jobs, outcomes) if not ok), (None, None))
    if isinstance(error, _LayoutError):
        error = job.damaged() if job.damaged is not None else TypeError(str(error))
    if error is not None:
        raise error from None


def make_figures(report: dict, runs: dict, run_dir: Path, svg: bool = False, ood_score: str = "msp",
                 detail: bool = False) -> list[dict]:
    """Write figures/*.png (and .svg with `svg`) into the run folder; return their entries (paths
    relative to it). Each figure is drawn once per format asked for: SVG doubles the cost, so it
    is drawn only on request (`report --svg`), and so are the detail catalogue's figures (`detail`:
    member-pair matrices, CKA heatmaps per layer, SmoothECE curves; `report["figures_on_request"]`
    names those left out). A figure whose inputs are what they were when its files were drawn is
    not drawn again (`Drawn`: the report after `train`, or a second report)."""
    folder = Path(run_dir) / "figures"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):  # never write through a link out of the run
        raise EnsdiagError(f"{folder} is a link or a file, not a folder of the run: ensdiag writes figures only inside "
                           "the run folder; remove it (or pass --no-figures)")
    folder.mkdir(exist_ok=True)
    figures, drawn, formats, jobs = [], Drawn(folder), ("png", "svg") if svg else ("png",), []
    report["figures_on_request"] = []

    def add(name, title, draw, *inputs, damaged=None, on_request=False):
        """Figure `name`, `draw(*inputs)`, to be drawn (`draw_all`) unless its files were drawn from
        these very inputs; `damaged()`: the error a layout error in drawing it means; `on_request`:
        a detail figure, drawn only with `detail`."""
        if on_request and not detail:
            report["figures_on_request"].append(title)
            return
        if drawn.stale(name, formats, inputs):
            jobs.append(Job(name, draw, inputs, damaged))
        figures.append({"name": name, "title": title, "png": f"figures/{name}.png",
                        "svg": f"figures/{name}.svg" if svg else None})

    rows = []  # Figure 2: disagreement per split + weight cosine, one row per ensemble method
    for method, (seed, run) in first_ran(runs, "disagreement").items():  # members that can disagree (the others skip it)
        analyzers = run["metrics"]["analyzers"]
        panels, cosine = disagreement_panels(analyzers, ("id", "shift", "ood"))
        if cosine is not None:
            scoped = isinstance(dig(analyzers, ("weight-similarity", "scope")), str)  # members share the rest
            initial = dig(analyzers, ("weight-similarity", "initial", "value"))
            at_init = f" (init {initial:.2f})" if isinstance(initial, float) else ""
            panels.append((("weight cosine (own layers)" if scoped else "weight cosine") + at_init, cosine, "cosine"))
        if panels:  # (k > 256 stores no matrix)
            rows.append((f"{report['labels'][method]} (seed {seed})", panels))
    if rows:
        add("diversity", "Member disagreement per split and weight-space cosine (a labelled colour scale each)",
            heatmap_grid, rows)
    curves = []
    for method, seeds in runs.items():
        bins = [found for run in seeds.values() if run
                and (found := dig(run["metrics"], ("analyzers", "calibration", "splits", "id", "ece", "bins")))]
        if bins:  # pool the seeds' bins: counts add, accuracy/confidence weighted by count
            count = [sum(b["count"][i] for b in bins) for i in range(len(bins[0]["count"]))]
            pooled = {"lower": bins[0]["lower"], "upper": bins[0]["upper"], "count": count}
            for key in ("accuracy", "confidence"):
                pooled[key] = [sum(b[key][i] * b["count"][i] for b in bins) / count[i] if count[i] else 0.0 for i in range(len(count))]
            curves.append((method, pooled))
    if curves:
        add("reliability", "Reliability diagrams on the in-distribution test set (seeds pooled)", reliability_figure, curves)
    smooth, selective = [], []  # the first finished seed's SmoothECE curve and risk–coverage, in-distribution
    for method, seeds in runs.items():
        _, run = first_run(seeds)
        found = dig(run["metrics"], ("analyzers", "calibration", "splits", "id", "smooth_ece")) if run else None
        curve = found.get("curve") if isinstance(found, dict) else None
        if isinstance(curve, dict) and all(isinstance(curve.get(key), list) for key in ("confidence", "accuracy", "density")):
            smooth.append((method, curve, found.get("value"), found.get("bandwidth")))
        curve = dig(run["metrics"], ("analyzers", "selective", "splits", "id", "curve")) if run else None
        if isinstance(curve, dict) and curve.get("coverage") and curve.get("risk"):
            selective.append((method, curve))
    if smooth:
        add("smooth-reliability", "SmoothECE reliability curves on the in-distribution test set: kernel-smoothed "
            "accuracy at the bandwidth σ* = smECE (first seed)", smooth_reliability_figure, smooth, on_request=True)
    if "ood" not in report["skipped_splits"]:
        from .ood_score import TITLES, histograms  # (the scores of the predictions: torch)
        panels = histograms(runs, report.get("damaged_runs", {}), ood_score)
        if panels:
            add("ood-scores", f"Histograms of the OOD score {TITLES[ood_score]} on ID and OOD data (first seed)",
                ood_histogram_figure, panels, TITLES[ood_score], (0, 1) if ood_score == "msp" else None)
    if selective:
        add("risk-coverage", "Risk–coverage on the in-distribution test set (first seed; AURC is the area)",
            risk_coverage_figure, selective)
    add_pair_figures(runs, add, report["labels"])
    add_report_figures(runs, add, report["labels"])
    add_lora_figures(runs, add, report["labels"])
    histories = {method: found for method, seeds in runs.items()
                 if (found := [run["history"] for run in seeds.values() if run and run["history"]])}
    if histories:
        add("training", "Training loss and validation accuracy per epoch (every seed)", training_curves_figure,
            histories)
    draw_all(jobs, folder, formats, lambda job: drawn.done(job.name, formats, job.inputs))
    return figures


@public
def make_report(run_dir=None, reference=None, write=True, conventions="ensdiag", svg=False, ood_score=None,
                detail=False) -> dict:
    """Build the report of a run folder, or of several (a list: merged as merge.py says, and none of
    them written to); with `write`, rebuild the run folder's figures/, report.md and report.html
    (`detail`: the detail catalogue's figures too).

    Without `write` nothing in the run folder changes (its existing report stays as it was). A
    run folder that cannot be written to is reported all the same: `report["written"]` then
    says why nothing was written there."""
    if isinstance(run_dir, (list, tuple)):  # one folder, or several (merge.py): none of them written to
        run_dir = [path_argument(folder, "run folder") for folder in run_dir]
    if isinstance(run_dir, list) and len(run_dir) > 1:
        from .aggregate import build_report
        data = load_folders(run_dir)
        report = build_report(" + ".join(str(folder) for folder in run_dir), reference, data, conventions, ood_score)
        report["written"] = ("several run folders: none of them was changed (`ensdiag report FOLDER` rebuilds one "
                             "folder's report.md, report.html and figures/)") if write else None
        return report
    if isinstance(run_dir, list):
        run_dir = run_dir[0] if run_dir else None
    run_dir = path_argument(run_dir, "run folder") if run_dir is not None else newest_run()
    writable = write and os.access(run_dir, os.W_OK)
    options = {"run": str(run_dir), "reference": reference, "conventions": conventions, "svg": svg,
               "ood_score": ood_score or DEFAULT_SCORE, "detail": detail}

    def build() -> dict:
        from .aggregate import build_report
        data = load_runs(run_dir)
        built = build_report(run_dir, reference, data, conventions, ood_score)
        if writable:
            built["figures"] = make_figures(built, data["runs"], run_dir, svg, built["ood_score"], detail)
        return built
    # built from these very files before, its figures on disk: read back, not built again
    report = kept_report(run_dir, options, build, lambda kept: _figures_on_disk(kept, run_dir)) if writable else build()
    report["written"] = None
    if write and not writable:
        report["written"] = f"{run_dir} is not writable: its report.md, report.html and figures/ were left as they were"
    elif write:
        atomic_write_text(run_dir / "report.md", to_markdown(report))
        atomic_write_text(run_dir / "report.html", to_html(report, run_dir))
        report["written"] = f"report.md, report.html and figures/ written to {run_dir}"
    return report


def _figures_on_disk(report: dict, run_dir: Path) -> bool:
    """Every figure file a cached report names is in the run folder, a file of its own, not a link (else it
    is drawn again)."""
    figures = report.get("figures")
    return isinstance(figures, list) and all(
        isinstance(figure, dict) and all(plain_file(run_dir / name) for key in ("png", "svg")
                                         if isinstance(name := figure.get(key), str)) for figure in figures)


@public
def report_frame(run_dirs):
    """A DataFrame of one or more run folders' reports (the long rows of `report_rows`)."""
    return frame(report_rows(make_report(run_dirs, write=False)), REPORT_FIELDS)


def __getattr__(name):
    if name == "build_report":  # (building a report imports torch; reading one back does not)
        from .aggregate import build_report
        return build_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMATS", "build_report", "make_report", "newest_run", "render", "report_frame", "to_rich"]
