"""Every performance table in README.md and docs/*.md (docs/performance.md's, the coverage table in
docs/conventions.md), rendered from a committed record.

    python benchmarks/docs_tables.py            # rewrite every block from its record
    python benchmarks/docs_tables.py --check    # exit 1 and name the blocks that differ

A block is the text between `<!-- table KIND benchmarks/results/NAME.json -->` and
`<!-- end table -->`. KIND picks the renderer below; each block starts with the record's name
and the ensdiag version that wrote it. `tests/test_docs_numbers.py` renders every block
again and fails when one differs, or when its record was written by another ensdiag version
than the one installed: a table never outlives the code it measured.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", *sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")))  # wherever a block moves
BLOCK = re.compile(r"(<!-- table (\S+) (benchmarks/results/\S+\.json) -->\n)(.*?)(<!-- end table -->)", re.S)

LABELS = {"single": "single", "mc-dropout": "MC Dropout ({k} passes)", "deep-ensemble": "Deep Ensemble (k = {k})",
          "batch-ensemble": "BatchEnsemble (k = {k})",
          "batch-ensemble-channel": "BatchEnsemble channel (k = {k})", "batch-ensemble-kernel": "BatchEnsemble kernel (k = {k})",
          "packed-ensemble": "Packed-Ensembles (k = {k})", "mimo": "MIMO (k = {k})",
          "snapshot-ensemble": "Snapshot Ensemble (k = {k})", "checkpoint-ensemble": "Checkpoint Ensemble (k = {k})"}


def rate(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.0f} k" if value >= 1e3 else f"{value:.0f}"


def passes(value: float) -> str:
    return f"{value:.2g}" if value < 10 else f"{value:,.0f}"


def seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def source(record: dict, relative: str, document: str) -> str:
    """The line every table starts with: record, version, machine."""
    env = record["environment"]
    link = relative if document == "README.md" else f"../{relative}"
    device = env["device"] if env["device"] == "cpu" else f"{env['device']}: {env.get('device_name', 'a GPU')}"
    return (f"Record [`{Path(relative).name}`]({link}), ensdiag {env['ensdiag']}, torch {env['torch'].split('+')[0]}, "
            f"{env['cpu_count']}-core {env['cpu']} CPU ({device}).")


def methods(record: dict) -> list[str]:
    settings, ratios = record["settings"], record["ratios"]
    rounds = f"median of {settings['epochs']} rounds in which every method{' and the reference' if settings['reference'] else ''} take turns"
    extrapolated = next((row for row in record["methods"].values() if row["timed_batches"] < row["batches_per_epoch"]), None)
    lines = [f"{settings['arch']} protocol ({settings['train_size']:,} training images, batch {settings['batch_size']}, "
             f"{ {'sgd': 'SGD'}.get(settings['optimizer'], settings['optimizer'].capitalize())}), {rounds}"
             + (f"; epochs extrapolated from {extrapolated['timed_batches']} of {extrapolated['batches_per_epoch']} batches"
                if extrapolated else "") + ".", "",
             "| method | s/epoch | reference s/epoch | speed-up | inference images/s |", "|---|---|---|---|---|"]
    for name, row in record["methods"].items():
        reference = row.get("reference_seconds_per_epoch")
        speedup = f"{row['speedup']:.1f}×" if "speedup" in row else "–"
        lines.append(f"| {LABELS.get(name, name).format(k=row['members'])} | {seconds(row['seconds_per_epoch'])} | "
                     f"{seconds(reference) if reference else '–'} | {speedup} | {rate(row['inference_images_per_second'])} |")
    pairs = [(key, value) for key, value in ratios.items() if " / " in key]
    if pairs:
        lines += ["", "In the same record: " + "; ".join(f"{key.replace('batch-ensemble-channel', 'BatchEnsemble')} "
                                                          f"{value:.2f}×" for key, value in pairs) + "."]
    return lines


def strategies(record: dict) -> list[str]:
    lines = ["| strategy | s/epoch | inference images/s |", "|---|---|---|"]
    for name, row in record["strategies"].items():
        lines.append(f"| {name}{' (in use)' if name == record['strategy_in_use'] else ''} | "
                     f"{seconds(row['seconds_per_epoch'])} | {rate(row['inference_images_per_second'])} |")
    for name, why in record.get("strategies_skipped", {}).items():
        lines.append(f"| {name} | cannot run here: {why} | |")
    return lines


def tracking(record: dict) -> list[str]:
    lines = ["| method | s/epoch | s per row | row / epoch |", "|---|---|---|---|"]
    for name, row in record["methods"].items():
        if row.get("tracking_seconds") is not None:
            lines.append(f"| {LABELS.get(name, name).format(k=row['members'])} | {row['seconds_per_epoch']:.3f} | "
                         f"{row['tracking_seconds']:.2g} | {row['tracking_seconds'] / row['seconds_per_epoch']:.1%} |")
    return lines


def diagnose(record: dict) -> list[str]:
    settings, runs = record["settings"], record["methods"]
    lines = [f"{settings['arch']}, k = {settings['members']}, {settings['test_size']:,} synthetic images in each of the "
             f"id, shift, OOD and validation splits, {settings['train_size']:,} training images, paths on "
             f"{settings['path_pairs']} pair{'s' * (settings['path_pairs'] != 1)} × {settings['path_points']} points; median of {settings['rounds']} "
             f"round{'s' * (settings['rounds'] > 1)} in which every step takes turns. Cells: seconds (evaluation passes, "
             "the first row's seconds being 1).", "",
             "| step | " + " | ".join(LABELS.get(run, run).format(k=row["members"]) for run, row in runs.items()) + " |",
             "|---|" + "---|" * len(runs)]
    steps = list(dict.fromkeys(step for row in runs.values() for step in row["steps"]))
    for step in steps:
        cells = [f"{seconds(found['seconds'])} ({passes(found['passes'])})" if (found := row["steps"].get(step)) else "–"
                 for row in runs.values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append("| **diagnosis, all but the first row** | " + " | ".join(
        f"**{seconds(row['diagnosis_seconds'])} ({passes(row['diagnosis_passes'])})**" for row in runs.values()) + " |")
    estimates = [(run, row["estimate"]) for run, row in runs.items() if row.get("estimate")]
    if estimates:
        lines += ["", "The whole diagnosis at 10,000 images per split, estimated: " + "; ".join(
            f"{LABELS.get(run, run).format(k=runs[run]['members'])} ≈ {estimate['seconds'] / 60:.1f} min"
            for run, estimate in estimates) + f" ({estimates[0][1]['how']})."]
    return lines


def report(record: dict) -> list[str]:
    found = record["report"]
    unit = record["methods"][found["unit_method"]]["steps"]["predict id"]["seconds"]
    lines = [f"The report of a folder of {found['runs']} runs (every method × {record['settings']['seeds']} seeds); "
             f"passes are multiples of the {LABELS.get(found['unit_method'], found['unit_method']).format(k=record['settings']['members'])}'s "
             f"evaluation pass ({seconds(unit)} s).", "", "| step | s | passes |", "|---|---|---|"]
    for step, row in found["steps"].items():
        lines.append(f"| {step.removeprefix('report ')} | {seconds(row['seconds'])} | {passes(row['passes'])} |")
    return lines


def peer(record: dict) -> list[str]:
    lines = [f"{record['protocol']}; median of {record['rounds']} rounds in which every trainer takes turns.", "",
             "| trainer | s/epoch | ensdiag / it |", "|---|---|---|"]
    for name, row in record["trainers"].items():
        ratio = f"{row['ensdiag_ratio']:.2f}×" if row.get("ensdiag_ratio") else "–"
        lines.append(f"| {name} | {row['seconds_per_epoch']:.3f} | {ratio} |")
    return lines


def denormals(record: dict) -> list[str]:
    median, settings = record["median"], record["settings"]
    return [f"The mnist protocol's BatchEnsemble MLP after {settings['epochs']} epochs without flushing; medians of "
            f"{settings['repeats']}, kept and flushed alternating in one process.", "",
            "| | subnormals kept | flushed | flushed / kept |", "|---|---|---|---|",
            f"| parameters that are subnormal | {record['subnormal_parameters']:,} of {record['parameters']:,} | | |",
            f"| inference, images/s | {median['inference images/s, kept']:,.0f} | {median['inference images/s, flushed']:,.0f} | "
            f"{record['inference speed-up from flushing']:.2f}× |",
            f"| training epoch, s | {median['training epoch s, kept']:.3f} | {median['training epoch s, flushed']:.3f} | "
            f"{1 / record['training speed-up from flushing']:.2f}× |"]


def _step_row(step: dict) -> str:
    """One step of a budgeted diagnosis: what it read, its seconds, the precision it reached."""
    name, n = step["step"], step.get("n")
    if isinstance(n, dict):  # CKA: examples per split
        read = ", ".join(f"{split} {count:,}" for split, count in n.items())
        widths = step.get("half_width") or {}
        reached = ", ".join(f"{split} ±{width:.2g}" for split, width in widths.items() if width is not None)
    elif name == "paths":
        read = f"{step['pairs']} pair{'s' * (step['pairs'] != 1)} × {'/'.join(map(str, step['points']))} points × {n:,} test images"
        reached = f"test-loss barrier ±{step['half_width']:.2g}" if step.get("half_width") is not None else ""
    elif n is not None:
        read = f"{n:,} of {step['of']:,} ({step['stopped']})" if step.get("of") else f"{n:,}"
        reached = f"±{step['half_width']:.2g} ({step['column']})" if step.get("half_width") is not None else ""
    else:
        read, reached = "weights only" if name in ("alignment", "rank-structure") else "", ""
    return f"| {name} | {read} | {seconds(step['seconds'])} | {reached} |"


def budgeted(record: dict) -> list[str]:
    settings, lines = record["settings"], []
    for run, row in record["methods"].items():
        found = row["budget"]
        load = row["load_average"]
        lines += [f"{settings['arch']}, {LABELS.get(run, run).format(k=row['members'])}, {settings['test_size']:,} synthetic "
                  f"images in each of the id, shift, OOD and validation splits, {settings['train_size']:,} training images, "
                  f"a budget of {settings['budget']}: the diagnosis took **{row['wall_seconds'] / 60:.1f} min**; the same "
                  f"diagnosis on every example would take **≈ {found['full_estimate_seconds'] / 60:.0f} min** (from the "
                  f"costs this run measured). Load average over 1, 5 and 15 minutes: {', '.join(map(str, load['before']))} "
                  f"before, {', '.join(map(str, load['after']))} after.", "",
                  "| step | read | s | widest 95 % interval reached |", "|---|---|---|---|"]
        lines += [_step_row(step) for step in found["steps"]]
        if found["skipped"]:
            lines += ["", "Skipped: " + "; ".join(f"{name} ({reason})" for name, reason in found["skipped"].items()) + "."]
        lines += ["", "| headline number | value [95 % interval over the examples] (n) |", "|---|---|"]
        for name, number in row["headline"].items():
            interval = (f" [{number['low']:.3g}, {number['high']:.3g}] (n = {number['n']:,})"
                        if number.get("low") is not None and number.get("n") else "")
            lines.append(f"| {name} | {number['value']:.3g}{interval} |")
    return lines


def lm_eval_scale(record: dict) -> list[str]:
    """`benchmarks/lm_eval_scale.py`: each step of reading and analysing lm-eval logs against parsing them."""
    settings, seconds, ratio = record["settings"], record["seconds"], record["ratio_to_parse"]
    load = record["load_average"]
    lines = [f"{settings['members']} members × {settings['questions']:,} four-choice questions in {settings['subtasks']} "
             f"subtasks (MMLU's test sizes, lm-eval 0.4.13's nested group layout, synthetic lines): "
             f"{settings['lines']:,} lines, {settings['bytes'] / 1e6:.0f} MB; median of {settings['rounds']} rounds taken "
             f"in turn; load average {load['before'][0]:.2f} before and {load['after'][0]:.2f} after (the machine is "
             f"shared), torch {record['torch_threads']} thread(s)"
             + (f", the files read by {record['reader_processes']} processes" if "reader_processes" in record else "")
             + f"; peak memory {record['peak_memory_bytes'] / 2**30:.1f} GiB.",
             "", "| step | seconds | × parse (target 3×) |", "|---|---|---|",
             f"| parse the JSON lines alone (`json.loads`, the floor) | {seconds['parse']:.2f} | 1× |",
             f"| read: lines checked, answers read and checked as lm-eval scored them, members joined, groups "
             f"aggregated with intervals | {seconds['read']:.2f} | {ratio['read']:.1f}× |",
             f"| + every analyzer, pooled and per subtask ({record['splits_analysed']} splits; conformal sets included) "
             f"| {seconds['analyzers']:.2f} | {ratio['read_and_analyzers']:.1f}× |",
             f"| + the core's intervals of the headline numbers{'' if 'analyze' in seconds else ': all of `ensdiag analyze`'} "
             f"| {seconds['intervals']:.2f} | {ratio['read_analyzers_and_intervals']:.1f}× |"]
    if "analyze" in seconds:
        lines.append(f"| read, then analyzers and intervals as `ensdiag analyze` runs them (each analyzer with its intervals, "
                     f"{record['analyzer_processes']} processes; the same metrics): all of `ensdiag analyze` | "
                     f"{seconds['read'] + seconds['analyze']:.2f} | {ratio['read_and_analyze']:.1f}× |")
    return lines


def main_job(record: dict) -> list[str]:
    """`ensdiag bench --main-job`: the README's main job per round, then its targets met or not."""
    settings, summary = record["settings"], record["summary"]
    lines = [f"The README's main job as a user runs it, {len(record['rounds'])} rounds (the first from an empty data "
             f"cache); `diversity` of the grid's Deep Ensemble within `--budget {settings['budget']}`. Load average "
             "before each round in the last column (the machine is shared).", "",
             "| round | grid s | training s | diagnosis s (× training) | report s (× training) | report, figures redrawn, s "
             "| diversity s / budget | load |", "|---|---|---|---|---|---|---|---|"]
    for found in record["rounds"]:
        budget = found["budget"]
        lines.append(f"| {found['round'] + 1} ({found['cache']} cache) | {found['grid_seconds']:.1f} | "
                     f"{found['training_seconds']:.1f} | {found['diagnosis_seconds']:.1f} ({found['diagnosis_to_training']:.2f}×) "
                     f"| {found['report_seconds']:.1f} ({found['report_to_training']:.2f}×) | {found['report_cold_seconds']:.1f} "
                     f"| {budget['wall_seconds']:.0f} / {budget['asked_seconds']:.0f} | {found['load_average']['before'][0]:.2f} |")
    lines += ["", "| target (medians of the warm rounds) | measured | met |", "|---|---|---|"]
    measured = [f"{summary['diagnosis_to_training']:.2f}× (worst run {summary['worst_run_diagnosis_to_training']:.2f}×)",
                f"{summary['grid_seconds']:.1f} s (first round {summary['first_round_grid_seconds']:.1f} s)",
                f"{summary['report_to_training']:.2f}×", f"{summary['budget_wall_to_budget']:.2f}× the budget"]
    for (name, met), value in zip(record["targets"].items(), measured):
        lines.append(f"| {name} | {value} | {'yes' if met else '**no**'} |")
    return lines


