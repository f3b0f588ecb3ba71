"""Members' representations, collected by forward hooks in batches and reduced to CKA moments.

Each member runs as its own plain network (`member_network(i)`), so every method's members
are read the same way. The architecture names its representation points
(`representation_points()`: the MLP's linear layers, ResNet-18's stem, residual blocks and
head). A convolutional feature map [C, H, W] is averaged over its positions to C features:
it keeps the moments at (k·C)² numbers per layer (Kornblith et al. flatten instead, which
costs (C·H·W)² or n² memory); the choice is stated in every result. Outputs are read as
[B, C, H, W] (ensdiag's and torchvision's convolutional networks) and [B, T, D] as tokens
(averaged over T); a point may name its layout instead (`pooled`: channels-last maps of
Swin-style networks), as `ensdiag.as_ensemble(…, layers={name: layout})` does.
"""

import torch

from .cka import Moments

MAX_MOMENT_BYTES = 2**30  # float64 moments of all layers together; layers beyond it are skipped


def representation_points(network) -> dict:
    """{name: (module, layout)}: the network's own points (a user's, `as_ensemble(…, layers=...)`), else
    the architecture's; layout None reads [B, C, ...] as channels-first and [B, T, D] as tokens."""
    if hasattr(network, "representation_points"):
        points = network.representation_points()
    elif hasattr(network.body, "representation_points"):
        points = network.body.representation_points()
    else:
        return {}
    return {name: point if isinstance(point, tuple) else (point, None) for name, point in points.items()}


def pooled(output, layout=None) -> torch.Tensor:
    """[B, features] from a module's output: a convolutional map averaged over its positions
    (channels-first [B, C, H, W] or channels-last [B, H, W, C]), a token sequence [B, T, D] over
    its tokens; the first tensor of a tuple output (attention modules return several)."""
    if isinstance(output, (tuple, list)):
        output = next(item for item in output if isinstance(item, torch.Tensor))
    output = output.float()
    if output.dim() <= 2:
        return output.reshape(len(output), -1)
    if layout is None:
        layout = "tokens" if output.dim() == 3 else "channels-first"
    if layout == "channels-first":
        return output.mean(dim=tuple(range(2, output.dim())))
    return output.mean(dim=tuple(range(1, output.dim() - 1)))  # channels-last maps and token sequences


MAX_KEPT_BYTES = 2**28  # features kept for CKA's interval (float32, every layer and member): fewer examples beyond


@torch.no_grad()
def layer_cka(networks, images, normalize, batch_size: int = 500, retain: int = 0) -> dict:
    """{"layers": {layer: {"linear": [k, k], "debiased": [k, k], "features": d}}, "skipped", "kept"}
    over `images` for the member networks; layers whose moments would pass `MAX_MOMENT_BYTES` are
    listed under "skipped". "kept": {layer: [k tensors [m, d]]}, the pooled features of the first
    m ≤ `retain` examples (as many as fit `MAX_KEPT_BYTES`), for the interval (geometry/resampled.py)."""
    points = [representation_points(network) for network in networks]
    names = list(points[0])
    device = next(networks[0].parameters()).device
    moments = {name: Moments() for name in names}
    captured: dict[str, torch.Tensor] = {}

    def keep(name, layout):
        def hook(module, inputs, output):
            captured[name] = pooled(output, layout)
        return hook

    handles = [module.register_forward_hook(keep(name, layout)) for network_points in points
               for name, (module, layout) in network_points.items()]
    skipped, budget = {}, MAX_MOMENT_BYTES
    kept: dict[str, list] = {}
    try:
        for network in networks:
            network.eval()
        for start in range(0, len(images), batch_size):
            x = normalize(images[start:start + batch_size].to(device))
            per_member = []
            for network in networks:
                captured.clear()
                network(x)
                per_member.append(dict(captured))
            for name in names:
                if name in skipped or any(name not in features for features in per_member):
                    continue
                if moments[name].n == 0:  # the first batch decides whether a layer fits
                    width = sum(features[name].shape[1] for features in per_member)
                    size = 8 * width * (width + len(networks) + 1)
                    if size > budget:
                        skipped[name] = f"{width} features over {len(networks)} members need {size / 2**30:.1f} GiB of moments"
                        continue
                    budget -= size
                moments[name].add([features[name] for features in per_member])  # on the model's device
            if start == 0 and retain:  # as many examples as the kept features' bytes allow
                width = sum(features[name].shape[1] for features in per_member for name in names
                            if name not in skipped and name in features)
                retain = min(retain, MAX_KEPT_BYTES // max(4 * width, 1))
            room = retain - start
            if room > 0:
                for name in names:
                    if name not in skipped and all(name in features for features in per_member):
                        kept.setdefault(name, [[] for _ in networks])
                        for chunks, features in zip(kept[name], per_member):
                            chunks.append(features[name][:room].float().cpu())
    finally:
        for handle in handles:
            handle.remove()
    layers = {}
    for name in names:
        if moments[name].n == 0 and name not in skipped:
            skipped[name] = "did not run in evaluation mode (an auxiliary head)"
        if name in skipped:
            continue
        linear, debiased = moments[name].cka()
        layers[name] = {"linear": linear, "debiased": debiased, "features": moments[name].widths[0]}
    kept = {name: [torch.cat(chunks) for chunks in members] for name, members in kept.items() if name in layers}
    return {"layers": layers, "skipped": skipped, "kept": kept}
