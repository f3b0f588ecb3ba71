"""Loss and accuracy along the straight line between two members' weights.

θ(t) = (1 − t)·θ_a + t·θ_b for t on an even grid from 0 to 1 (θ_b aligned to θ_a first where
members are independent networks). Interpolated BatchNorm statistics describe no network, so
at every point, the ends included, they are recomputed on training images (the average of
near-equal batches' statistics in train mode, no gradient) before the network is evaluated; a network
without BatchNorm is evaluated as interpolated.

The barrier is the largest rise above the straight line between the ends:
max_t [L(θ(t)) − ((1 − t)·L(θ_a) + t·L(θ_b))], and the same with accuracy falling below its
line (the error barrier of Frankle et al. 2020). On the training loss (Ainsworth et al. 2023),
0 says the members lie in one linearly connected basin. On the *test* loss it says less:
averaging over-fitted members' weights tempers their over-confident logits, so the test loss
can dip below its line while the error rises, and a test-loss barrier of 0 is no evidence of
connectivity.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def interpolate(state_a: dict, state_b: dict, t: float) -> dict:
    return {key: (1 - t) * value + t * state_b[key] if value.is_floating_point() else value
            for key, value in state_a.items()}


@torch.no_grad()
def recompute_batchnorm(network, images: torch.Tensor, normalize, batch_size: int = 500) -> bool:
    """Reset and re-estimate every BatchNorm's running statistics on `images`; False if it has none."""
    norms = [m for m in network.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return False
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches, not an exponential one
    network.train()
    device = next(network.parameters()).device
    try:  # near-equal batches: none of a single image (BatchNorm needs two), none weighted more than the rest
        for batch in torch.tensor_split(images, math.ceil(len(images) / batch_size)):
            network(normalize(batch.to(device)))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        network.eval()
    return True


@torch.no_grad()
def loss_and_accuracy(network, images, labels, normalize, batch_size: int = 1000) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of a one-member network on labelled images."""
    network.eval()
    device = next(network.parameters()).device
    loss = correct = 0.0
    for start in range(0, len(images), batch_size):
        logits = network(normalize(images[start:start + batch_size].to(device)))[0].double()
        y = labels[start:start + batch_size].to(device)
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    return loss / len(images), correct / len(images)


def path(network, state_a, state_b, test, normalize, train_images=None, points: int = 11, train=None) -> dict:
    """{"t", "loss", "accuracy", "batchnorm_recomputed"} along θ(t) on the labelled `test` split,
    and "train_loss", "train_accuracy" on the labelled `train` sample when one is given;
    `network` is a plain network of the members' shape whose weights are overwritten."""
    ts = torch.linspace(0, 1, points).tolist()
    found = {"t": ts, "loss": [], "accuracy": [], **({"train_loss": [], "train_accuracy": []} if train is not None else {})}
    recomputed = False
    for t in ts:
        network.load_state_dict(interpolate(state_a, state_b, t))
        if train_images is not None:
            recomputed = recompute_batchnorm(network, train_images, normalize)
        for prefix, split in (("", test), ("train_", train)):
            if split is not None:
                loss, accuracy = loss_and_accuracy(network, split.images, split.labels, normalize)
                found[f"{prefix}loss"].append(loss)
                found[f"{prefix}accuracy"].append(accuracy)
    return {**found, "batchnorm_recomputed": recomputed}


def barrier(ts, values, higher_is_worse: bool = True) -> float:
    """The largest excess of `values` over the line between its ends (below it, for accuracy)."""
    first, last = values[0], values[-1]
    excess = [(v - ((1 - t) * first + t * last)) * (1 if higher_is_worse else -1) for t, v in zip(ts, values)]
    return max(excess)
