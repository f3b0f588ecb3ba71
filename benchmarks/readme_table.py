"""The README's performance table, rendered from one `ensdiag bench` record.

    python benchmarks/readme_table.py benchmarks/results/bench-mlp-cpu-<time>.json

prints the Markdown block that the README carries between its "performance table" markers;
`tests/test_docs_numbers.py` renders it again from the record the README names and compares,
and fails when that record was written by another ensdiag version than the one installed.
"""

import json
import sys
from pathlib import Path

LABELS = {"single": "single", "mc-dropout": "MC Dropout ({k} passes)", "deep-ensemble": "Deep Ensemble (k = {k})",
          "batch-ensemble-channel": "BatchEnsemble channel (k = {k})", "batch-ensemble-kernel": "BatchEnsemble kernel (k = {k})",
          "packed-ensemble": "Packed-Ensembles (k = {k})", "mimo": "MIMO (k = {k})",
          "snapshot-ensemble": "Snapshot Ensemble (k = {k})", "checkpoint-ensemble": "Checkpoint Ensemble (k = {k})"}


def rate(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.0f} k"


def render(path) -> str:
    record = json.loads(Path(path).read_text())
    settings, environment, ratios = record["settings"], record["environment"], record["ratios"]
    lines = [f"Record [`{Path(path).name}`](benchmarks/results/{Path(path).name}), ensdiag {environment['ensdiag']}, "
             f"torch {environment['torch'].split('+')[0]}, {environment['cpu_count']}-core {environment['cpu']} CPU; "
             f"{settings['arch']} protocol ({settings['train_size']:,} training images, batch {settings['batch_size']}, "
             f"{settings['optimizer'].capitalize()}), median of {settings['epochs']} rounds in which every method and the "
             "reference take turns.", "",
             "| method | s/epoch | reference s/epoch | speed-up | inference images/s |", "|---|---|---|---|---|"]
    for name, row in record["methods"].items():
        label = LABELS.get(name, name).format(k=row["members"])
        lines.append(f"| {label} | {row['seconds_per_epoch']:.2f} | {row['reference_seconds_per_epoch']:.2f} | "
                     f"{row['speedup']:.1f}× | {rate(row['inference_images_per_second'])} |")
    pairs = [(key, value) for key, value in ratios.items() if " / " in key]
    lines += ["", "In the same record: " + "; ".join(f"{key.replace('batch-ensemble-channel', 'BatchEnsemble')} "
                                                      f"{value:.2f}×" for key, value in pairs) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(sys.argv[1]), end="")