def contention(record: dict) -> list[str]:
    """`benchmarks/contention.py`: each job's seconds per condition and their ratio to idle, then the targets."""
    settings, found, ratios = record["settings"], record["conditions"], record["ratios"]
    names = list(found)
    jobs = {job: result for job, result in found[names[0]].items()}
    threads = "; ".join(f"{job}: " + ", ".join(f"{count} ({origin})" for count, origin in result["threads"])
                        for job, result in jobs.items() if result.get("threads"))
    loads = ", ".join(f"{result['load_before']:.2f}" for result in jobs.values())
    lines = [f"Each job as separate `ensdiag` processes, {settings['rounds']} round{'s' * (settings['rounds'] != 1)} of "
             f"every condition in turn (medians); the other PyTorch job multiplies 512×512 matrices with torch's default "
             f"threads; load average before each idle job {loads}"
             + (f"; the jobs' threads (who chose): {threads}" if threads else "")
             + (f"; the jobs' environment: {', '.join(f'{k}={v}' for k, v in settings['env'].items())}" if settings["env"] else "")
             + ".", "", "| job | " + " | ".join(f"{name} s" + ("" if name == names[0] else " (× idle)") for name in names) + " |",
             "|---|" + "---|" * len(names)]
    for job in jobs:
        for key, label in (("seconds", "end to end"), ("train_seconds", "training (meta.json)"),
                           ("diagnosis_seconds", "diagnosis (meta.json)")):
            if key not in jobs[job]:
                continue
            cells = [f"{found[name][job][key]:.1f}" + ("" if name == names[0] else f" ({ratios[name][job][key]:.1f}×)")
                     for name in names]
            lines.append(f"| {job}, {label} | " + " | ".join(cells) + " |")
    lines += ["", "| target | met |", "|---|---|"] + [f"| {name} | {'yes' if met else '**no**'} |"
                                                      for name, met in record["targets"].items()]
    return lines


