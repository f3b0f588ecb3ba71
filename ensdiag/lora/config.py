"""LoRA adapter folders as PEFT saves them: `adapter_config.json` beside `adapter_model.safetensors`
(or `adapter_model.bin`). Reading and checking the configs needs no tensor, so every check here
runs before torch is imported, and members that cannot form one ensemble are refused at once.

    adapters = read_adapter_folders([Path("run-a"), Path("run-b")])   # [AdapterConfig], checked alike
"""

import math
import re
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsdiagError
from ..io import read_json, regular_file

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
MAX_CONFIG_BYTES = 1 << 20  # PEFT's configs are ~1 KiB; anything near this is not one
MAX_RANK = 1 << 16
MAX_ADAPTERS = 64  # every pair of members is compared in every layer (k×k matrices), as member geometry does
MAX_PATTERN_CHARS = 1000
PATTERN_SECONDS = 2.0  # a regular expression from a file may backtrack for ever: matching is timed


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

    @property
    def log_scale(self) -> float:
        """log |scale|, exact where the scale itself underflows (α = 5e-324 gives a scale of 0.0)."""
        return math.log(abs(self.alpha)) - (0.5 if self.use_rslora else 1.0) * math.log(self.rank)


def adapter_folders(paths) -> bool:
    """Whether the command's inputs are LoRA adapter folders (all of them; a mix is refused)."""
    found = [Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file() for path in paths]
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
    if len(folders) > MAX_ADAPTERS:
        raise EnsdiagError(f"{len(folders):,} adapter folders; ensdiag compares every pair of members in every layer "
                           f"and takes at most {MAX_ADAPTERS} (diagnose a sample of them)")
    if len({folder.resolve() for folder in folders}) != len(folders):
        raise EnsdiagError("the same adapter folder is given twice: its members would be one model")
    configs = [read_adapter_config(folder) for folder in folders]
    first = configs[0]
    for other in configs[1:]:  # members must be updates of one base, of one shape and scale: the first difference
        for what, key in (("base model", "base_model"), ("target modules", "target_modules"), ("rank r", "rank"),
                          ("lora_alpha", "alpha"), ("use_rslora", "use_rslora"), ("fan_in_fan_out", "fan_in_fan_out")):
            a, b = getattr(first, key), getattr(other, key)
            if a != b:
                raise EnsdiagError(f"adapters disagree in {what}: {_shown(a)} in {first.folder} but {_shown(b)} in "
                                   f"{other.folder}; members of one LoRA ensemble share their base and their LoRA "
                                   "settings")
    return configs


def read_adapter_config(folder: Path) -> AdapterConfig:
    path = regular_file(folder / CONFIG_FILE, "adapter config")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise EnsdiagError(f"{path} is {path.stat().st_size:,} bytes, not a PEFT adapter config")
    data = read_json(path, "adapter config", MAX_CONFIG_BYTES)
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
    weights = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        raise EnsdiagError(f"{folder} has {CONFIG_FILE} but no {' or '.join(WEIGHT_FILES)}")
    # PEFT loads the safetensors file when both are there, and so does ensdiag
    return AdapterConfig(folder, weights[0], rank, float(alpha), flags["use_rslora"], base or None,
                         _targets(path, data.get("target_modules")), flags["fan_in_fan_out"])


def _targets(path, targets):
    if targets is None:
        return targets
    if isinstance(targets, str):
        if len(targets) > MAX_PATTERN_CHARS:
            raise EnsdiagError(f"{path}: target_modules is a pattern of {len(targets):,} characters, not a PEFT one")
        try:
            re.compile(targets)
        except (re.error, RecursionError, OverflowError) as error:
            raise EnsdiagError(f"{path}: target_modules {targets[:40]!r} is not a regular expression ({error})"[:300]) from None
        return targets
    if not isinstance(targets, list) or not all(isinstance(name, str) for name in targets):
        raise EnsdiagError(f"{path}: target_modules must be a list of module names or one pattern")
    return tuple(sorted(set(targets)))  # PEFT writes a set: its order means nothing


def check_targets(config: AdapterConfig, names: list[str]):
    """Every module the weights adapt is one target_modules names, as PEFT chose them: a list entry
    is a module's name or its last dotted parts, a string a regular expression the whole name
    matches, "all-linear" every linear layer. A config that does not name them does not describe
    these weights. A pattern is matched under a time limit where one can be set (the main thread
    on Unix; elsewhere it is not matched at all): a hostile one could backtrack for ever."""
    targets = config.target_modules
    if targets is None or targets == "all-linear":
        return
    if isinstance(targets, tuple):
        missing = next((name for name in names if not any(name == t or name.endswith("." + t) for t in targets)), None)
    else:
        pattern = re.compile(targets)
        with _time_limit(PATTERN_SECONDS) as limited:
            if not limited:
                return
            try:
                missing = next((name for name in names if pattern.fullmatch(name) is None), None)
            except _TooSlow:
                raise EnsdiagError(f"{config.folder / CONFIG_FILE}: target_modules {targets[:40]!r} takes more than "
                                   f"{PATTERN_SECONDS:g} s to match a module name (a pattern that backtracks for ever)"
                                   ) from None
    if missing is not None:
        raise EnsdiagError(f"{config.folder / CONFIG_FILE}: target_modules ({_shown(targets)}) does not name {missing}, "
                           f"which {config.weights.name} adapts: the config does not describe these weights")


class _TooSlow(Exception):
    pass


@contextmanager
def _time_limit(seconds: float):
    """Yields whether `seconds` of real time are enforced (by SIGALRM, raising _TooSlow); any timer
    and handler set before are restored after."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield False
        return

    def expired(*_):
        raise _TooSlow

    handler = signal.signal(signal.SIGALRM, expired)
    earlier, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    began = time.monotonic()
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if earlier > 0:
            signal.setitimer(signal.ITIMER_REAL, max(earlier - (time.monotonic() - began), 0.001))


def _shown(value) -> str:
    text = ", ".join(value) if isinstance(value, tuple) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
