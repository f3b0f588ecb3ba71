"""Benchmark: BatchEnsemble with the subnormal weights that training leaves, kept vs flushed.

    python benchmarks/denormals.py [--epochs 5] [--repeats 5] [--out benchmarks/results]

With weight decay, BatchEnsemble parameters that the loss barely needs decay towards zero and
become subnormal (below 1.2e-38 in float32), where x86 arithmetic can take a slow path. This
trains the `mnist` protocol's BatchEnsemble MLP (k = 4, Adam, weight decay 1e-4) on
MNIST-shaped synthetic data for a few epochs with subnormals *kept* (as ensdiag did before it
flushed them), counts the subnormal parameters, then times inference (10,000 images) and one
training epoch with subnormals kept and flushed (`torch.set_flush_denormal(True)`, what
ensdiag's training, prediction and bench now do), alternating the two in one process.
Timings are measured, never asserted; the JSON record goes under --out.
"""

import argparse
import copy
import json
import statistics
import time
from datetime import datetime
from pathlib import Path

import torch

import ensdiag
from ensdiag.config import preset_config
from ensdiag.data.batching import Normalize, epoch_permutations
from ensdiag.provenance import environment
from ensdiag.train import FitData, make_optimizer, train_epoch

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def subnormal_count(model) -> int:
    return sum(int(((p != 0) & (p.abs() < SMALLEST_NORMAL)).sum()) for p in model.parameters())


@torch.no_grad()
def inference_rate(model, x, batch_size=1000) -> float:
    model.eval()
    began = time.perf_counter()
    for start in range(0, len(x), batch_size):
        model(x[start:start + batch_size])
    return len(x) / (time.perf_counter() - began)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="training epochs before timing (subnormals kept)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-size", type=int, default=60_000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.set_flush_denormal(False)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    config = preset_config("mnist", methods=["batch-ensemble"])
    images = torch.randint(0, 256, (args.train_size, 1, 28, 28), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (args.train_size,), generator=generator)
    normalize = Normalize(config.mean, config.std, "cpu")
    data = FitData(images, labels, images[:0], labels[:0], normalize)
    model = ensdiag.build_model("mlp", "batch-ensemble", 4, 10, (1, 28, 28), layout="paper")
    optimizer, _ = make_optimizer(model, config)
    for _ in range(args.epochs):
        train_epoch(model, optimizer, data, epoch_permutations(args.train_size, 1, generator, "cpu"), config, generator)
    subnormal = subnormal_count(model)
    x = normalize(images[:10_000])
    timings = {f"{what}, {mode}": [] for what in ("inference images/s", "training epoch s") for mode in ("kept", "flushed")}
    for _ in range(args.repeats):  # alternate, so drift hits both modes alike
        for mode, flush in (("kept", False), ("flushed", True)):
            torch.set_flush_denormal(flush)
            timings[f"inference images/s, {mode}"].append(inference_rate(model, x))
            trained = copy.deepcopy(model)  # every timed epoch starts from the same state
            trained_optimizer, _ = make_optimizer(trained, config)
            trained_optimizer.load_state_dict(optimizer.state_dict())
            began = time.perf_counter()
            train_epoch(trained, trained_optimizer, data, epoch_permutations(args.train_size, 1, generator, "cpu"),
                        config, generator)
            timings[f"training epoch s, {mode}"].append(time.perf_counter() - began)
    torch.set_flush_denormal(False)
    median = {name: statistics.median(values) for name, values in timings.items()}
    result = {"format": "ensdiag.bench-denormals/1", "created": datetime.now().isoformat(timespec="seconds"),
              "settings": {**vars(args), "out": str(args.out)}, "subnormal_parameters": subnormal,
              "parameters": sum(p.numel() for p in model.parameters()),
              "environment": environment(torch.device("cpu")),
              "measured": timings, "median": median,
              "inference speed-up from flushing": median["inference images/s, flushed"] / median["inference images/s, kept"],
              "training speed-up from flushing": median["training epoch s, kept"] / median["training epoch s, flushed"]}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"denormals-cpu-{result['created'].replace(':', '').replace('-', '')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"after {args.epochs} epochs: {subnormal:,} of {result['parameters']:,} parameters subnormal")
    for name, value in median.items():
        print(f"  {name:32s} {value:12,.3f} (median of {args.repeats})")
    print(f"  flushing: inference {result['inference speed-up from flushing']:.2f}x, "
          f"training {result['training speed-up from flushing']:.2f}x; written to {path}")


if __name__ == "__main__":
    main()
