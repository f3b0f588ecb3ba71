"""The embedded default: scikit-learn's 8x8 digits, with honest shift and OOD companions.

- `digits`: scikit-learn's handwritten digits (1,797 images, 8x8, 17 grey levels), split
  into a fixed test set (seed 0, 20 %) and a training set; the validation split is held
  out of the training set by the run's seed, like every preset.
- `digits-c`: "digits-C (procedural)" — the digits test split under each procedural
  corruption of corruptions.py. Not MNIST-C.
- `natural-patches`: "natural-image patches" — real pixels from the two photographs that
  ship with scikit-learn (`load_sample_images`), random 32x32 crops turned grey and
  averaged down to 8x8. Not FashionMNIST.
"""

from ..cache import images_in_unit_range, made
from ..registry import Dataset, Split, register_dataset

TEST_FRACTION, SPLIT_SEED = 0.2, 0
NUM_PATCHES, PATCH_SIZE, PATCH_SEED = 500, 32, 0
NUM_DIGITS = 1797


def _load_digits():
    import torch
    from sklearn.datasets import load_digits
    bunch = load_digits()
    return {"images": torch.tensor(bunch.images, dtype=torch.float32).div_(16).unsqueeze(1),
            "labels": torch.tensor(bunch.target, dtype=torch.int64)}


def _digits_check(tensors) -> bool:
    import torch
    labels = tensors.get("labels")
    return (images_in_unit_range({"images": tensors.get("images", torch.empty(0))}, {"images": (NUM_DIGITS, 1, 8, 8)})
            and set(tensors) == {"images", "labels"} and labels.dtype == torch.int64 and labels.shape == (NUM_DIGITS,)
            and bool(((labels >= 0) & (labels < 10)).all()))


class EmbeddedDataset(Dataset):
    """Ships inside scikit-learn (or is made from what does): no files, always found."""

    def expected_files(self, data_dir):
        return []

    def locate(self, data_dir):
        return "embedded in scikit-learn"


@register_dataset
class Digits(EmbeddedDataset):
    order = 30  # where `ensdiag datasets` lists it
    name, role, title = "digits", "ID (embedded default)", "digits (scikit-learn)"
    how_to_get = "Ships with scikit-learn; nothing to download."

    def load(self, data_dir=None, split="test", download=False):
        from ..preset import holdout
        # scikit-learn's digits [1797, 1, 8, 8] in [0, 1], read from scikit-learn once (importing it takes seconds)
        # and from ensdiag's cache after that (data/cache.py)
        found = made("digits", {}, _load_digits, _digits_check)
        images, labels = found["images"], found["labels"]
        train, test = holdout(len(images), TEST_FRACTION, SPLIT_SEED)  # held out as a run holds out its validation
        index = train if split == "train" else test
        return Split(images[index].clone(), labels[index].clone(), f"scikit-learn digits, {split} split")


@register_dataset
class DigitsC(EmbeddedDataset):
    order = 31  # where `ensdiag datasets` lists it
    name, role, title = "digits-c", "shift for digits", "digits-C (procedural)"
    how_to_get = "Made on the fly from the digits test split; nothing to download."

    def load(self, data_dir=None, split="test", download=False, corruptions=None, seed=0):
        base = Digits().load(split=split)
        chosen = list(CORRUPTION_NAMES) if corruptions is None else list(corruptions)
        found = made("digits-c", {"split": split, "seed": seed, "corruptions": chosen}, _corrupted, _corrupted_check)
        return {name: Split(found[name].clone(), base.labels.clone(), f"digits-C (procedural) {name}") for name in chosen}


CORRUPTION_NAMES = ("gaussian_noise", "impulse_noise", "blur", "rotate", "shear", "scale", "translate", "brightness",
                    "contrast", "stripe")  # corruptions.py's, in its order (a test checks): no torchvision import to list them


def _corrupted(split: str, seed: int, corruptions: list) -> dict:
    """make() of digits-C: the split under each corruption."""
    from ..corruptions import corrupt
    images = Digits().load(split=split).images
    return {name: corrupt(images, name, seed + index) for index, name in enumerate(corruptions)}


def _corrupted_check(tensors, split: str, seed: int, corruptions: list) -> bool:
    shape = tuple(Digits().load(split=split).images.shape)
    return images_in_unit_range(tensors, {name: shape for name in corruptions})


def natural_patches(n=NUM_PATCHES, seed=PATCH_SEED, size=PATCH_SIZE):
    """Grey 8x8 patches of scikit-learn's sample photographs and where each came from."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_sample_images
    photos = [torch.tensor(p).permute(2, 0, 1).float() for p in load_sample_images().images]
    weights = torch.tensor([0.299, 0.587, 0.114])[:, None, None]  # ITU-R BT.601 luma
    greys = [(p * weights).sum(0, keepdim=True) / 255 for p in photos]
    g = torch.Generator().manual_seed(seed)
    patches, origins = [], []
    for i in range(n):
        photo = i % len(greys)
        _, h, w = greys[photo].shape
        top = int(torch.randint(0, h - size + 1, (1,), generator=g))
        left = int(torch.randint(0, w - size + 1, (1,), generator=g))
        crop = greys[photo][:, top:top + size, left:left + size]
        patches.append(F.avg_pool2d(crop[None], size // 8)[0])
        origins.append((photo, top, left))
    return torch.stack(patches).clamp_(0, 1), origins


@register_dataset
class NaturalPatches(EmbeddedDataset):
    order = 32  # where `ensdiag datasets` lists it
    name, role, title = "natural-patches", "OOD for digits", "natural-image patches"
    how_to_get = "Cut from the photographs that ship with scikit-learn; nothing to download."

    def load(self, data_dir=None, split="test", download=False):
        images = made("natural-patches", {"n": NUM_PATCHES, "seed": PATCH_SEED, "size": PATCH_SIZE}, _patches,
                      _patches_check)["images"]
        return Split(images.clone(), None, f"natural-image patches ({NUM_PATCHES} from scikit-learn's sample photographs)")


def _patches(n: int, seed: int, size: int) -> dict:
    return {"images": natural_patches(n, seed, size)[0]}


def _patches_check(tensors, n: int, seed: int, size: int) -> bool:
    return images_in_unit_range(tensors, {"images": (n, 1, 8, 8)})

