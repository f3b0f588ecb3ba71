"""A second, independent look at the cells a coverage record puts under its floor.

    python benchmarks/coverage_confirm.py benchmarks/results/coverage-<date>.json            # 800 more each
    python benchmarks/coverage_confirm.py RECORD --replicates 800 --jobs 2

A record tests some 2,000 (cell, column) pairs at 200 replicates each, so a column that covers at 95 %
falls under the floor (a binomial upper bound below 0.93, about 178 of 200) in a few of them by chance
alone. For every pair under the floor this draws `--replicates` fresh test sets of that cell (replicate
indices from `FIRST` on, which no round of the record draws), runs that column's analyzer alone on them
(the shared resamples and the columns are exactly those of the full run: the analyzers do not read each
other) and adds their tallies to the record's. A column that under-covers stays under: more replicates
only narrow its coverage's interval around its true value. One that fell under by chance comes back
above. The record lists each confirmation as a part (commit, cell, columns, replicate range, and the
fresh replicates' own tallies: the merged ones include the 200 that were picked for being low), the
docs table marks the confirmed cells, and a pair is confirmed once (a second run finds nothing to do).

The code must give the numbers the record's commits gave (checked as `--resume` checks it,
`coverage_resume.py`), and the record must hold the replicates it wants first.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interval_coverage as C  # noqa: E402
from coverage_resume import check_resumable, confirmed_pairs, head_commit, uncommitted  # noqa: E402

FIRST = 10**6  # confirmation replicates are drawn from here on: never a replicate of the record's rounds
REPLICATES = 800
FRESH = ("replicates", "covered", "truth_below", "truth_above", "coverage_interval")  # kept per confirmation


def under_floor(record: dict) -> list[tuple[str, int, str]]:
    """(population, N, column key) of every pair whose coverage's upper bound is below the record's floor
    and has not been confirmed yet."""
    confirmed = confirmed_pairs(record.get("parts", []))
    found = []
    for cell in record["cells"]:
        for key, column in cell["columns"].items():
            interval = column["ensdiag"].get("coverage_interval")
            if interval and interval[1] < record["settings"]["floor"] and \
                    (cell["population"], cell["n"], key) not in confirmed:
                found.append((cell["population"], cell["n"], key))
    return found


def analyzer_of(key: str) -> list[str]:
    """The predictions analyzers a column needs run (none for member geometry's columns, which every
    replicate computes)."""
    name = key.split("/")[0]
    return [] if key in C.MODEL_COLUMNS else [name]


def _job(args):
    population, n, keys, replicates, truths = args
    only = sorted({name for key in keys for name in analyzer_of(key)})
    columns = C.run_cell(population, n, replicates, truths, only)
    return population, n, keys, {key: columns[key] for key in keys}


def confirm(record: dict, pairs: list, replicates: int, jobs: int = 1) -> dict:
    """The record with `replicates` fresh replicates of each (population, N, column key) pair added to
    its tallies, and a part naming them (in place; returned)."""
    truths = {name: entry["truths"] for name, entry in record["populations"].items()}
    cells = {}
    for population, n, key in pairs:
        cells.setdefault((population, n), []).append(key)
    drawn = range(FIRST, FIRST + replicates)
    work = [(population, n, keys, drawn, truths[population]) for (population, n), keys in cells.items()]
    print(f"confirming {len(pairs)} (cell, column) pairs on {replicates} fresh replicates each: "
          + "; ".join(f"{population} N = {n}: {', '.join(keys)}" for (population, n), keys in cells.items()), flush=True)
    if jobs > 1:
        import multiprocessing
        with multiprocessing.get_context("spawn").Pool(min(jobs, len(work))) as pool:
            done = pool.map(_job, work, chunksize=1)
    else:
        done = [_job(job) for job in work]
    commit = head_commit()
    for population, n, keys, columns in done:
        cell = next(cell for cell in record["cells"] if cell["population"] == population and cell["n"] == n)
        cell["columns"].update(C.merge([{key: cell["columns"][key] for key in keys}, columns]))
        fresh = {key: {name: columns[key]["ensdiag"][name] for name in FRESH} for key in keys}  # apart from the low 200
        record["parts"].append({"commit": commit, "confirm": {"population": population, "n": n, "columns": keys,
                                                              "from": drawn.start, "to": drawn.stop, "fresh": fresh}})
        for key in keys:
            tally = cell["columns"][key]["ensdiag"]
            print(f"{population} N = {n} {key}: {tally['covered']} of {tally['replicates']} "
                  f"(upper bound {tally['coverage_interval'][1]:.3f})", flush=True)
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("--replicates", type=int, default=REPLICATES)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    record = json.loads(args.record.read_text())
    settings = record["settings"]
    reached = {n: max(part["to"][str(n)] for part in record["parts"] if "to" in part) for n in settings["sizes"]}
    if any(reached[n] < settings["replicates_wanted"] for n in settings["sizes"]):
        raise SystemExit(f"the record holds {reached} replicates per cell: finish it first (interval_coverage.py --resume)")
    if uncommitted():
        raise SystemExit("commit the code a record measures first: " + ", ".join(uncommitted()))
    pairs = under_floor(record)
    if not pairs:
        print("no (cell, column) under the floor is left unconfirmed")
        return
    check_resumable(argparse.Namespace(resume=args.record, sizes=settings["sizes"], populations=list(record["populations"]),
                                       truth_examples=settings["truth_examples"], only=settings["only"]))
    confirm(record, pairs, args.replicates, args.jobs)
    written = args.record.with_suffix(".json.tmp")
    written.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    written.replace(args.record)
    print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
