"""Are a Deep Ensemble's members single models? Each member's test NLL and accuracy against the `single`
runs of the same grid, on the default grid and on a larger one.

    python benchmarks/member_protocol.py                      # 3 and 10 seeds; writes benchmarks/results/
    python benchmarks/member_protocol.py --seeds 3 --out X.json

A Deep Ensemble is k independently trained single models (docs/conventions.md, "How each method
stops"): member i should be distributed as a `single` run. Both methods train on the digits
preset as `ensdiag train` does; each member's NLL is −log softmax(its logits)(y) on the test split.
Two tests, both two-sided: Welch's t-test of the single runs against every member (members of one
run share its validation split, so they are not quite independent draws), and the paired t-test
over seeds of the single run against the mean of that seed's members (they share a seed's split).
"""

import argparse
import json
import tempfile
from datetime import datetime
from pathlib import Path

import torch
from scipy import stats

from ensdiag.config import preset_config
from ensdiag.experiment import run_experiment
from ensdiag.io import read_safetensors
from ensdiag.provenance import environment

SEEDS = (42, 69, 123, 456, 789, *range(1, 26))  # the default grid's first


def scores(run_dir: Path) -> dict:
    """{"nll", "accuracy"}: one value per member of the run's test split."""
    tensors, _ = read_safetensors(run_dir / "predictions.safetensors", "predictions file")
    log_probs = torch.log_softmax(tensors["id/logits"].double(), -1)
    labels = tensors["id/labels"].long()
    picked = log_probs.gather(2, labels.expand(len(log_probs), -1)[..., None]).squeeze(-1)
    return {"nll": (-picked.mean(1)).tolist(), "accuracy": (log_probs.argmax(-1) == labels).double().mean(1).tolist()}


def compare(single: list[float], members: list[list[float]]) -> dict:
    """Means, spreads and both tests for one quantity: `single` [seeds], `members` [seeds][k]."""
    flat = [value for run in members for value in run]
    mean_member = [sum(run) / len(run) for run in members]
    welch = stats.ttest_ind(single, flat, equal_var=False)
    paired = stats.ttest_rel(single, mean_member)
    return {"single": {"mean": float(torch.tensor(single).mean()), "sd": float(torch.tensor(single).std()),
                       "n": len(single), "values": single},
            "members": {"mean": float(torch.tensor(flat).mean()), "sd": float(torch.tensor(flat).std()),
                        "n": len(flat), "values": members},
            "welch": {"t": float(welch.statistic), "p": float(welch.pvalue)},
            "paired": {"t": float(paired.statistic), "p": float(paired.pvalue)}}


def grid(seeds: tuple[int, ...], out: Path) -> dict:
    config = preset_config("digits", methods=["single", "deep-ensemble"], seeds=list(seeds))
    run_experiment(config, out, "data", quiet=True)
    found = {method: [scores(out / method / f"seed-{seed}") for seed in seeds] for method in config.methods}
    epochs = {method: [json.loads((out / method / f"seed-{seed}" / "meta.json").read_text())["weights_epoch"]
                       for seed in seeds] for method in config.methods}
    return {"seeds": list(seeds), "members": config.members, "weights_epoch": epochs,
            **{key: compare([run[key][0] for run in found["single"]], [run[key] for run in found["deep-ensemble"]])
               for key in ("nll", "accuracy")}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 10], help="grid sizes (the first seeds of SEEDS)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        grids = {f"{n} seeds": grid(SEEDS[:n], Path(folder) / f"grid-{n}") for n in args.seeds}
    record = {"kind": "member-protocol", "environment": environment(torch.device("cpu")), "grids": grids}
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    out = args.out or Path(__file__).parent / "results" / f"member-protocol-digits-{stamp}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    for name, found in grids.items():
        print(name, {key: (round(found[key]["single"]["mean"], 4), round(found[key]["members"]["mean"], 4),
                           round(found[key]["welch"]["p"], 3), round(found[key]["paired"]["p"], 3))
                     for key in ("nll", "accuracy")})
    print(out)


if __name__ == "__main__":
    main()
