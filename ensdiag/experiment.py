"""An experiment: every (method, seed) of a preset trained, predicted and analysed in one run
folder (its layout: runs.py).

`meta.json` is written last, so its presence marks a finished (method, seed), which is never
retrained; anything else is resumed from its training state or started afresh.
"""

import json
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import torch

from . import __version__, distributed
from .analysis import load_plugins
from .budget import physical_memory
from .checkpoint import save_model
from .config import TrainConfig
from .core import Context, Measure, inspect
from .data.batching import Normalize
from .data.preset import PresetData, holdout, load_preset_data, training_source
from .data.registry import Split
from .errors import EnsdiagError
from .geometry.baselines import initial_cosine
from .geometry.tracking import DiversityTracker
from .io import atomic_write_json, atomic_write_text, inner_folder, locked_folder, remove_stale_temporaries
from .nn.members import fastest
from .nn.model import flush_denormals
from .precision import policy as precision_policy, uses_bf16
from .predictions import save_predictions
from .progress import TrainProgress
from .provenance import environment
from .runs import DIAGNOSIS, EXPERIMENT_FORMAT, RUN_FILES, STATE_FILE, read_experiment
from .stats.bootstrap import Draws
from .train import Diverged, FitData, fit

GROWS = ("methods", "seeds", "method_options")  # what a rerun into a run folder may add to
DIAGNOSIS_SETTINGS = ("detail", "catalogue")  # how each run is diagnosed: a rerun keeps the folder's own


def stored_config(out: Path, config: TrainConfig) -> TrainConfig | None:
    """The config of the run already in `out`, or None: the same experiment, or the same with more
    methods or seeds (a grid grows; whatever it already holds stays as it is)."""
    if (out / "experiment.json").exists():
        experiment = read_experiment(out)
        if experiment.get("kind") == DIAGNOSIS:
            raise EnsdiagError(f"{out} holds diagnoses saved by `ensdiag analyze --method`, `diversity --save` or "
                               "ensdiag.diagnose, not a training run; train into another --out")
        stored = TrainConfig.from_dict(experiment["config"], source=str(out / "experiment.json"))
        differ = [f"{name} {getattr(stored, name)!r} there, {getattr(config, name)!r} here"
                  for name in stored.to_dict() if name not in ("overrides", *GROWS, *DIAGNOSIS_SETTINGS)
                  and getattr(stored, name) != getattr(config, name)]
        changed = {name: options for name, options in config.method_options.items()
                   if name in stored.methods and options != stored.method_options.get(name)}
        differ += [f"options of {name} {stored.method_options.get(name)!r} there, {options!r} here"
                   for name, options in changed.items()]
        if differ:
            raise EnsdiagError(f"{out} holds a different experiment ({'; '.join(differ)[:300]}); use --resume {out} "
                               "to continue it with its own settings, or choose another --out")
        # the methods and seeds of `config` it lacks added after its own (and the options of the methods added)
        methods = (*stored.methods, *(m for m in config.methods if m not in stored.methods))
        seeds = (*stored.seeds, *(s for s in config.seeds if s not in stored.seeds))
        if (methods, seeds) == (stored.methods, stored.seeds):
            return stored
        options = {**stored.method_options, **{name: value for name, value in config.method_options.items()
                                               if name not in stored.methods}}
        overrides = {**stored.overrides, "methods": list(methods), "seeds": list(seeds)}
        return replace(stored, methods=methods, seeds=seeds, method_options=options, overrides=overrides)
    if out.exists() and not out.is_dir():
        raise EnsdiagError(f"--out {out} exists and is not a directory")
    return None


def prepare_run_dir(out: Path, config: TrainConfig, argv) -> TrainConfig:
    """Create the run folder, or check that an existing one holds the same experiment (recording
    the methods and seeds a rerun adds to it)."""
    stored = stored_config(out, config)
    if stored is not None:
        experiment = read_experiment(out)
        if stored.to_dict() != experiment["config"]:
            atomic_write_json(out / "experiment.json", {**experiment, "config": stored.to_dict()})
        return stored
    atomic_write_json(out / "experiment.json", {"format": EXPERIMENT_FORMAT, "ensdiag_version": __version__,
                                                "created": datetime.now().isoformat(timespec="seconds"),
                                                "argv": list(argv), "config": config.to_dict()})
    return config


