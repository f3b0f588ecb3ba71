"""Training one model: the loss semantics of the methods, early stopping, exact resume.

What differs between methods comes from the model's kit (nn/kit.py, one module per method in
nn/kits/): the data orders of an epoch, the distinct examples a step draws, how a batch
reaches the members, which parameters the optimiser treats apart, and how the members' mean
cross-entropies combine into the loss (`Kit.loss_over_members`): the **sum** when members
share no parameter (each member's weights then get exactly the gradient a single model
would), the **mean** over all k·B rows when they share weights (shared weights then get a
single model's gradient, not k times it). docs/conventions.md has each method's choice.

After every epoch the whole state (model, optimiser, scheduler, RNG streams, early-stopping
state, history) is written atomically, so a killed run resumes to exactly the weights an
uninterrupted run would have reached (on CPU).
"""

import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import distributed
from .stats.examples import Examples
from .data.batching import Normalize, TrainingImages, batch_indices, epoch_permutations
from .errors import EnsdiagError
from .io import atomic_write_bytes, regular_file
from .nn.model import EnsembleModel, flush_denormals
from .precision import exact_math, training_math


@dataclass
class FitData:
    """Device-resident tensors: images (uint8 or float in [0, 1]) and int64 labels."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    val_images: torch.Tensor
    val_labels: torch.Tensor
    normalize: Normalize
    augment: bool = False
    _prepared: dict = field(default_factory=dict, repr=False, compare=False)

    def training_images(self, dtype=torch.float32) -> TrainingImages:
        """The training split normalised (and padded) once, cached per dtype."""
        if dtype not in self._prepared:
            self._prepared[dtype] = TrainingImages(self.train_images, self.train_labels, self.normalize,
                                                   self.augment, dtype)
        return self._prepared[dtype]


def make_optimizer(model, config, fused=True):
    """Adam or SGD over `model` (an EnsembleModel, or a module holding several): one group for
    every parameter, then the groups each model's kit asks for (BatchEnsemble: its fast
    weights, decayed only if the run says so). The group layout is part of a saved optimiser
    state, so it must not change between versions that resume each other's runs.

    The fused kernels (one call updates every tensor) exist on CPU and CUDA and run the same
    update rule as the per-tensor loop, several times faster on small models; `fused=False`
    gives PyTorch's default update (the reference pipeline's)."""
    special = [group for module in model.modules() if isinstance(module, EnsembleModel)
               for group in module.kit.parameter_groups(module, config) if group["params"]]
    taken = {id(p) for group in special for p in group["params"]}
    groups = [{"params": [p for p in model.parameters() if id(p) not in taken]}, *special]
    fused = (fused and all(p.device.type in ("cpu", "cuda") for p in model.parameters())) or None
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov,
                                    weight_decay=config.weight_decay, fused=fused)
    else:
        optimizer = torch.optim.Adam(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps,
                                     weight_decay=config.weight_decay, fused=fused)
    kit = getattr(model, "kit", None)  # a kit with a schedule of its own (a snapshot ensemble's cycles)
    scheduler = kit.make_scheduler(optimizer, config) if kit is not None else None
    if scheduler is None:
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(config.milestones), config.gamma)
    return optimizer, scheduler


def member_loss(logits, labels, over_members="sum"):
    """The training loss for logits [k, b, C]: Σ_i or mean_i of mean_b CE(logits[i, b], labels[i, b])."""
    per_example = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    per_member = per_example.view(labels.shape).mean(dim=1)
    if over_members not in ("sum", "mean"):
        raise ValueError(f"over_members must be 'sum' or 'mean', not {over_members!r}")
    return per_member.sum() if over_members == "sum" else per_member.mean()


def train_epoch(model, optimizer, data: FitData, orders, config, generator, autocast=False, channels_last=False,
                parallel=None):
    """One pass over `orders` [m, n]; returns (mean member loss, mean member accuracy).

    Running totals stay on the device: one synchronisation per epoch, not one per batch. With
    `parallel` (distributed.DataParallel, `--ddp`) every rank draws the whole batch from the
    same generator, as one process would, and trains on its share of the examples; its loss is
    weighted by its share, so the gradients DDP averages are the whole batch's."""
    model.train()
    kit = model.kit
    images = data.training_images(torch.bfloat16 if autocast else torch.float32)
    device = images.images.device
    total_loss, total_correct, total_seen = torch.zeros((), device=device), torch.zeros((), device=device), 0
    forward = model.forward_members if parallel is None else parallel
    for index in batch_indices(orders, kit.examples_per_batch(config.batch_size)):
        x, y = kit.member_batch(*images.batch(index, generator), split_batch=config.be_split_batch, generator=generator)
        if y.shape[1] == 0:
            continue
        weight = 1.0
        if parallel is not None:
            part, rows = distributed.shard(y.shape[1]), y.shape[1]
            x, y = x[:, part], y[:, part]
            weight = distributed.ranks().world_size * y.shape[1] / rows
        if channels_last:
            x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, x.shape[:2])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = forward(x)
        # a rank whose share of a last, tiny batch is empty still takes part in the step
        loss = member_loss(logits.float(), y, kit.loss_over_members) if y.shape[1] else logits.sum() * 0.0
        optimizer.zero_grad(set_to_none=True)
        (loss * weight if weight != 1.0 else loss).backward()
        optimizer.step()
        with torch.no_grad():
            members, seen = y.shape
            mean_member_loss = loss.detach() / members if kit.loss_over_members == "sum" else loss.detach()
            total_loss += mean_member_loss * seen
            total_correct += (logits.argmax(-1) == y).sum() / members
        total_seen += y.shape[1]
    if parallel is not None:  # the epoch's totals over every rank's share
        seen = torch.tensor(float(total_seen), device=device)
        total_loss, total_correct, seen = distributed.all_reduce_sum(torch.stack([total_loss, total_correct, seen]))
        total_seen = seen.item()
    total_seen = max(total_seen, 1)
    return total_loss.item() / total_seen, total_correct.item() / total_seen


