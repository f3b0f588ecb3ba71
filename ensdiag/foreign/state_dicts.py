"""State dicts read from files without running pickled code: `torch.load(weights_only=True)` behind
a zip-bomb check, plain `.safetensors`, a Lightning checkpoint's network; the member files given.

    state = read_state_dict("member0.pt")       # {name: tensor}, or a one-line error naming the file
"""

import os
import warnings
import zipfile
from pathlib import Path

import torch

from ..errors import EnsdiagError, InputTypeError, path_argument
from ..io import distinct_members, read_safetensors


def check_zip_sizes(path, inflation=8):
    """torch.save writes an uncompressed zip; one whose records inflate far beyond the file is refused
    before torch.load decompresses it (a zip bomb)."""
    if not zipfile.is_zipfile(path):
        return  # a legacy (non-zip) torch.save file: torch.load checks its record sizes itself
    try:
        with zipfile.ZipFile(path) as archive:
            total = sum(entry.file_size for entry in archive.infolist())
    except (zipfile.BadZipFile, OSError) as error:
        raise EnsdiagError(f"{path} is not a readable PyTorch checkpoint ({type(error).__name__})") from None
    if total > inflation * path.stat().st_size + 2**20:
        raise EnsdiagError(f"{path} decompresses to {total:,} bytes from {path.stat().st_size:,} (refused: a zip bomb?)")


def load_tensors(path, what="PyTorch checkpoint", mmap=False):
    """What `torch.load(weights_only=True)` reads from a file, or one line: torch's warnings (a
    pickle protocol it does not know) stay quiet, and a refused pickle is said as ensdiag says it,
    naming what the file wanted to run, never quoting torch's advice to turn the protection off."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # pickle.UnpicklingError and whatever a damaged zip raises
        text = str(error).strip()
        if "weights_only" in text or "GLOBAL" in text or "Unsupported" in text:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            wanted = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), "")
            raise EnsdiagError(f"{path} needs more than tensors to load{f' ({wanted[:120]})' if wanted else ''}; "
                               "ensdiag loads it with torch.load(weights_only=True) and never runs pickled code: "
                               "save a state_dict of tensors") from None
        reason = text.splitlines()[0] if text else type(error).__name__
        raise EnsdiagError(f"{path} is not a readable {what} ({reason[:160]})") from None


def read_state_dict(path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, read without running pickled code."""
    path = Path(path)
    if not path.is_file():
        raise EnsdiagError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    if path.suffix == ".safetensors":
        state, _ = read_safetensors(path, "checkpoint")
        return _network_keys(state)
    check_zip_sizes(path)
    loaded = load_tensors(path)
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):  # Lightning, and many trainers
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not loaded:
        raise EnsdiagError(f"{path} holds no state_dict (a dict of tensors), got {type(loaded).__name__}")
    state = {}
    for key, value in loaded.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise EnsdiagError(f"{path}: entry {str(key)[:60]!r} is not a named tensor; expected a state_dict")
        state[key] = value
    return _network_keys(state)


def _network_keys(state):
    """A Lightning module holds the network as `model` beside other modules (its loss's weight, a
    calibration scaler): keep the network's keys, without the prefix."""
    if any(key.startswith("model.") for key in state):
        state = {key[len("model."):]: value for key, value in state.items() if key.startswith("model.")}
    return state


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")


def member_files(paths):
    """Paths as given, each file once (a file given twice, or through a link, would be two identical
    members); a folder stands for its checkpoint files, in name order."""
    distinct_members(paths, "checkpoint")
    if len(paths) == 1 and paths[0].is_dir():
        files = sorted(p for p in paths[0].iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
        if not files:
            raise EnsdiagError(f"{paths[0]} holds no checkpoint files ({', '.join(CHECKPOINT_SUFFIXES)})")
        return files
    return paths


def path_list(paths) -> list[Path]:
    """One path or a list of them (errors.path_argument each)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not paths:
        raise InputTypeError(f"paths must be a checkpoint path or a non-empty list of them, got {type(paths).__name__}")
    return [path_argument(path, "checkpoint") for path in paths]
