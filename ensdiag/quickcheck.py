"""Argument checks that need no tensor, run before torch is imported, so a typo costs well
under a second instead of a torch start-up: names (presets, methods, datasets), paths that must
exist, output paths that must not be files. The registries' names are read from the source of
the modules that register them (without importing them); a test keeps the two in step.

    check_train(preset="digits", methods=["deep-ensemble"], out=Path("runs/x"), ...)
    check_inputs("MODEL", [Path("model.safetensors")])
"""

import ast
import math
import re
import sys
from functools import lru_cache
from pathlib import Path

from .errors import EnsdiagError, unknown

PACKAGE = Path(__file__).parent


def _decorated(tree, decorator: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for call in node.decorator_list:
                name = getattr(getattr(call, "func", call), "id", None) or getattr(getattr(call, "func", call), "attr", None)
                if name == decorator:
                    yield node, call


@lru_cache(maxsize=1)
def method_names() -> tuple[str, ...]:
    """Every run name training accepts: the kits' `register_method` names and their `run_variants`."""
    names = []
    for path in sorted((PACKAGE / "nn" / "kits").glob("*.py")):
        for node, call in _decorated(ast.parse(path.read_text()), "register_method"):
            names += [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == "run_variants"
                                                             for t in statement.targets):
                    names += [key.value for key in getattr(statement.value, "keys", []) if isinstance(key, ast.Constant)]
    return tuple(names)


@lru_cache(maxsize=1)
def dataset_names() -> tuple[str, ...]:
    """The built-in datasets' names (`name = "..."` or `name, role, title = "...", ...` in a class
    decorated with `register_dataset`)."""
    names = []
    for path in sorted((PACKAGE / "data" / "sets").glob("*.py")):
        for node, _ in _decorated(ast.parse(path.read_text()), "register_dataset"):
            for statement in node.body:
                if not isinstance(statement, ast.Assign):
                    continue
                target, value = statement.targets[0], statement.value
                if isinstance(target, ast.Name) and target.id == "name" and isinstance(value, ast.Constant):
                    names.append(value.value)
                elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                    names += [v.value for t, v in zip(target.elts, value.elts)
                              if getattr(t, "id", None) == "name" and isinstance(v, ast.Constant)]
    return tuple(names)


def is_path(value: str) -> bool:
    """Whether an --ood/--shift/--data value names files rather than a registered dataset."""
    return value.endswith((".npz", ".npy")) or "/" in value or "\\" in value or Path(value).is_dir()


def check_set(option: str, value: str | None):
    """--shift/--ood: a registered dataset's name, or files that exist."""
    if value is None:
        return
    if is_path(value):
        check_inputs(option, [value], folders=True)
    elif value not in dataset_names():
        raise unknown(f"{option} dataset", value, dataset_names())


def check_train(preset: str, methods: list[str] | None, out: Path | None, resume: Path | None,
                shift: str | None = None, ood: str | None = None):
    from .config import PRESETS
    if resume is None and preset not in PRESETS:
        raise unknown("preset", preset, PRESETS)
    known = set(method_names())
    if "ensdiag.nn.methods" in sys.modules:  # methods registered at run time (a script, a test) count too
        known |= set(sys.modules["ensdiag.nn.methods"].run_methods())
    for method in methods or ():
        if method not in known:
            raise unknown("method", method, sorted(known))
    if out is not None and out.exists() and not out.is_dir():
        raise EnsdiagError(f"--out {out} exists and is not a directory")
    if resume is not None and not (resume / "experiment.json").is_file():
        raise EnsdiagError(f"--resume {resume} is not an ensdiag run (no experiment.json)")
    check_set("--shift", shift)
    check_set("--ood", ood)


def check_inputs(what: str, paths, folders: bool = False):
    """Every named input exists and is a folder (where `folders` allows one) or a regular file: a
    FIFO or a device is refused here, before anything would wait on it for ever."""
    from .io import regular_file
    for path in paths or ():
        path = Path(path)
        if not path.exists():
            raise EnsdiagError(f"{what} {path} does not exist")
        if not (folders and path.is_dir()):
            regular_file(path, what)


# Numbers typed by a person are read in ASCII decimal only: str.isdigit and int() also take
# superscripts and other scripts' digits ("²", "٣"), which nobody means as a count.
INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
SEED_LIMIT = 2**31  # seeds name folders and seed NumPy, torch and Python generators alike


def integer(text, what: str, low: int | None = None, high: int | None = None) -> int:
    """A whole number written in decimal digits, in low..high where given, or one clear error."""
    shown = str(text).strip()
    if not INTEGER.fullmatch(shown) or len(shown) > 40:
        raise EnsdiagError(f"{what} must be a whole number in decimal digits, got {str(text)[:40]!r}")
    value = int(shown)
    if (low is not None and value < low) or (high is not None and value > high):
        raise EnsdiagError(f"{what} must be a whole number in {low}..{high}, got {shown}")
    return value


def decimal(text, what: str) -> float:
    """A finite number written in decimal digits (1.5, 2e-3), or one clear error."""
    shown = str(text).strip()
    if not DECIMAL.fullmatch(shown) or len(shown) > 80 or not math.isfinite(float(shown)):
        raise EnsdiagError(f"{what} must be a finite number in decimal digits, got {str(text)[:40]!r}")
    return float(shown)


def seed(value, what: str = "--seed") -> int:
    """A seed: a whole number in 0..2³¹−1 (as `runs.check_run_name` says it)."""
    text = str(value).strip()
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not INTEGER.fullmatch(text) or len(text) > 40 \
            or not 0 <= int(text) < SEED_LIMIT:
        raise EnsdiagError(f"{what} must be an integer in 0..2³¹−1, got {text[:40]}")
    return int(text)


def integer_list(text, what: str) -> list[int] | None:
    """A comma list of whole numbers in decimal digits (`--seeds 0,1,2`)."""
    if text is None:
        return None
    try:
        return [integer(part, what) for part in str(text).split(",") if part.strip()]
    except EnsdiagError:
        raise EnsdiagError(f"{what} must be a comma-separated list of whole numbers in decimal digits, got "
                           f"{str(text)[:80]!r}") from None


NORMALIZE_RANGE = 1e-6, 1e6  # stds (and |means| up to the upper end) that keep [0, 1] inputs finite and meaningful


def normalize_option(text: str, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """--normalize MEAN,…:STD,… → (means, stds), one per channel, in decimal digits; a std outside
    1e-6..1e6 (1e-320 would turn every input infinite) or a mean beyond ±1e6 is refused."""
    parts = str(text).split(":")
    if len(parts) != 2:
        raise EnsdiagError(f"--normalize must be MEAN,…:STD,… or none, got {str(text)[:80]!r}")
    mean, std = (tuple(decimal(value, "--normalize") for value in part.split(",")) for part in parts)
    low, high = NORMALIZE_RANGE
    if len(mean) != channels or len(std) != channels or not all(low <= value <= high for value in std) \
            or not all(abs(value) <= high for value in mean):
        raise EnsdiagError(f"--normalize needs {channels} finite means within ±{high:g} and {channels} stds in "
                           f"[{low:g}, {high:g}] (inputs are images in [0, 1]), got {str(text)[:80]!r}")
    return mean, std


def path_points_option(value) -> int | str:
    """--path-points: an integer from 2 to 101 (an even grid from t = 0 to 1), or "adaptive"."""
    text = str(value).strip().lower()
    if text == "adaptive":
        return text
    if INTEGER.fullmatch(text) and len(text) < 6 and 2 <= int(text) <= 101:
        return int(text)
    raise EnsdiagError(f"--path-points must be an integer from 2 to 101, or 'adaptive'; got {value!r}")
