"""Device-resident batching: the whole split lives on the device as one tensor.

No DataLoader workers in the hot loop: per-epoch shuffles are `randperm` on the device
(one independent permutation per member for Deep Ensembles), batches are index gathers,
and CIFAR augmentation (4-pixel zero-pad random crop before normalisation, horizontal
flip) runs on the device on whole batches, as part of the same gather (`TrainingImages`).
"""

import torch

from ..errors import EnsdiagError


def epoch_permutations(n: int, num_orders: int, generator: torch.Generator, device) -> torch.Tensor:
    """[num_orders, n]: one independent random order of 0..n-1 per row."""
    return torch.stack([torch.randperm(n, generator=generator, device=device) for _ in range(num_orders)])


def batch_indices(orders: torch.Tensor, batch_size: int):
    """Slice [m, n] orders into [m, b] index batches (the last one may be smaller)."""
    for start in range(0, orders.shape[1], batch_size):
        yield orders[:, start:start + batch_size]


def crop_flip_padded(padded: torch.Tensor, index: torch.Tensor, generator: torch.Generator, padding: int) -> torch.Tensor:
    """Random crops (and mirror images) of the already padded images `padded[index]`.

    One gather picks the examples, crops and flips, straight from the whole padded split; the
    result [N, C, H, W] has channels_last strides, which is what convolutions want on CUDA."""
    n, device = len(index), padded.device
    h, w = padded.shape[2] - 2 * padding, padded.shape[3] - 2 * padding
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    rows = top[:, None] + torch.arange(h, device=device)  # [N, H]
    cols = torch.arange(w, device=device).expand(n, w)
    mirrored = torch.rand(n, generator=generator, device=device) < 0.5
    cols = torch.where(mirrored[:, None], cols.flip(1), cols)
    cols = left[:, None] + cols  # [N, W]
    # advanced indices around a slice put their broadcast shape first: [N, H, W, C]
    return padded[index[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


class TrainingImages:
    """A training split made ready once, so that a batch is a single gather.

    The images are normalised up front and stored in the compute dtype (bf16 when training
    under bf16 autocast, which would cast them anyway); with augmentation they are also
    zero-padded (in raw scale, as docs/conventions.md says) before normalising, so a batch's random
    crops come straight out of the stored split."""

    def __init__(self, images, labels, normalize, augment=False, dtype=torch.float32, padding=4):
        self.padding = padding if augment else 0
        if self.padding:
            images = torch.nn.functional.pad(images, (padding,) * 4)
        self.images = normalize(images).to(dtype)
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def batch(self, index: torch.Tensor, generator: torch.Generator):
        """index [m, b] -> (images [m, b, C, H, W], labels [m, b])."""
        flat = index.flatten()
        images = (crop_flip_padded(self.images, flat, generator, self.padding) if self.padding
                  else self.images.index_select(0, flat))
        return images.unflatten(0, index.shape), self.labels.index_select(0, flat).view(index.shape)


class Normalize:
    """(x - mean) / std per channel, on float images in [0, 1]."""

    def __init__(self, mean, std, device="cpu"):
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32, device=device)[:, None, None]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] != len(self.mean):  # broadcasting would silently mix channels
            raise EnsdiagError(f"images of shape {tuple(images.shape)} cannot be normalised per channel with "
                               f"{len(self.mean)} means and stds: give images [N, {len(self.mean)}, H, W]")
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        return (images - self.mean) / self.std
