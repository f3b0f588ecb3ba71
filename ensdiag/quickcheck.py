"""Argument checks that need no tensor, run before torch is imported, so a typo costs well
under a second instead of a torch start-up: names (presets, methods, datasets), paths that must
exist, output paths that must not be files. The registries' names are read from the source of
the modules that register them (without importing them); a test keeps the two in step.

    check_train(preset="digits", methods=["deep-ensemble"], out=Path("runs/x"), ...)
    check_inputs("MODEL", [Path("model.safetensors")])
"""

import ast
import sys
from functools import lru_cache
from pathlib import Path

from .io import is_path  # noqa: F401  (callers ask it here too)
from .numbers import (DECIMAL, INTEGER, decimal, integer, integer_list, normalize_option, parse_precision,  # noqa: F401
                      parse_seconds, path_points_option, seed)  # (the same: the checks that need no tensor, by name)
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
def report_formats() -> dict[str, str]:
    """{format: file extension} of every `@report_format(NAME, EXTENSION)` renderer (report/render.py),
    read from the source: `report --format` is checked before torch and matplotlib are imported."""
    found = {}
    for node in ast.walk(ast.parse((PACKAGE / "report" / "render.py").read_text())):
        if isinstance(node, ast.FunctionDef):
            for call in node.decorator_list:
                if getattr(getattr(call, "func", None), "id", None) == "report_format":
                    name, extension = (arg.value for arg in call.args[:2])
                    found[name] = extension
    return found


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