def train_run(config: TrainConfig, run: str, seed: int, data: PresetData, device, run_dir: Path,
              progress: TrainProgress, argv, ranks=distributed.Ranks(), ddp=False, draws=None) -> dict | None:
    """Train, predict and analyse one (method, seed); write its files, meta.json last. With `ddp`
    every rank trains it together and rank 0 writes (the others return None). `draws`: the
    bootstrap draws of the grid's runs (one set for all: they depend only on each split's size)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = config.build(run).to(device)
    initial = initial_cosine(model)  # before any step (and before a resume loads trained weights)
    model.initial_cosine = None if initial is None else {"mean": initial["mean"], "seed": seed}
    model.preprocess = (tuple(config.mean), tuple(config.std))  # recorded in the model file: every path applies it
    # --ddp synchronises BatchNorm layers, which the stacked layout uses (not vmap's or the loop's plain copies)
    model.member_strategy = "stacked" if ddp else fastest(device.type, config.arch)
    channels_last = device.type == "cuda" and config.arch != "mlp"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    train_index, val_index = holdout(len(data.train), config.val_fraction, seed)
    # recorded in the model file: geometry's training loss (diversity, diagnose) then skips the validation examples
    model.holdout = {"seed": seed, "fraction": float(config.val_fraction), "train_size": len(data.train)} \
        if len(val_index) else None
    normalize = Normalize(config.mean, config.std, device)
    fit_data = FitData(data.train.images[train_index].to(device), data.train.labels[train_index].to(device),
                       data.train.images[val_index].to(device), data.train.labels[val_index].to(device),
                       normalize, augment=config.augment)
    state_path = run_dir / STATE_FILE
    # one member has no diversity to track (a single model among ensembles: no diversity.jsonl)
    tracker = DiversityTracker(model) if config.track_diversity and model.num_members > 1 else None
    parallel = None
    if ddp:
        parallel = distributed.DataParallel(model, device)
        torch.manual_seed(seed + 1_000_003 * ranks.rank)  # the same weights on every rank, its own dropout masks
    try:
        with parallel or ExitStack():
            result = fit(model, config, fit_data, seed, state_path, device,
                         on_start=lambda done: progress.start_run(run, seed, config.epochs, done),
                         on_epoch=lambda row: progress.epoch(row, config.epochs),
                         autocast=uses_bf16(config.precision, device), channels_last=channels_last, tracker=tracker,
                         parallel=parallel, on_note=lambda text: progress.message(f"note: {run} seed {seed}: {text}"))
    except Diverged as error:
        raise Diverged(f"{run} seed {seed}: {error}") from None
    began = time.perf_counter()
    progress.stage("predicting and analysing …")
    splits = data.eval_splits()
    if len(val_index):  # last, so MC Dropout's masks on the other splits are what they always were
        splits["val"] = Split(data.train.images[val_index], data.train.labels[val_index], "validation split")
    flush_denormals()
    diagnosis = inspect(model, splits, preprocess=normalize,
                        train=Split(data.train.images[train_index], data.train.labels[train_index],
                                    training_source(len(train_index), len(val_index), seed)),
                        measure=Measure(geometry=config.geometry, seed=seed, catalogue=config.catalogue or config.detail,
                                        detail=config.detail),
                        context=Context(device=device, titles=data.titles, skipped=data.skipped, spread=ddp,
                                        draws=draws))
    if diagnosis is None:
        distributed.barrier()  # rank 0 writes the run's files
        return None
    metrics = diagnosis.metrics
    eval_seconds = time.perf_counter() - began
    save_predictions({name: split for name, split in diagnosis.predictions.items() if name != "shift" or "shift" in splits},
                     run_dir / "predictions.safetensors", {"ensdiag.spec": model.spec.to_json(), "ensdiag.splits": data.titles})
    save_model(model, run_dir / "model.safetensors")
    atomic_write_text(run_dir / "history.jsonl", "".join(json.dumps(row) + "\n" for row in result["history"]))
    if result["tracking"]:
        atomic_write_text(run_dir / "diversity.jsonl", "".join(json.dumps(row) + "\n" for row in result["tracking"]))
    atomic_write_json(run_dir / "metrics.json", metrics)
    parameters = sum(p.numel() for p in model.parameters())
    meta = {"run": run, "method": model.method, "seed": seed, "spec": json.loads(model.spec.to_json()),
            "parameters": parameters, "epochs_run": len(result["history"]), "weights_epoch": result["weights_epoch"],
            "best_val_epoch": result["best_val_epoch"], "early_stopping": config.early_stopping and model.kit.early_stopping,
            "stopped_early": result["stopped_early"],
            **({"members_stopped_early": result["members_stopped_early"]} if "members_stopped_early" in result else {}),
            "train_seconds": result["train_seconds"],
            "eval_seconds": eval_seconds, "splits": data.titles, "skipped_splits": data.skipped,
            "argv": list(argv), "environment": environment(device), "precision": precision_policy(config.precision, device),
            **({"world_size": ranks.world_size, "ddp": True} if ddp else
               {"rank": ranks.rank, "world_size": ranks.world_size} if ranks.distributed else {}),
            "finished": datetime.now().isoformat(timespec="seconds")}
    atomic_write_json(run_dir / "meta.json", meta)
    state_path.unlink(missing_ok=True)
    accuracy = metrics["analyzers"].get("calibration", {}).get("splits", {}).get("id", {}).get("accuracy", {}).get("value")
    progress.end_run(f"test accuracy {accuracy:.3f}" if accuracy is not None else "done")
    if ddp:
        distributed.barrier()
    return meta


def run_experiment(config: TrainConfig, out: Path, data_dir, download=False, device="auto", quiet=False,
                   argv=None, ddp=False) -> Path:
    """Train the grid into `out`. Under torchrun (distributed.py) the ranks share the grid:
    rank 0 prepares the folder, each rank trains the runs assigned to it (`assign_runs`); with
    `ddp` every run is trained by all ranks together, data-parallel."""
    argv, out = list(sys.argv if argv is None else argv), Path(out)
    if ddp and not distributed.from_environment().distributed:
        raise EnsdiagError("--ddp trains one run over several processes: start it with torchrun "
                           "(e.g. torchrun --nproc-per-node 8 -m ensdiag train --ddp …)")
    ranks, device = distributed.start(device)
    with ExitStack() as held:
        problem, data = None, None
        if ranks.main:
            try:
                config, data = _prepare(config, out, data_dir, download, argv, held)
            except Exception as error:  # reported to the other ranks, which would otherwise wait for ever
                problem = error
            if not ranks.distributed and problem is not None:
                raise problem
        if ranks.distributed:  # the others wait until rank 0 has the folder ready (or could not)
            failed = distributed.broadcast(None if problem is None else str(problem) or type(problem).__name__)
            if failed is not None:
                raise problem if ranks.main else EnsdiagError(f"rank 0 could not start the run: {failed}")
            if not ranks.main:
                config = TrainConfig.from_dict(read_experiment(out)["config"], source=str(out / "experiment.json"))
                data = load_preset_data(config, data_dir, False)
            seen = distributed.all_gather((data.titles, data.skipped))  # every rank must measure the same splits
            if any(found != seen[0] for found in seen):
                differ = next(rank for rank, found in enumerate(seen) if found != seen[0])
                raise EnsdiagError(f"rank {differ} found other data than rank 0 (splits {seen[differ][0]} there, "
                                   f"{seen[0][0]} on rank 0): every node needs the same --data-dir contents"[:400])
        _train_grid(config, out, data, device, quiet or not ranks.main, argv, ranks, ddp)
    return out


def _prepare(config, out, data_dir, download, argv, held: ExitStack):
    """Check, create and lock the run folder (held until training ends) and load the data."""
    stored_config(out, config)  # a wrong --out fails before anything is created
    # a method whose weights, gradients and optimiser state alone would not fit in memory (16 bytes per parameter with
    # Adam or SGD with momentum) refused before training, not killed hours later (counted on the meta device)
    available = physical_memory()
    for run in config.methods:
        with torch.device("meta"):
            model = config.build(run)
        needed = 16 * sum(p.numel() for p in model.parameters())
        if needed > 0.8 * available:
            raise EnsdiagError(f"{run} with k = {model.num_members} needs about {needed / 2**30:.1f} GiB for its "
                               f"weights, gradients and optimiser state, more than this machine's "
                               f"{available / 2**30:.1f} GiB allow; lower --members (or the method's width options)")
    new_folders = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EnsdiagError(f"cannot write to --out {out}: {error.strerror or error}") from None
    # One job per run folder: two trainings into one folder would mix their configurations.
    held.enter_context(locked_folder(out, "run folder"))
    if (out / "experiment.json").is_file():  # an ensdiag run: what a process killed while saving left
        remove_stale_temporaries(out, RUN_FILES, ["*/seed-*", "figures"])
    try:
        stored = stored_config(out, config)  # again, under the lock
        for run in (stored or config).methods:  # every folder of the grid a real one inside --out, before any training
            for seed in (stored or config).seeds:
                inner_folder(out, run, f"seed-{seed}", what="run", create=False)
        data = load_preset_data(stored or config, data_dir, download)
    except BaseException:
        for folder in new_folders:  # no empty run folder left behind by a failed start
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return prepare_run_dir(out, stored or config, argv), data


def run_cost(config: TrainConfig, run: str) -> int:
    """The estimated training cost of one run, for spreading runs over ranks: the member forward
    passes a training example costs × the parameters of one member (counted on the meta device)."""
    with torch.device("meta"):
        model = config.build(run)
        member = sum(p.numel() for p in model.member_network(0).parameters())
    return model.kit.passes_per_example(config.be_split_batch) * member


def assign_runs(runs: list[tuple[str, int]], costs: dict[str, int], world_size: int) -> dict[tuple[str, int], int]:
    """{(run, seed): rank}: longest first — runs sorted by cost (descending; ties in grid order),
    each to the rank with the least cost assigned so far (the lowest rank on ties). The
    expensive methods' seeds thus land on different ranks, and every run on exactly one."""
    load = [0] * world_size
    assigned = {}
    for run, seed in sorted(runs, key=lambda item: -costs[item[0]]):  # sorted() is stable: grid order on ties
        rank = min(range(world_size), key=lambda r: (load[r], r))
        assigned[run, seed] = rank
        load[rank] += costs[run]
    return assigned


