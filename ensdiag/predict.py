"""Model x datasets -> member logits per split (the file that carries them: predictions.py)."""

import torch

from . import distributed
from .nn.model import flush_denormals
from .precision import exact_math
from .predictions import PREDICTIONS_FORMAT, load_predictions, save_predictions, with_pooled_shift  # noqa: F401


@torch.no_grad()
def predict_split(model, images, normalize, device, batch_size=1000) -> torch.Tensor:
    """Member logits float32 [k, N, C] for images [N, ...] (uint8 or float in [0, 1]), computed in
    fp32 without TF32 whatever the training used (precision.py)."""
    model.eval()
    chunks = []
    with exact_math():
        for start in range(0, max(len(images), 1), batch_size):  # no images: one empty batch gives [k, 0, C]
            x = normalize(images[start:start + batch_size].to(device, non_blocking=True))
            chunks.append(model(x).float())
    return torch.cat(chunks, dim=1).cpu()


def predict(model, splits, normalize, device, seed=0, spread=False) -> dict[str, dict]:
    """{split: {"logits": [k,N,C], "labels": [N] | None}}; seeded, so MC Dropout repeats.

    With `spread` (under torchrun) every rank predicts its contiguous share of each split and
    every rank gets all the logits back, in order: large shift sets (CIFAR-10-C's 950,000
    images) take 1/world of the time. MC Dropout's masks then differ from one process's
    (each rank draws its own from the seed and its rank), the other methods' logits do not."""
    flush_denormals()
    # spread over ranks, each draws its own MC Dropout masks (the same seed would repeat rows' masks)
    torch.manual_seed(seed + 1_000_003 * distributed.ranks().rank if spread else seed)
    result = {}
    for name, split in splits.items():
        if spread:
            local = predict_split(model, split.images[distributed.shard(len(split.images))], normalize, device)
            logits = distributed.gather_rows(local.to(device), dim=1).cpu()
        else:
            logits = predict_split(model, split.images, normalize, device)
        result[name] = {"logits": logits, "labels": split.labels}
    return result
