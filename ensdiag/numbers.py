"""Numbers typed by a person (options, `-O METHOD.NAME=VALUE`, environment variables): read in
ASCII decimal digits only, with one clear error otherwise. Torch-free, and below everything that
parses options (config, the method kits, the CLI's quick checks)."""

import math
import re

from .errors import EnsdiagError

# str.isdigit and int() also take superscripts and other scripts' digits ("²", "٣"), which nobody
# means as a count.
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


def path_points_option(value, what: str = "--path-points") -> int | str:
    """--path-points: an integer from 2 to 101 (an even grid from t = 0 to 1), or "adaptive"."""
    text = str(value).strip().lower()
    if text == "adaptive":
        return text
    if INTEGER.fullmatch(text) and len(text) < 6 and 2 <= int(text) <= 101:
        return int(text)
    raise EnsdiagError(f"{what} must be an integer from 2 to 101, or 'adaptive'; got {value!r}")


# A duration: a number of seconds, or hours, minutes and seconds each at most once and in that order
# ("1h30m", "90s", "1.5h"); ASCII digits only (a bare \d also reads "٣" as 3), few enough to mean a time.
DURATION = re.compile(r"(?:(?P<h>[0-9]{1,9}(?:\.[0-9]{1,9})?)h)?(?:(?P<m>[0-9]{1,9}(?:\.[0-9]{1,9})?)m)?"
                      r"(?:(?P<s>[0-9]{1,9}(?:\.[0-9]{1,9})?)s)?", re.ASCII)
SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?", re.ASCII)


def parse_seconds(given) -> float | None:
    """--budget: seconds from "5m", "90s", "1h30m", "1.5h", "300" or a number; None for None.
    "1h30m5" and "5m5m" are refused (a unit left out or repeated is a typo, not a sum)."""
    if given is None:
        return None
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        seconds = _finite(given)
    else:
        text = str(given).strip().lower().replace(" ", "")
        match = DURATION.fullmatch(text)
        if SECONDS.fullmatch(text):
            seconds = float(text)
        elif text and match:
            seconds = sum(float(match[unit] or 0) * factor for unit, factor in (("h", 3600), ("m", 60), ("s", 1)))
        else:
            raise EnsdiagError(f"budget {str(given)[:40]!r} is not a duration (e.g. 5m, 90s, 1h30m or a number of "
                               "seconds, in ASCII digits)")
    if not math.isfinite(seconds) or seconds <= 0:
        raise EnsdiagError(f"budget {str(given)[:40]!r}: a finite duration above 0 seconds")
    return seconds


def _finite(number) -> float:
    """A Python number as a float, or inf when it is beyond a float's range (10**400): refused by the caller."""
    try:
        return float(number)
    except OverflowError:
        return math.inf


def parse_precision(given) -> float | None:
    """--precision-target (or `precision=`): a positive finite half-width, in ASCII decimal digits."""
    if given is None:
        return None
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        value = _finite(given)
    elif isinstance(given, str) and DECIMAL.fullmatch(given.strip()) and len(given.strip()) <= 80:
        value = float(given.strip())
    else:
        raise EnsdiagError(f"precision target {str(given)[:40]!r} is not a number in decimal digits (an interval "
                           "half-width, e.g. 0.01)")
    if not math.isfinite(value) or value <= 0:
        raise EnsdiagError(f"precision target {str(given)[:40]!r}: a finite interval half-width above 0 (e.g. 0.01)")
    return value