def _train_grid(config: TrainConfig, out: Path, data: PresetData, device, quiet: bool, argv, ranks=distributed.Ranks(),
                ddp=False):
    """Every (method, seed) not finished yet, in order; finished ones (meta.json) are kept.
    Over several ranks each trains the runs `assign_runs` gives it, under a lock on the run's
    folder; with `ddp` all ranks train every run together."""
    grid = [(run, seed) for run in config.methods for seed in config.seeds]
    mine = set(grid)
    if ranks.distributed and not ddp:
        unfinished = [(run, seed) for run, seed in grid if not (Path(out) / run / f"seed-{seed}" / "meta.json").exists()]
        owner = distributed.broadcast(assign_runs(unfinished, {run: run_cost(config, run) for run in config.methods},
                                                  ranks.world_size) if ranks.main else None)
        mine = {key for key, rank in owner.items() if rank == ranks.rank} | (set(grid) - set(owner))
    progress = TrainProgress(len(mine), quiet, early_stopping=config.early_stopping)
    if ddp:
        progress.message(f"every run trained by {ranks.world_size} ranks together (DistributedDataParallel)")
    elif ranks.distributed:
        counts = [sum(rank == r for rank in owner.values()) for r in range(ranks.world_size)]
        progress.message(f"{len(owner)} runs to train over {ranks.world_size} ranks ({', '.join(map(str, counts))}); "
                         "this display shows rank 0's")
    for split, reason in data.skipped.items():
        progress.message(f"note: {split} split skipped: {reason}")
    for name, error in load_plugins().items():
        progress.message(f"warning: plug-in analyzer {name} failed to import ({error}); its results are missing")
    if ranks.main:
        experiment = read_experiment(out)
        if experiment.get("skipped") != data.skipped or experiment.get("splits") != data.titles:
            atomic_write_json(Path(out) / "experiment.json", {**experiment, "splits": data.titles, "skipped": data.skipped})
    diverged, draws = [], Draws()
    try:
        for run, seed in grid:
            if (run, seed) not in mine:
                continue
            run_dir = inner_folder(out, run, f"seed-{seed}", what="run", create=False)
            if (run_dir / "meta.json").exists():
                progress.skip_run(run, seed)
                continue
            try:
                with ExitStack() as held:
                    if ranks.distributed and not ddp:  # a run is trained by one process only, whatever else runs
                        run_dir.mkdir(parents=True, exist_ok=True)
                        held.enter_context(locked_folder(run_dir, "run folder"))
                    train_run(config, run, seed, data, device, run_dir, progress, argv, ranks, ddp, draws)
            except Diverged as error:  # the other runs of the grid still train
                progress.message(f"error: {error}")
                diverged.append(str(error))
    finally:
        progress.close()
    gathered = distributed.all_gather(diverged)  # under --ddp every rank saw the same runs diverge
    diverged = gathered[0] if ddp else [message for found in gathered for message in found]
    if diverged:
        raise Diverged(diverged[0] if len(diverged) == 1 else
                       f"{len(diverged)} runs diverged (the others finished): {'; '.join(diverged)}")
