"""ensdiag's training epoch against torch-uncertainty's on the MLP protocol's shapes (peer timing).

    python3 -m venv /tmp/tuenv
    /tmp/tuenv/bin/pip install -c constraints.txt -e . "torch-uncertainty==0.13.0" einops seaborn huggingface_hub timm \
        "lightning>=2.0,<2.7"
    /tmp/tuenv/bin/python benchmarks/peer_training.py [--rounds 5]

torch-uncertainty is not a dependency of ensdiag: this script runs in a venv of its own. Every
trainer fits the mnist protocol's 784-64-32-16-10 MLP with k = 4 members to 60,000 synthetic
1×28×28 images (batch 128, Adam, weight decay 1e-4, fp32 on the CPU), one epoch per round,
the trainers taking turns; each reports its median epoch. Trainers, per method:

- `ensdiag`: the fast path, i.e. the loop `ensdiag train` runs (`ensdiag.bench`'s timer);
- `torch-uncertainty (Lightning)`: their model in their `ClassificationRoutine` under a
  `lightning.Trainer`, over a shuffled `DataLoader`: the way their documentation trains;
- `torch-uncertainty (plain loop)`: their model in a minimal PyTorch loop over the same
  `DataLoader`, their loss (cross-entropy on the k-fold repeated targets): the least a user of
  their models pays.

The BatchEnsemble model is their `batched_mlp` (inputs repeated k times inside the model),
the Deep Ensemble their `deep_ensembles` of k `mlp`s. The result goes to
`benchmarks/results/peer-training-cpu-<time>.json`; `ensdiag_ratio` is ensdiag's median
epoch over the trainer's.
"""

import argparse
import statistics
import time
from datetime import datetime
from pathlib import Path

import lightning
import torch
import torch_uncertainty
from torch.utils.data import DataLoader, TensorDataset
from torch_uncertainty.methods import deep_ensembles
from torch_uncertainty.models.mlp import batched_mlp, mlp
from torch_uncertainty.routines import ClassificationRoutine
from torch_uncertainty.transforms import RepeatTarget

from ensdiag.bench.harness import BenchSettings, FastPathTimer, synthetic_split
from ensdiag.config import preset_config
from ensdiag.data.batching import Normalize
from ensdiag.io import atomic_write_json
from ensdiag.provenance import environment
from ensdiag.train import FitData

K, HIDDEN, BATCH, N = 4, [64, 32, 16], 128, 60_000
ROOT = Path(__file__).resolve().parents[1]


def peer_model(method: str):
    if method == "batch-ensemble":
        return batched_mlp(in_features=784, num_outputs=10, hidden_dims=HIDDEN, num_estimators=K, flatten_start_dim=1)
    return deep_ensembles([mlp(in_features=784, num_outputs=10, hidden_dims=HIDDEN, flatten_start_dim=1) for _ in range(K)])


def optimizer_for(model, config):
    return torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


class PlainLoop:
    def __init__(self, method, loader, config):
        torch.manual_seed(0)
        self.model, self.loader = peer_model(method), loader
        self.optimizer = optimizer_for(self.model, config)
        self.repeat = RepeatTarget(K)

    def epoch(self) -> float:
        began = time.perf_counter()
        self.model.train()
        for x, y in self.loader:
            x, y = self.repeat((x, y))
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return time.perf_counter() - began


class EpochClock(lightning.Callback):
    """Seconds from the start of a training epoch to its end, hooks included."""

    def on_train_epoch_start(self, trainer, module):
        self.began = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.seconds = time.perf_counter() - self.began


class LightningRoutine:
    def __init__(self, method, loader, config):
        torch.manual_seed(0)
        self.routine = ClassificationRoutine(model=peer_model(method), num_classes=10, loss=torch.nn.CrossEntropyLoss(),
                                             is_ensemble=True, format_batch_fn=RepeatTarget(K),
                                             optim_recipe=lambda model: optimizer_for(model, config))
        self.loader, self.epochs = loader, 0

    def epoch(self) -> float:
        clock = EpochClock()
        self.epochs += 1  # each round continues training the same routine for one more epoch
        trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                    enable_model_summary=False, accelerator="cpu", callbacks=[clock])
        trainer.fit(self.routine, self.loader)
        return clock.seconds


class Ensdiag:
    def __init__(self, method, images, labels, config):
        data = FitData(images, labels, images[:0], labels[:0], Normalize(config.mean, config.std, torch.device("cpu")))
        self.timer = FastPathTimer(config, method, data, BenchSettings(arch="mlp", precision="fp32"), torch.device("cpu"))
        self.timer.warm_up()

    def epoch(self) -> float:
        return self.timer.epoch()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train-size", type=int, default=N)
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    config = preset_config("mnist", members=K)
    images, labels = synthetic_split(args.train_size, (1, 28, 28), 10, seed=0)
    normalized = Normalize(config.mean, config.std)(images)
    loader = DataLoader(TensorDataset(normalized, labels), batch_size=BATCH, shuffle=True)
    trainers = {}
    for method in ("batch-ensemble", "deep-ensemble"):
        trainers[method, "ensdiag"] = Ensdiag(method, images, labels, config)
        trainers[method, "torch-uncertainty (Lightning)"] = LightningRoutine(method, loader, config)
        trainers[method, "torch-uncertainty (plain loop)"] = PlainLoop(method, loader, config)
    for (method, name), trainer in trainers.items():
        if name != "ensdiag":
            trainer.epoch()  # warm-up: first allocations, Lightning's first set-up
    seconds = {key: [] for key in trainers}
    for round_ in range(args.rounds):
        for key, trainer in trainers.items():
            seconds[key].append(trainer.epoch())
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{m} {n} {s[-1]:.2f} s" for (m, n), s in seconds.items()),
              flush=True)
    rows = {}
    for (method, name), values in seconds.items():
        median = statistics.median(values)
        ours = statistics.median(seconds[method, "ensdiag"])
        rows[f"{method}: {name}"] = {"method": method, "trainer": name, "seconds_per_epoch": median, "measured": values,
                                     **({} if name == "ensdiag" else {"ensdiag_ratio": ours / median})}
    created = datetime.now().isoformat(timespec="seconds")
    record = {"format": "ensdiag.peer-training/1", "created": created, "environment": environment(torch.device("cpu")),
              "torch_uncertainty": torch_uncertainty.__version__ if hasattr(torch_uncertainty, "__version__") else
              __import__("importlib.metadata").metadata.version("torch-uncertainty"),
              "lightning": lightning.__version__, "rounds": args.rounds,
              "protocol": (f"mnist MLP 784-64-32-16-10, k = {K}, {args.train_size:,} synthetic 1×28×28 images, batch {BATCH}, "
                           f"Adam (lr {config.lr}, weight decay {config.weight_decay}), fp32 on the CPU"),
              "trainers": rows}
    path = args.results_dir / f"peer-training-cpu-{created.replace(':', '').replace('-', '')}.json"
    atomic_write_json(path, record)
    for name, row in rows.items():
        print(f"{name}: {row['seconds_per_epoch']:.3f} s/epoch" + (f", ensdiag / it = {row['ensdiag_ratio']:.2f}"
                                                                    if "ensdiag_ratio" in row else ""))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