@torch.no_grad()
def evaluate(model, images, labels, normalize, keep_logits=False):
    """(accuracy, NLL) of the ensemble mean p̄ = mean of member softmaxes; (None, None) for no images.
    With `keep_logits`, also the member logits [k, N, C] (on the model's device). In exact fp32
    (precision.py)."""
    if len(images) == 0:
        return (None, None, None) if keep_logits else (None, None)
    model.eval()
    correct = nll = 0.0
    kept = []
    for x, y in zip(images.split(1000), labels.split(1000)):
        with exact_math():
            logits = model(normalize(x)).float()
        log_mean = Examples(logits, None).log_mean
        correct += (log_mean.argmax(-1) == y).sum().item()
        nll -= log_mean.gather(1, y[:, None]).sum().item()
        if keep_logits:
            kept.append(logits)
    found = correct / len(images), nll / len(images)
    return (*found, torch.cat(kept, dim=1)) if keep_logits else found


def _rng_state(generator, device):
    state = {"cpu": torch.get_rng_state(), "generator": generator.get_state()}
    if device.type == "cuda":  # the run's own device: a resumed run may land on another GPU (torchrun)
        state["cuda_device"] = torch.cuda.get_rng_state(device)
    return state


def _restore_rng(state, generator, device, reseed: int) -> list[str]:
    """Restore the saved random streams; what cannot be carried over to this device is seeded
    with `reseed` instead and named in the list returned (empty when everything carried over).

    A CUDA generator's state (seed and offset, 16 bytes) means nothing to the CPU's Mersenne
    Twister (5,056 bytes) and back, so the data-order generator of a run that changes device
    starts a new seeded stream; CUDA's own stream (dropout masks) exists only on CUDA."""
    torch.set_rng_state(state["cpu"])
    lost = []
    if state["generator"].numel() == generator.get_state().numel():
        generator.set_state(state["generator"])
    else:
        generator.manual_seed(reseed)
        lost.append("the data order")
    if device.type == "cuda":
        if "cuda_device" in state:
            torch.cuda.set_rng_state(state["cuda_device"], device)
        elif "cuda" in state:  # a state saved before 0.4: every device's
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            torch.cuda.manual_seed(reseed)
            lost.append("the dropout masks")
    return lost


class Diverged(EnsdiagError):
    """The training loss became NaN or infinite; the last finite epoch's state stays on disk."""


