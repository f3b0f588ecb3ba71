"""Model x datasets -> member logits per split (the file that carries them: predictions.py)."""

import torch

from .nn.model import flush_denormals
from .predictions import PREDICTIONS_FORMAT, load_predictions, save_predictions, with_pooled_shift  # noqa: F401


@torch.no_grad()
def predict_split(model, images, normalize, device, batch_size=1000, autocast=False) -> torch.Tensor:
    """Member logits float32 [k, N, C] for images [N, ...] (uint8 or float in [0, 1])."""
    model.eval()
    chunks = []
    for start in range(0, len(images), batch_size):
        x = normalize(images[start:start + batch_size].to(device, non_blocking=True))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            chunks.append(model(x).float())
    return torch.cat(chunks, dim=1).cpu()


def predict(model, splits, normalize, device, seed=0, autocast=False) -> dict[str, dict]:
    """{split: {"logits": [k,N,C], "labels": [N] | None}}; seeded, so MC Dropout repeats."""
    flush_denormals()
    torch.manual_seed(seed)
    return {name: {"logits": predict_split(model, split.images, normalize, device, autocast=autocast),
                   "labels": split.labels}
            for name, split in splits.items()}
