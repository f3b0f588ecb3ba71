"""Argument checks that need no tensor, run before torch is imported, so a typo costs well
under a second instead of a torch start-up: names (presets, methods, datasets), paths that must
exist, output paths that must not be files. The registries' names come from names.py, a table
generated from the registries themselves (a test keeps the two equal), which imports nothing.

    check_train(preset="digits", methods=["deep-ensemble"], out=Path("runs/x"), ...)
    check_inputs("MODEL", [Path("model.safetensors")])
"""

import sys
from pathlib import Path

from . import names
from .config import PRESETS
from .errors import EnsdiagError, unknown
from .io import is_path, regular_file


def check_set(option: str, value: str | None):
    """--shift/--ood: a registered dataset's name, or files that exist."""
    if value is None:
        return
    if is_path(value):
        check_inputs(option, [value], folders=True)
    elif value not in names.DATASETS:
        raise unknown(f"{option} dataset", value, names.DATASETS)


def check_train(preset: str, methods: list[str] | None, out: Path | None, resume: Path | None,
                shift: str | None = None, ood: str | None = None):
    if resume is None and preset not in PRESETS:
        raise unknown("preset", preset, PRESETS)
    known = set(names.METHODS)
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
    for path in paths or ():
        path = Path(path)
        if not path.exists():
            raise EnsdiagError(f"{what} {path} does not exist")
        if not (folders and path.is_dir()):
            regular_file(path, what)
