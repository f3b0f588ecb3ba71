"""LoRA adapter folders as PEFT saves them: `adapter_config.json` beside `adapter_model.safetensors`
(or `adapter_model.bin`). Reading and checking the configs needs no tensor, so every check here
runs before torch is imported, and members that cannot form one ensemble are refused at once.

    adapters = read_adapter_folders([Path("run-a"), Path("run-b")])   # [AdapterConfig], checked alike
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsdiagError

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
MAX_CONFIG_BYTES = 1 << 20  # PEFT's configs are ~1 KiB; anything near this is not one
MAX_RANK = 1 << 16


@dataclass(frozen=True)
class AdapterConfig:
    """What ensdiag needs from one adapter's config, checked."""

    folder: Path
    weights: Path
    rank: int
    alpha: float
    use_rslora: bool
    base_model: str | None
    target_modules: tuple[str, ...] | str | None  # PEFT: a list of names, or one regular expression
    fan_in_fan_out: bool

    @property
    def scale(self) -> float:
        """PEFT's scaling of B·A: α/r, or α/√r with rank-stabilised LoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def is_adapter_folder(path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def adapter_folders(paths) -> bool:
    """Whether the command's inputs are LoRA adapter folders (all of them; a mix is refused)."""
    found = [is_adapter_folder(path) for path in paths]
    if any(found) and not all(found):
        odd = next(path for path, ok in zip(paths, found) if not ok)
        raise EnsdiagError(f"{odd} is not a LoRA adapter folder (no {CONFIG_FILE}) but other inputs are: "
                           "give only adapter folders, or only model files")
    return bool(found) and all(found)


def read_adapter_folders(folders) -> list[AdapterConfig]:
    """Every folder's config, checked, and checked to agree with the first's."""
    folders = [Path(folder) for folder in folders]
    if len(folders) < 2:
        raise EnsdiagError(f"a LoRA ensemble needs k ≥ 2 adapter folders, got {len(folders)}")
    if len({folder.resolve() for folder in folders}) != len(folders):
        raise EnsdiagError("the same adapter folder is given twice: its members would be one model")
    configs = [read_adapter_config(folder) for folder in folders]
    for config in configs[1:]:
        _check_alike(configs[0], config)
    return configs


def read_adapter_config(folder: Path) -> AdapterConfig:
    path = folder / CONFIG_FILE
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise EnsdiagError(f"{path} is {path.stat().st_size:,} bytes, not a PEFT adapter config")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except EnsdiagError:
        raise  # already one line for the user
    except (OSError, ValueError) as error:
        raise EnsdiagError(f"{path} is not readable JSON ({type(error).__name__})") from None
    if not isinstance(data, dict):
        raise EnsdiagError(f"{path} holds a JSON {type(data).__name__}, not a PEFT adapter config")
    if data.get("peft_type", "LORA") != "LORA":
        raise EnsdiagError(f"{path}: peft_type {str(data.get('peft_type'))[:40]!r} is not LORA")
    refused = {"use_dora": "DoRA rescales W's columns, so its update is not B·A",
               "lora_bias": "a trained bias on lora_B is not part of B·A"}
    for key, why in refused.items():
        if data.get(key) not in (None, False):
            raise EnsdiagError(f"{path}: {key} is set; ensdiag reads plain LoRA only ({why})")
    for key in ("rank_pattern", "alpha_pattern"):
        if data.get(key) not in (None, {}):
            raise EnsdiagError(f"{path}: {key} gives some modules their own rank or α; ensdiag reads adapters "
                               "with one rank and one α for every module")
    rank = data.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_RANK:
        raise EnsdiagError(f"{path}: r must be an integer from 1 to {MAX_RANK}, got {str(rank)[:40]}")
    alpha = data.get("lora_alpha")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha == 0:
        raise EnsdiagError(f"{path}: lora_alpha must be a finite non-zero number, got {str(alpha)[:40]}")
    flags = {}
    for key in ("use_rslora", "fan_in_fan_out"):
        if not isinstance(data.get(key, False), bool):
            raise EnsdiagError(f"{path}: {key} must be true or false")
        flags[key] = data.get(key, False)
    base = data.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise EnsdiagError(f"{path}: base_model_name_or_path must be a string")
    return AdapterConfig(folder, _weights_file(folder), rank, float(alpha), flags["use_rslora"], base or None,
                         _targets(path, data.get("target_modules")), flags["fan_in_fan_out"])


def _targets(path, targets):
    if targets is None or isinstance(targets, str):
        return targets
    if not isinstance(targets, list) or not all(isinstance(name, str) for name in targets):
        raise EnsdiagError(f"{path}: target_modules must be a list of module names or one pattern")
    return tuple(sorted(set(targets)))  # PEFT writes a set: its order means nothing


def _weights_file(folder: Path) -> Path:
    found = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not found:
        raise EnsdiagError(f"{folder} has {CONFIG_FILE} but no {' or '.join(WEIGHT_FILES)}")
    return found[0]  # PEFT loads the safetensors file when both are there, and so does ensdiag


def _shown(value) -> str:
    text = ", ".join(value) if isinstance(value, tuple) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_alike(first: AdapterConfig, other: AdapterConfig):
    """Members must be updates of one base, of one shape and scale; name the first difference."""
    for what, key in (("base model", "base_model"), ("target modules", "target_modules"), ("rank r", "rank"),
                      ("lora_alpha", "alpha"), ("use_rslora", "use_rslora"), ("fan_in_fan_out", "fan_in_fan_out")):
        a, b = getattr(first, key), getattr(other, key)
        if a != b:
            raise EnsdiagError(f"adapters disagree in {what}: {_shown(a)} in {first.folder} but {_shown(b)} in "
                               f"{other.folder}; members of one LoRA ensemble share their base and their LoRA settings")
