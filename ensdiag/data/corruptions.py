"""Procedural corruptions for the embedded default ("digits-C (procedural)").

In the spirit of MNIST-C, written in torch: each corruption maps float images
[N, C, H, W] in [0, 1] and a seeded `torch.Generator` to corrupted images of the same
shape, dtype and range. Same seed, same output. One fixed strength each, chosen so that
8x8 digits stay mostly recognisable while a model's accuracy visibly drops.
"""

import math

import torch
import torch.nn.functional as F
from torchvision.transforms.v2.functional import gaussian_blur

from ..registry import Registry

CORRUPTIONS = Registry("corruption")  # name -> corrupt(images, generator), in the order defined


def corruption(fn):
    return CORRUPTIONS.add(fn.__name__, fn)


def _uniform(n, low, high, g):
    return torch.rand(n, generator=g) * (high - low) + low


def _random_sign(n, g):
    return torch.randint(0, 2, (n,), generator=g).float() * 2 - 1


def _affine(x, *rows):
    """Resample x through per-image 2x3 affine maps (output -> input, normalised coordinates), each
    of the two rows three [N] tensors; clamped to [0, 1]."""
    theta = torch.stack([torch.stack(row, 1) for row in rows], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False).clamp(0, 1)


@corruption
def gaussian_noise(x, g):
    return (x + 0.3 * torch.randn(x.shape, generator=g)).clamp(0, 1)


@corruption
def impulse_noise(x, g):
    hit = torch.rand(x.shape, generator=g) < 0.12
    salt = torch.rand(x.shape, generator=g) < 0.5
    return torch.where(hit, salt.float(), x)


@corruption
def blur(x, g):
    return gaussian_blur(x, kernel_size=[3, 3], sigma=[1.0, 1.0]).clamp(0, 1)


@corruption
def rotate(x, g):
    angle = _random_sign(len(x), g) * _uniform(len(x), 25, 45, g) * math.pi / 180
    cos, sin, zero = angle.cos(), angle.sin(), torch.zeros(len(x))
    return _affine(x, (cos, -sin, zero), (sin, cos, zero))


@corruption
def shear(x, g):
    s = _random_sign(len(x), g) * _uniform(len(x), 0.4, 0.7, g)
    one, zero = torch.ones(len(x)), torch.zeros(len(x))
    return _affine(x, (one, s, zero), (zero, one, zero))


@corruption
def scale(x, g):
    zoom_out = torch.rand(len(x), generator=g) < 0.5
    factor = torch.where(zoom_out, _uniform(len(x), 1.5, 1.8, g), _uniform(len(x), 0.6, 0.7, g))
    zero = torch.zeros(len(x))
    return _affine(x, (factor, zero, zero), (zero, factor, zero))


@corruption
def translate(x, g):
    # normalised coordinates span 2 units over the width: a shift of 2*p/W moves p pixels
    pixels = _random_sign(len(x), g)[:, None] * _uniform(len(x), 0.75, 1.25, g)[:, None] * torch.ones(1, 2)
    shift = 2 * pixels / torch.tensor([x.shape[-1], x.shape[-2]])
    one, zero = torch.ones(len(x)), torch.zeros(len(x))
    return _affine(x, (one, zero, shift[:, 0]), (zero, one, shift[:, 1]))


@corruption
def brightness(x, g):
    return (x + 0.45).clamp(0, 1)


@corruption
def contrast(x, g):
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return ((x - mean) * 0.3 + mean).clamp(0, 1)


@corruption
def stripe(x, g):
    """A bright full-length line through a random row or column of each image."""
    n, _, h, w = x.shape
    vertical = torch.rand(n, generator=g) < 0.5
    row = torch.randint(0, h, (n,), generator=g)
    col = torch.randint(0, w, (n,), generator=g)
    rows = torch.arange(h)[None, :, None] == row[:, None, None]
    cols = torch.arange(w)[None, None, :] == col[:, None, None]
    mask = torch.where(vertical[:, None, None], cols.expand(n, h, w), rows.expand(n, h, w))
    return torch.where(mask[:, None], torch.ones_like(x), x)


def corrupt(images: torch.Tensor, name: str, seed: int) -> torch.Tensor:
    """One named corruption of float images in [0, 1], deterministic for the seed."""
    generator = torch.Generator().manual_seed(seed)
    return CORRUPTIONS[name](images.float(), generator).to(images.dtype)
