"""Device-resident batching: the whole split lives on the device as one tensor.

No DataLoader workers in the hot loop: per-epoch shuffles are `randperm` on the device
(one independent permutation per member for Deep Ensembles), batches are index gathers,
and CIFAR augmentation (4-pixel zero-pad random crop before normalisation, horizontal
flip) runs on the device on whole batches.
"""

import torch


def epoch_permutations(n: int, num_orders: int, generator: torch.Generator, device) -> torch.Tensor:
    """[num_orders, n]: one independent random order of 0..n-1 per row."""
    return torch.stack([torch.randperm(n, generator=generator, device=device) for _ in range(num_orders)])


def batch_indices(orders: torch.Tensor, batch_size: int):
    """Slice [m, n] orders into [m, b] index batches (the last one may be smaller)."""
    for start in range(0, orders.shape[1], batch_size):
        yield orders[:, start:start + batch_size]


def random_crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4, flip: bool = True) -> torch.Tensor:
    """Zero-pad by `padding`, crop back to H x W at a random offset, mirror with p = 0.5.

    One gather does crop and flip for the whole batch [N, C, H, W]; the padding is zero in
    the images' own scale, so apply this before normalisation (protocol.md §3)."""
    n, _, h, w = images.shape
    device = images.device
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    rows = top[:, None] + torch.arange(h, device=device)  # [N, H]
    cols = torch.arange(w, device=device).expand(n, w)
    if flip:
        mirrored = torch.rand(n, generator=generator, device=device) < 0.5
        cols = torch.where(mirrored[:, None], cols.flip(1), cols)
    cols = left[:, None] + cols  # [N, W]
    batch = torch.arange(n, device=device)[:, None, None]
    # advanced indices around a slice put their broadcast shape first: [N, H, W, C]
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


class Normalize:
    """(x - mean) / std per channel, on float images in [0, 1]."""

    def __init__(self, mean, std, device="cpu"):
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32, device=device)[:, None, None]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        return (images - self.mean) / self.std