def _coverage_cell(tally: dict, floor: float) -> str:
    """"0.95 [0.90, 0.98] ±0.012" of one cell's tally ("–" without a truth); ✗ where it fails the floor."""
    if tally is None or tally.get("covered") is None or not tally["replicates"]:
        return "–"
    low, high = tally["coverage_interval"]
    mark = " ✗" if high < floor else ""
    return f"{tally['covered'] / tally['replicates']:.2f} [{low:.2f}, {high:.2f}] ±{tally['half_width']:.3g}{mark}"


def _fresh(tally: dict | None) -> str:
    """" (the fresh replicates alone: 747 of 800, 0.93 [0.91, 0.95])" of a confirmation's own tally."""
    if not tally:
        return ""
    low, high = tally["coverage_interval"]
    return (f" (the fresh replicates alone: {tally['covered']} of {tally['replicates']}, "
            f"{tally['covered'] / tally['replicates']:.3f} [{low:.3f}, {high:.3f}])")


def coverage(record: dict) -> list[str]:
    """`benchmarks/interval_coverage.py`: per column, its worst cell at each N (the population whose coverage's
    binomial upper bound is lowest), and on which side the misses fell over every cell."""
    settings, cells = record["settings"], record["cells"]
    sizes, floor = settings["sizes"], settings["floor"]
    confirmations = [part["confirm"] for part in record.get("parts", []) if "confirm" in part]
    confirmed = {(c["population"], c["n"], key): c["to"] - c["from"] for c in confirmations for key in c["columns"]}
    drawn = lambda cell: max(max([column["ensdiag"]["replicates"]] + [c["replicates"] for c in column["candidates"].values()])  # noqa: E731
                             for key, column in cell["columns"].items() if (cell["population"], cell["n"], key) not in confirmed)
    counts = {n: sorted({drawn(cell) for cell in cells if cell["n"] == n}) or [0] for n in sizes}
    replicates = ", ".join(f"{counts[n][0] if counts[n][0] == counts[n][-1] else f'{counts[n][0]}–{counts[n][-1]}'} "
                           f"at N = {n:,}" for n in sizes)
    lines = [f"{len(record['populations'])} populations ({', '.join(record['populations'])}; `benchmarks/"
             f"coverage_populations.py`), replicates per cell: {replicates} (the issue asks for "
             f"{settings['replicates_wanted']}); truths from {settings['truth_examples']:,} examples per split. Each "
             f"cell: coverage of the printed 95 % interval [its Clopper–Pearson 95 % interval] ±its mean half-width, "
             f"at the population where the upper bound is lowest (replicates without an interval, which say why, are "
             f"not counted; \"none in …\": populations where no replicate had one); ✗: the upper bound below {floor}. "
             f"Misses: replicates whose interval lay above the truth / below it, over every cell."
             + (" †: a cell under the floor in the record's rounds, confirmed on fresh replicates of its column "
                "(`benchmarks/coverage_confirm.py`), its coverage over all its replicates: "
                + "; ".join(f"{c['population']} N = {c['n']:,}, {c['to'] - c['from']:,} more of "
                            + ", ".join(f"`{key.removesuffix('/value')}`" + _fresh(c.get("fresh", {}).get(key))
                                        for key in c["columns"]) for c in confirmations)
                + "." if confirmations else ""), "",
             "| column | " + " | ".join(f"N = {n:,}" for n in sizes) + " | misses (truth below / above) |",
             "|---|" + "---|" * len(sizes) + "---|"]
    keys = dict.fromkeys(key for cell in cells for key in cell["columns"])
    for key in sorted(keys):
        found = [(cell, cell["columns"][key]) for cell in cells if key in cell["columns"]]
        notes = sorted({note for _, column in found for note in column["notes"]})
        if all(not column["ensdiag"]["replicates"] for _, column in found):
            lines.append(f"| `{key.removesuffix('/value')}` | " + " | ".join("no interval" for _ in sizes)
                         + f" | {(notes[0].split(':')[0] + ' (why: the next table)') if notes else 'none, no reason'} |")
            continue
        row = []
        for n in sizes:
            here = [(cell, column) for cell, column in found if cell["n"] == n and column["ensdiag"].get("covered") is not None
                    and column["ensdiag"]["replicates"]]
            if not here:
                row.append("–")
                continue
            cell, column = min(here, key=lambda pair: pair[1]["ensdiag"]["coverage_interval"][1])
            none = [other["population"] for other, found_column in found if other["n"] == n
                    and not found_column["ensdiag"]["replicates"] and found_column["notes"]]
            mark = f" † of {column['ensdiag']['replicates']:,}" if (cell["population"], n, key) in confirmed else ""
            row.append(f"{_coverage_cell(column['ensdiag'], floor)}{mark} ({cell['population']})"
                       + (f"; none in {', '.join(none)}" if none else ""))
        below = sum(column["ensdiag"].get("truth_below") or 0 for _, column in found)
        above = sum(column["ensdiag"].get("truth_above") or 0 for _, column in found)
        lines.append(f"| `{key.removesuffix('/value')}` | " + " | ".join(row) + f" | {below} / {above} |")
    lines += ["", "Why each column with a construction of its own has it: the worst cell's coverage of every construction "
              "built from the same resamples (`… ∪ percentile`: the hull with the percentile interval and the value, "
              "what ensdiag prints for a folded or bias-corrected statistic; `logit`, `logit-debiased`: on the logit "
              "scale, without the exact bound ensdiag adds at 0 or 1; the MCE: none printed; the FPR95s' binomial hull "
              "is the first table's).", "",
              "| column | " + " | ".join(sorted({name for cell in cells for column in cell["columns"].values()
                                                   for name in column["candidates"]} - {"bc"})) + " |"]
    names = sorted({name for cell in cells for column in cell["columns"].values() for name in column["candidates"]} - {"bc"})
    lines.append("|---|" + "---|" * len(names))
    for key in sorted(keys):
        found = [cell["columns"][key] for cell in cells if key in cell["columns"]]
        if not any("ray" in column["candidates"] or column["ensdiag"]["replicates"] == 0
                   or any(word in (column.get("construction") or "") for word in ("basic", "logit", "Clopper"))
                   for column in found):
            continue
        row = []
        for name in names:
            tallies = [column["candidates"][name] for column in found if name in column["candidates"]
                       and column["candidates"][name].get("covered") is not None and column["candidates"][name]["replicates"]]
            if not tallies:
                row.append("–")
                continue
            worst = min(tallies, key=lambda tally: tally["coverage_interval"][1])
            row.append(f"{worst['covered'] / worst['replicates']:.2f}" + (" ✗" if worst["coverage_interval"][1] < floor else ""))
        lines.append(f"| `{key.removesuffix('/value')}` | " + " | ".join(row) + " |")
    return lines


