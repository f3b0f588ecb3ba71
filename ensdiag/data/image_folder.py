"""A folder of class folders (`root/<class>/…/<image>`, torchvision's ImageFolder layout) read as
untrusted: walked without following links to folders (a link to `.` or to /proc never ends, and
makes every image count many times), every image a regular file checked before it is opened (a
FIFO would block for ever), the count of images and every image's pixels bounded by the memory
budget before anything is decoded, and any failure of the decoder one line naming the file.

    images, labels = read_image_folder(Path("imgs"), (3, 32, 32), "--data")   # uint8 [N, C, H, W], int64 [N]

Classes are the class folders in sorted order (labels 0, 1, …); images are the files with an
image suffix anywhere below a class folder, in sorted order, as torchvision lists them.
"""

import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from ..budget import memory_budget, require
from ..errors import EnsdiagError
from ..io import open_regular, regular_file

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's
PATH_BYTES = 512  # what listing one image costs before it is decoded (its path, its label)
DECODE_BYTES_PER_PIXEL = 8  # a decoded image (up to 4 bytes a pixel) and its converted copy


def _refuse_link(path: Path, what: str):
    raise EnsdiagError(f"{what}: {path} is a link to a folder; ensdiag does not follow folder links in image folders "
                       "(a link can loop or lead out of the folder): copy or move the images in")


def _images_below(folder: Path, what: str, per_image: int, total: int) -> list[Path]:
    """The image files below `folder` (no folder link followed, each a regular file), in torchvision's
    order; `total` images were found before it, and the listing never outgrows the budget."""
    found, pending = [], [folder]
    while pending:
        place = pending.pop()
        try:
            entries = list(os.scandir(place))
        except OSError as error:
            raise EnsdiagError(f"{what}: cannot list {place} ({error.strerror or error})") from None
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink() and os.path.isdir(path):
                _refuse_link(path, what)
            if entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif path.suffix.lower() in IMAGE_SUFFIXES:
                found.append(regular_file(path, f"{what}:"))  # a FIFO or device named .png: refused before any open
                count = total + len(found)
                if count & (count - 1) == 0:  # at 1, 2, 4, … images
                    require(count * per_image, f"{what}: {count:,} images or more")
    return sorted(found, key=lambda path: (str(path.parent), path.name))  # as sorted(os.walk(...)) lists them


@contextmanager
def pixel_limit(budget: int):
    """PIL's decompression-bomb limit from the memory budget, while images are decoded: an image
    whose header claims more pixels than the budget decodes raises instead of warning (PIL's own
    limit is a fixed 89 million pixels, warned about, not refused)."""
    from PIL import Image
    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max(1, budget // DECODE_BYTES_PER_PIXEL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def read_image_folder(root: Path, input_shape, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images [N, C, H, W] resized to the model's input, int64 labels [N])."""
    from PIL import Image
    from torchvision import transforms
    channels, height, width = input_shape
    if channels not in (1, 3):
        raise EnsdiagError(f"{what} {root}: image folders give 1 or 3 channels, the model takes {channels}")
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as error:
        raise EnsdiagError(f"{what} {root}: cannot list it ({error.strerror or error})") from None
    classes = []
    for entry in entries:
        if entry.is_symlink() and os.path.isdir(entry.path):
            _refuse_link(Path(entry.path), f"{what} {root}")
        if entry.is_dir(follow_symlinks=False):
            classes.append(entry.name)
    if not classes:
        raise EnsdiagError(f"{what} {root}: not an image folder (no class folders in it: root/<class>/<image>)")
    paths, labels = [], []
    for label, name in enumerate(classes):
        found = _images_below(root / name, f"{what} {root}", channels * height * width + PATH_BYTES, len(paths))
        if not found:
            raise EnsdiagError(f"{what} {root}: not an image folder (class folder {name!r} holds no image: "
                               f"{', '.join(IMAGE_SUFFIXES)})")
        paths += found
        labels += [label] * len(found)
    convert = transforms.Grayscale() if channels == 1 else transforms.Lambda(lambda image: image.convert("RGB"))
    transform = transforms.Compose([convert, transforms.Resize((height, width)), transforms.PILToTensor()])
    images = torch.empty((len(paths), channels, height, width), dtype=torch.uint8)
    with pixel_limit(memory_budget()):
        for index, path in enumerate(paths):
            with open_regular(path, what) as handle:
                try:
                    with Image.open(handle) as image:
                        images[index] = transform(image)
                except (Image.DecompressionBombError, Image.DecompressionBombWarning):
                    raise EnsdiagError(f"{what} {path}: an image of more pixels than the memory budget decodes "
                                       "(set ENSDIAG_MEMORY_BUDGET=SIZE to allow more)") from None
                except Exception as error:  # a damaged or hostile file: whatever the decoder raises (even SyntaxError)
                    raise EnsdiagError(f"{what} {path}: not a readable image ({type(error).__name__})") from None
    return images, torch.tensor(labels, dtype=torch.long)
