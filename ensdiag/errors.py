"""User-facing errors: one line of text and an exit code, never a traceback.

Library code raises `EnsdiagError` for anything the user can fix (a bad file, an unknown
name, a missing dataset); the CLI prints `error: <message>` and exits with `exit_code`.
From Python it is a `ValueError` (`except ValueError` catches it); `InputTypeError`, for an
argument of the wrong type, is also a `TypeError`.
"""

import difflib
import functools
import os
from pathlib import Path


class EnsdiagError(ValueError):
    """An error caused by the user's input, reported as one line (a `ValueError`)."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(" ".join(str(message).split()))  # always one line
        if exit_code is not None:
            self.exit_code = exit_code


class InputTypeError(EnsdiagError, TypeError):
    """An argument of a type ensdiag does not take (a `TypeError` and a `ValueError`)."""


class Skip(Exception):
    """Raised by an analyzer whose inputs are missing; the message says why."""


class DataNotFound(EnsdiagError):
    """A dataset's files are not where ensdiag looked (as opposed to being there but wrong)."""


def shown(value, limit: int = 40) -> str:
    """A user's value quoted safely in an error: repr escapes control characters; long values are cut."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def unknown(kind: str, value, choices) -> EnsdiagError:
    """The error for a name that is not one of `choices`, with the nearest one when a typo is likely:
    "unknown method 'deep-ensembel'; did you mean 'deep-ensemble'? (choose from …)"."""
    choices = [str(choice) for choice in choices]
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return EnsdiagError(f"unknown {kind} {shown(value, 60)}{hint} (choose from {', '.join(choices)})"[:400])


def path_argument(value, what: str = "path"):
    """A path argument from Python as a `Path`: a str or os.PathLike (an InputTypeError otherwise)
    without NUL bytes, which no file system takes (an EnsdiagError)."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise InputTypeError(f"{what} must be a path (str or pathlib.Path), got {type(value).__name__}")
    path = Path(value)
    if "\x00" in str(path):
        raise EnsdiagError(f"{what} {str(path)[:80]!r} holds a NUL byte: no file system takes it")
    return path


def public(function):
    """`function`, whose failures on bad input from Python are all EnsdiagErrors, as the module
    docstring promises: an OSError (a path the system refuses: too long, a file in a folder's place,
    no permission) or an OverflowError (a number beyond what a float or an index holds) becomes one
    EnsdiagError saying so, chained to it; everything else passes as it was raised."""
    @functools.wraps(function)
    def checked(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except EnsdiagError:
            raise
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            raise EnsdiagError(f"{where}{error.strerror or error}"[:400]) from error
        except OverflowError as error:
            raise EnsdiagError(f"a number is too large for this machine ({error})") from error
    return checked