def _holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (each test's own, for its place in the family)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def member_protocol(record: dict) -> list[str]:
    """`benchmarks/member_protocol.py`: the Deep Ensemble's members against the single runs, per grid."""
    rows = [(name, label, grid[key]) for name, grid in record["grids"].items()
            for key, label in (("nll", "NLL"), ("accuracy", "accuracy"))]
    holm = iter(_holm([found[test]["p"] for _, _, found in rows for test in ("welch", "paired")]))
    lines = ["Test-set NLL and accuracy of the `single` runs and of every Deep-Ensemble member (digits preset; mean ± "
             "standard deviation, count), with Welch's t-test of the two groups and the paired t-test over seeds of "
             f"each single run against its seed's mean member; in brackets, Holm's adjustment over all {2 * len(rows)} "
             "tests of the table:", "",
             "| grid | quantity | single runs | Deep-Ensemble members | Welch p | paired p |", "|---|---|---|---|---|---|"]
    for name, label, found in rows:
        single, members = found["single"], found["members"]
        tests = [f"{found[test]['p']:.2f} [{next(holm):.2f}]" for test in ("welch", "paired")]
        lines.append(f"| {name} | {label} | {single['mean']:.4f} ± {single['sd']:.4f} (n = {single['n']}) | "
                     f"{members['mean']:.4f} ± {members['sd']:.4f} (n = {members['n']}) | {tests[0]} | {tests[1]} |")
    return lines


def mce_bias(record: dict) -> list[str]:
    """`benchmarks/mce_bias.py`: the mean MCE on test sets of N examples against the population's MCE."""
    lines = [f"The MCE read on test sets drawn from the coverage suite's known populations (mean of "
             f"{record['replicates']} test sets) against each population's own MCE:", "",
             "| population | N | population's MCE | mean MCE read | ratio |", "|---|---|---|---|---|"]
    for row in record["rows"]:
        ratio = f"{row['ratio']:.1f}×" if row["ratio"] is not None else "–"
        lines.append(f"| {row['population']} | {row['n']:,} | {row['truth']:.3f} | {row['mean']:.3f} | {ratio} |")
    return lines


RENDERERS = {"contention": contention, "coverage": coverage, "member-protocol": member_protocol, "mce-bias": mce_bias, "budgeted": budgeted, "lm-eval-scale": lm_eval_scale, "main-job": main_job, "denormals": denormals, "methods": methods, "strategies": strategies, "tracking": tracking, "diagnose": diagnose, "report": report,
             "peer": peer}


def render(kind: str, relative: str, document: str) -> str:
    record = json.loads((ROOT / relative).read_text())
    return "\n".join([source(record, relative, document), "", *RENDERERS[kind](record)]) + "\n"


def blocks(document: str):
    """(kind, record path, text now in the document) of every block."""
    text = (ROOT / document).read_text()
    return [(match.group(2), match.group(3), match.group(4)) for match in BLOCK.finditer(text)]


def rewrite(document: str) -> bool:
    path = ROOT / document
    text = path.read_text()
    new = BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3), document) + m.group(5), text)
    path.write_text(new)
    return new != text


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        stale = [f"{document}: {kind} {relative}" for document in DOCUMENTS
                 for kind, relative, text in blocks(document) if render(kind, relative, document) != text]
        print("\n".join(stale) or "every table matches its record")
        sys.exit(1 if stale else 0)
    for document in DOCUMENTS:
        print(f"{document}: {'rewritten' if rewrite(document) else 'unchanged'}")
