"""The embedded default (digits, procedural shift, natural-image patches) and batching."""

import pytest
import torch
import torch.nn.functional as F

from ensdiag.data import get_dataset
from ensdiag.data.batching import batch_indices, crop_flip_padded, epoch_permutations
from ensdiag.data.corruptions import CORRUPTIONS, corrupt
from ensdiag.data.sets.digits import natural_patches


def test_digits_split_is_fixed_and_disjoint():
    train, test = get_dataset("digits").load(split="train"), get_dataset("digits").load(split="test")
    assert len(train) + len(test) == 1797 and len(test) == 359
    assert torch.equal(test.images, get_dataset("digits").load(split="test").images)
    pixels = lambda split: {tuple(x.flatten().tolist()) for x in split.images}  # noqa: E731
    assert len(pixels(train) & pixels(test)) < 5  # (a few digits are exact duplicates in sklearn)
    assert 0 <= float(train.images.min()) and float(train.images.max()) <= 1


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruption_is_deterministic_keeps_shape_range_and_changes_images(name):
    images = get_dataset("digits").load(split="test").images[:64]
    once, again, other = corrupt(images, name, 3), corrupt(images, name, 3), corrupt(images, name, 4)
    assert torch.equal(once, again)
    assert once.shape == images.shape and once.dtype == images.dtype
    assert float(once.min()) >= 0 and float(once.max()) <= 1
    changed = (once - images).abs().flatten(1).amax(1) > 0.05
    assert changed.float().mean() > 0.9, f"{name} leaves most images unchanged"
    if name not in ("brightness", "contrast", "blur"):  # the deterministic ones ignore the seed
        assert not torch.equal(once, other)


def test_digits_c_holds_every_corruption_with_test_labels():
    shifted = get_dataset("digits-c").load()
    test = get_dataset("digits").load(split="test")
    assert list(shifted) == list(CORRUPTIONS)
    for split in shifted.values():
        assert torch.equal(split.labels, test.labels)


def test_natural_patches_are_real_photograph_pixels():
    from sklearn.datasets import load_sample_images
    patches, origins = natural_patches(n=6)
    photos = load_sample_images().images
    for patch, (photo, top, left) in zip(patches, origins):
        rgb = torch.tensor(photos[photo][top:top + 32, left:left + 32], dtype=torch.float32)
        grey = (rgb @ torch.tensor([0.299, 0.587, 0.114])) / 255
        expected = F.avg_pool2d(grey[None, None], 4)[0]
        torch.testing.assert_close(patch, expected)
    assert patches.std() > 0.05  # not blank
    ood = get_dataset("natural-patches").load()
    assert ood.labels is None and ood.images.shape[1:] == (1, 8, 8)


def test_per_member_shuffles_differ_and_cover_every_example_once():
    g = torch.Generator().manual_seed(0)
    orders = epoch_permutations(103, 4, g, "cpu")
    batches = list(batch_indices(orders, 16))
    assert [b.shape[1] for b in batches] == [16] * 6 + [7]
    seen = torch.cat(batches, dim=1)
    for member in seen:
        assert sorted(member.tolist()) == list(range(103))
    assert not torch.equal(orders[0], orders[1])


def random_crop_flip(images, generator, padding=4):
    """Zero-pad raw images (before normalisation: the padding is zero in their own scale), then the
    training pipeline's random crop and mirror of every one of them."""
    padded = F.pad(images, (padding,) * 4)
    return crop_flip_padded(padded, torch.arange(len(images)), generator, padding)


def test_crop_flip_keeps_shape_is_seeded_and_really_crops():
    images = torch.rand(64, 3, 32, 32)
    a = random_crop_flip(images, torch.Generator().manual_seed(1))
    b = random_crop_flip(images, torch.Generator().manual_seed(1))
    assert a.shape == images.shape and torch.equal(a, b)
    assert not torch.equal(a, images)
    assert (a == 0).flatten(1).any(1).float().mean() > 0.5  # zero padding shows up in most crops


def test_crop_flip_matches_pad_crop_flip_by_hand():
    images = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).view(2, 1, 5, 5)
    g = torch.Generator().manual_seed(7)
    out = random_crop_flip(images, g, padding=2)
    g = torch.Generator().manual_seed(7)  # replay the same draws
    top, left = torch.randint(0, 5, (2,), generator=g), torch.randint(0, 5, (2,), generator=g)
    mirrored = torch.rand(2, generator=g) < 0.5
    padded = F.pad(images, (2, 2, 2, 2))
    for i in range(2):
        crop = padded[i, :, top[i]:top[i] + 5, left[i]:left[i] + 5]
        torch.testing.assert_close(out[i], crop.flip(-1) if mirrored[i] else crop)


# --- made once: in the process and on disk (data/cache.py) -----------------------------------------

def test_digits_c_lists_every_corruption_without_importing_them():
    from ensdiag.data.sets.digits import CORRUPTION_NAMES
    assert CORRUPTION_NAMES == tuple(CORRUPTIONS)


def _fresh_load(cache, monkeypatch):
    """The embedded sets as a new process would read them from the cache folder `cache`."""
    from ensdiag.data import cache as C
    monkeypatch.setenv("ENSDIAG_CACHE", str(cache))
    C._made.cache_clear()
    return {name: get_dataset(name).load(split="test") for name in ("digits", "digits-c", "natural-patches")}


def test_the_embedded_sets_are_cached_read_back_equal_and_remade_when_the_cache_is_damaged(tmp_path, monkeypatch):
    from ensdiag.data.corruptions import corrupt
    made = _fresh_load(tmp_path, monkeypatch)
    files = sorted((tmp_path / "made").glob("*.safetensors"))
    assert [f.name.rsplit("-", 1)[0] for f in files] == ["digits", "digits-c", "natural-patches"]
    again = _fresh_load(tmp_path, monkeypatch)  # read from the files
    assert torch.equal(again["digits"].images, made["digits"].images)
    assert torch.equal(again["natural-patches"].images, natural_patches()[0])
    assert torch.equal(again["digits-c"]["blur"].images, corrupt(made["digits"].images, "blur", 2))  # its seed: 0 + index
    # a damaged file, a file of other shapes, values out of range: each is made again, never believed
    from safetensors.torch import save_file
    digits_c = next(f for f in files if f.name.startswith("digits-c"))
    for damage in (lambda f: f.write_bytes(b"not safetensors"),
                   lambda f: save_file({"blur": torch.zeros(3, 1, 8, 8)}, str(f)),
                   lambda f: save_file({name: torch.full((359, 1, 8, 8), 7.0) for name in CORRUPTIONS}, str(f))):
        damage(digits_c)
        found = _fresh_load(tmp_path, monkeypatch)["digits-c"]
        assert set(found) == set(CORRUPTIONS) and torch.equal(found["blur"].images, made["digits-c"]["blur"].images)


def test_an_unwritable_cache_only_costs_the_time_to_make_the_sets(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    found = _fresh_load(blocked, monkeypatch)
    assert len(found["digits"]) == 359 and len(found["digits-c"]) == len(CORRUPTIONS)