def _resume(state_path: Path, model, optimizer, scheduler, generator, device, seed: int):
    """Load a training state (tensors only: weights_only) saved by `fit`; a damaged one is a clear error.

    Everything is read to the CPU first: RNG states must stay CPU tensors, and the weights and
    optimiser state move to the model's device as they are loaded. A state saved on another
    kind of device resumes here; the last value returned says what it could not carry over."""
    device = torch.device(device)
    regular_file(state_path, "training state")  # a FIFO in its place would block torch.load for ever
    try:
        saved = torch.load(state_path, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        best, history, seconds, stopped = saved["best"], saved["history"], saved["seconds"], saved["stopped"]
        start = int(saved["epoch"]) + 1
        tracking = saved.get("tracking", [])
        if not (isinstance(history, list) and len(history) == start and isinstance(best, dict)
                and isinstance(tracking, list)):
            raise ValueError("inconsistent epoch count")
        lost = _restore_rng(saved["rng"], generator, device, reseed=(seed + 7919 * start) % 2**63)
    except Exception as error:  # truncated, foreign or tampered: never retried with weights_only=False
        raise EnsdiagError(f"{state_path} is damaged or not an ensdiag training state ({type(error).__name__}); "
                           "delete it to restart this method and seed from epoch 0") from None
    note = None
    if lost:
        saved_on = saved.get("device")
        saved_on = "".join(filter(str.isprintable, saved_on))[:40] if isinstance(saved_on, str) else "another device"
        note = (f"the training state was saved on {saved_on} and resumes on {device}: {' and '.join(lost)} from "
                f"epoch {start + 1} on cannot be carried over and are seeded afresh, so this run will not repeat "
                "an uninterrupted one exactly")
    return best, history, seconds, stopped, start, tracking, note


def member_views(model) -> dict[str, torch.Tensor] | None:
    """{state key: member-first view [k, …]} of every tensor the members hold apart (writing a view
    writes the model), or None where the members share a parameter or buffer: they cannot stop apart."""
    views = {f"{name}.{key}": tensor for name, module in model.named_modules() if hasattr(module, "stacked_state")
             for key, tensor in module.stacked_state().items() if tensor.dim()}
    shared = any(key not in views and tensor.dim() for key, tensor in model.state_dict().items())
    return None if shared or not views else views


def _step_members(best: dict, accuracies: list[float], epoch: int, views: dict, config) -> None:
    """One epoch of early stopping for each member still training, on its own validation accuracy, as a
    `single` run of it would: its best weights copied, its patience counted. A member that stopped keeps
    training with the others (it shares no parameter with them, so nothing of theirs changes) and its
    kept weights are restored at the end: the same member as one frozen at its stop."""
    for i, accuracy in enumerate(accuracies):
        if best["stopped"][i]:
            continue
        if accuracy > best["accuracy"][i] + config.min_delta or best["epoch"][i] < 0:
            best["accuracy"][i], best["epoch"][i], best["bad_epochs"][i] = accuracy, epoch, 0
            with torch.no_grad():
                for key, view in views.items():
                    best["state"][key][i].copy_(view[i])
        else:
            best["bad_epochs"][i] += 1
        best["stopped"][i] = best["bad_epochs"][i] >= config.patience


def fit(model, config, data: FitData, seed: int, state_path: Path, device, on_epoch=None,
        autocast=False, channels_last=False, on_start=None, tracker=None, parallel=None, on_note=None) -> dict:
    """Train until the epochs run out or early stopping fires; resume from `state_path` if present.

    Returns {"history", "weights_epoch", "best_val_epoch", "stopped_early", "train_seconds",
    "tracking"} (epochs counted from 1). The model ends with the weights of `weights_epoch`: with
    early stopping the best validation epoch, else the last one. Without a validation split
    (`data.val_images` empty) validation is skipped and `best_val_epoch` is None. A `tracker`
    (geometry/tracking.py) measures the members on the validation split at initialisation and
    after every epoch, without changing what is trained; its rows are "tracking". With
    `parallel` (`--ddp`) every rank trains the model on its share of each batch, validation
    is rank 0's, and rank 0 alone writes the training state. `autocast` (bf16) applies to the
    training steps only: validation is exact fp32 (precision.py). `on_note` gets a line to show
    the person at the terminal (a resume that could not carry everything over)."""
    flush_denormals()
    optimizer, scheduler = make_optimizer(model, config)
    generator = torch.Generator(device=device).manual_seed(seed)
    early_stopping = config.early_stopping and model.kit.early_stopping  # a kit's own schedule runs to the end
    if early_stopping and len(data.val_images) == 0:
        raise ValueError("early stopping needs a validation split")
    # Members that share no parameter (a Deep Ensemble) stop one by one, each as a single run would.
    views = member_views(model) if early_stopping and model.kit.independent_members and model.num_members > 1 else None
    # early stopping's state before the first epoch: one rule, or one per member, whose best weights are kept
    k = model.num_members
    best = {"accuracy": -math.inf, "epoch": -1, "bad_epochs": 0, "state": None} if views is None else {
        "accuracy": [-math.inf] * k, "epoch": [-1] * k, "bad_epochs": [0] * k, "stopped": [False] * k,
        "state": {key: view.detach().clone() for key, view in views.items()}}
    history, start, seconds, stopped, tracking = [], 0, 0.0, False, []
    if tracker is not None and len(data.val_images) == 0:
        raise ValueError("tracking diversity needs a validation split")
    if state_path.exists():
        best, history, seconds, stopped, start, tracking, note = _resume(state_path, model, optimizer, scheduler,
                                                                         generator, device, seed)
        if not isinstance(best["accuracy"], list):  # a state saved before members stopped one by one
            views = None  # resumes as it began: one rule for the whole ensemble
        if note is not None and on_note is not None:
            on_note(note)
    if on_start is not None:
        on_start(start)  # the number of epochs already done (0 unless resuming)
    if tracker is not None and not tracking:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # MC Dropout draws masks
            logits = evaluate(model, data.val_images, data.val_labels, data.normalize, keep_logits=True)[2]
        tracking.append(tracker.measure(0, logits))
    n = len(data.train_images)
    for epoch in range(start, config.epochs):
        if stopped:
            break
        began = time.perf_counter()
        orders = epoch_permutations(n, model.kit.data_orders(), generator, device)
        lr = optimizer.param_groups[0]["lr"]
        with training_math(device):
            loss, accuracy = train_epoch(model, optimizer, data, orders, config, generator, autocast, channels_last, parallel)
        if not math.isfinite(loss):  # stop before this epoch's state overwrites the last finite one
            kept = f"the state after epoch {epoch} is kept, so the run resumes from there" if epoch else "nothing was saved"
            raise Diverged(f"training diverged in epoch {epoch + 1} (training loss {loss}); {kept}. Lower --lr "
                           "(in a new --out: a run folder keeps its settings), or check --be-init")
        scheduler.step()
        model.kit.end_epoch(model, epoch + 1, config.epochs)  # a procedural ensemble stores its members here
        val_accuracy, val_nll, *logits = evaluate(model, data.val_images, data.val_labels, data.normalize,
                                                  keep_logits=tracker is not None or views is not None)
        members = None if views is None else (logits[0].argmax(-1) == data.val_labels).double().mean(1).tolist()
        if parallel is not None:  # one decision for every rank (early stopping), whatever rounding did
            val_accuracy, val_nll, members = distributed.broadcast((val_accuracy, val_nll, members))
        if val_accuracy is None:
            pass
        elif views is not None:
            _step_members(best, members, epoch, views, config)
        elif val_accuracy > best["accuracy"] + config.min_delta or best["epoch"] < 0:
            best = {"accuracy": val_accuracy, "epoch": epoch, "bad_epochs": 0,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}
                    if early_stopping else None}
        else:
            best["bad_epochs"] += 1
        stopped = early_stopping and (all(best["stopped"]) if views is not None else best["bad_epochs"] >= config.patience)
        seconds += time.perf_counter() - began
        history.append({"epoch": epoch + 1, "loss": loss, "accuracy": accuracy, "val_accuracy": val_accuracy,
                        "val_nll": val_nll, "lr": lr, "seconds": time.perf_counter() - began,
                        **({"val_member_accuracy": members} if members is not None else {})})
        if tracker is not None:
            tracking.append(tracker.measure(epoch + 1, logits[0]))
        buffer = io.BytesIO()
        torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "rng": _rng_state(generator, torch.device(device)), "best": best,
                    "history": history, "seconds": seconds, "stopped": stopped, "device": str(device),
                    "tracking": tracking}, buffer)
        if parallel is None or distributed.ranks().main:
            atomic_write_bytes(state_path, buffer.getvalue())
        if on_epoch is not None:
            on_epoch(history[-1])
    if views is not None:  # each member's best weights
        with torch.no_grad():
            for key, view in views.items():
                view.copy_(best["state"][key])
        epochs = [epoch + 1 for epoch in best["epoch"]]
        return {"history": history, "weights_epoch": epochs, "best_val_epoch": epochs, "stopped_early": stopped,
                "members_stopped_early": best["stopped"], "train_seconds": seconds, "tracking": tracking}
    restore = early_stopping and best["state"] is not None
    if restore:
        model.load_state_dict(best["state"])
    return {"history": history, "weights_epoch": best["epoch"] + 1 if restore else len(history),
            "best_val_epoch": best["epoch"] + 1 if best["epoch"] >= 0 else None,
            "stopped_early": stopped, "train_seconds": seconds, "tracking": tracking}
