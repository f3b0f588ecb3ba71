"""How the command line talks to a person: one line and a documented exit code for every
failure, tables printed whole, user-controlled text printed literally, output paths.

Exit codes: 0 success; 1 internal error (a bug: one line, ENSDIAG_DEBUG=1 shows the
traceback); 2 bad input (an option, a file, a folder: one `error:` line); 130 interrupted
(Ctrl-C; rerunning the same command resumes training). Nothing here imports torch.
"""

import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import traceback
from contextlib import nullcontext, suppress
from pathlib import Path

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from .errors import EnsdiagError, unknown
from .text import terminal

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
err_console = Console(stderr=True)


def note(text: str):
    """A line for the person at the terminal (stderr), printed literally (control characters of
    names in it escaped: text.terminal), never wrapped mid-path."""
    err_console.print(terminal(text, keep="\n"), markup=False, highlight=False, soft_wrap=True)


def natural_width(renderable) -> int:
    """The columns a rich renderable takes drawn as wide as it wants."""
    wide = Console(width=10_000)
    return Measurement.get(wide, wide.options, renderable).maximum


def show(console: Console, renderable):
    """Print a table whole: if it is wider than the terminal, lines run long (the terminal wraps
    them) instead of rich cropping or eliding cells, so no digit is ever hidden."""
    natural = natural_width(renderable)
    if natural > console.width:  # rich caps a print's width at the console's: print on a wider twin
        console = Console(file=console.file, width=natural, color_system=console.color_system,
                          force_terminal=console.is_terminal, no_color=console.no_color)
    console.print(renderable, crop=False)


def literal(text):
    """A user-controlled string (a path, a split name) shown as it is, never read as markup, its
    control characters escaped (text.terminal)."""
    return Text(terminal(text, keep="\n"))


def not_a_link(out: Path, option: str = "--out") -> Path:
    """`out` unless it is itself a link (to a folder, a file, or nowhere): ensdiag writes into the
    folders and files it is given, never through a link to somewhere else (docs/conventions.md,
    "Run folders"); the folder the link leads to can be given instead."""
    if Path(out).is_symlink():
        raise EnsdiagError(f"{option} {out} is a link: ensdiag never writes through a link; give the folder or file "
                           "it leads to instead")
    return Path(out)


def output_file(out: Path, default_name: str | None, option: str = "--out") -> Path:
    """`--out` of a command that writes one file: that file, or `default_name` inside it when
    it names an existing folder (without one, a folder is refused); never a link (`not_a_link`).
    Missing parent folders are created."""
    out = not_a_link(out, option)
    if out.is_dir():
        if default_name is None:
            raise EnsdiagError(f"{option} {out} is a folder; name a file")
        return not_a_link(out / default_name, option)
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise EnsdiagError(f"cannot write {option} {out}: {parent} is a file, not a folder")
    return out


def output_folder(out: Path, option: str = "--out") -> Path:
    """`--out` of a command that writes several files into a folder; never a link (`not_a_link`)."""
    not_a_link(out, option)
    if out.exists() and not out.is_dir():
        raise EnsdiagError(f"{option} {out} is a file; this command writes a folder of files (give a folder)")
    return out


def print_json(data):
    """Machine output: plain JSON on stdout, untouched by rich."""
    sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")


def check_format(fmt, allowed=("table", "json")):
    if fmt not in allowed:
        raise unknown("--format", fmt, allowed)


def _is_a(error: BaseException, class_name: str) -> bool:
    """Whether the command-line parser raised its `class_name` error. typer's public API names
    no parser errors beyond BadParameter, and they live in click up to typer 0.2x and in typer's
    own copy of click after it, so they are recognised by class name, as typer itself does."""
    return any(cls.__name__ == class_name for cls in type(error).__mro__)


def _fail(message: str, code: int):
    sys.stderr.write(f"error: {terminal(' '.join(message.split()))}\n")
    sys.exit(code)


def _address_limit() -> int | None:
    """This process's address-space limit in bytes (`ulimit -v`), or None where there is none."""
    try:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (OSError, ValueError):
        return None
    return None if limit == resource.RLIM_INFINITY else limit


def torch_unloadable(cause: str) -> EnsdiagError:
    """The one line for a torch that cannot be loaded: the address-space limit, where one is set, or the install."""
    limit = _address_limit()
    if limit is None:
        return EnsdiagError(f"torch cannot be loaded ({cause}); reinstall it (pip install -c constraints.txt -e .)")
    return EnsdiagError(f"torch cannot be loaded under this process's address-space limit of {limit / 2**30:.1f} GiB "
                        f"(ulimit -v {limit // 1024}): {cause}; raise the limit (`ulimit -v unlimited`, or more memory "
                        "for the job)")


class _TorchProbe:
    """Under an address-space limit (`ulimit -v`, as some clusters set) torch may not load, and not always with a
    Python error (its libraries may abort the process): its first import is tried in a child process first."""

    BELOW = 16 << 30  # a limit under which torch may not load (torch 2.x maps about 4 GiB as it loads)

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, errors="replace")
            if done.returncode:
                raise torch_unloadable((done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300])


def run(app: typer.Typer, argv=None):
    """Run the typer app: every failure is one line on stderr and a documented exit code, never a traceback."""
    # every character printed whatever the terminal's encoding: on an ASCII-only one (PYTHONIOENCODING=ascii,
    # LANG=C) a name's "é" or a table's "±" is written as an escape ("\\xe9"), not a UnicodeEncodeError
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding not in ("utf8", "utf8sig") and hasattr(stream, "reconfigure"):
            with suppress(ValueError, OSError, AttributeError):  # a stream that cannot change: leave it
                stream.reconfigure(errors="backslashreplace")
    if "torch" not in sys.modules and (_address_limit() or _TorchProbe.BELOW) < _TorchProbe.BELOW \
            and not any(isinstance(finder, _TorchProbe) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchProbe())
    # `ensdiag … | head`: end quietly as Unix tools do; not while downloading, where a reset
    # connection must stay an error instead of silently ending the process
    if argv is None and hasattr(signal, "SIGPIPE") and "--download" not in sys.argv:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        # Outside standalone mode typer returns an exit code where it would exit (--help, and
        # 130 for a Ctrl-C it caught) and lets every error through to the handlers below.
        code = app(args=argv, prog_name="ensdiag", standalone_mode=False)
        if code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
    except EnsdiagError as error:
        _fail(str(error), error.exit_code)
    except typer.Exit as done:  # --help, --version
        sys.exit(done.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        sys.stderr.write("\ninterrupted — rerun the same command to resume\n")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as error:
        if _is_a(error, "NoArgsIsHelpError"):  # `ensdiag` or a group without a command: show the help
            text = error.format_message()  # the help, made when the error was; rich printed it already
            if text.strip():
                sys.stdout.write(text + "\n")
            sys.exit(EXIT_BAD_INPUT)
        if _is_a(error, "UsageError"):  # unknown option, missing argument, bad value
            hint = f" (see `{error.ctx.command_path} --help`)" if getattr(error, "ctx", None) is not None else ""
            _fail(f"{error.format_message()}{hint}", EXIT_BAD_INPUT)
        if any(frame.name == "<module>" and Path(frame.filename).parts[-2:] == ("torch", "__init__.py")
               for frame in traceback.extract_tb(error.__traceback__)):  # (out of torch's own import)
            _fail(str(torch_unloadable(f"{type(error).__name__}: {error}")), EXIT_BAD_INPUT)
        if isinstance(error, MemoryError) or "can't allocate memory" in str(error) \
                or "out of memory" in str(error).lower():
            _fail("out of memory: the input asks for more than this machine has (ensdiag checks files against "
                  "ENSDIAG_MEMORY_BUDGET before reading them; this allocation was not foreseen, please report it)",
                  EXIT_BAD_INPUT)
        if isinstance(error, OSError):  # a file or folder the user named cannot be read or written
            where = f"{error.filename}: " if error.filename else ""
            _fail(f"{where}{error.strerror or error}", EXIT_BAD_INPUT)
        if os.environ.get("ENSDIAG_DEBUG"):  # a bug: still one line, unless asked for the traceback
            raise error
        _fail(f"internal error ({type(error).__name__}: {error}); set ENSDIAG_DEBUG=1 for the traceback "
              "and please report it", EXIT_INTERNAL)


def wrapped(text: str, width: int) -> str:
    """The text wrapped at `width`, left-aligned, paragraphs kept, never breaking inside an
    interval ("[0.36, 0.78]") or between a number and its unit ("72 %", "0.55×")."""
    keep = "\u00a0"  # textwrap breaks at ASCII whitespace only
    lines = []
    for paragraph in text.split("\n\n"):
        paragraph = re.sub(r"\[[^\]]{0,40}\]", lambda match: match.group(0).replace(" ", keep), paragraph)
        paragraph = re.sub(r"(\d) (%|×)", lambda match: match.group(1) + keep + match.group(2), paragraph)
        lines += [line.replace(keep, " ") for line in textwrap.wrap(paragraph, width, break_long_words=False)] + [""]
    return "\n".join(lines[:-1])


def loading(text: str, quiet: bool = False):
    """A transient status line on the terminal while a slow step prints nothing (torch's import, a
    geometry step), with the time it has been running: it leaves nothing behind, and shows nothing
    when stderr is not a terminal or with --quiet."""
    if quiet or not err_console.is_terminal:
        return nullcontext()
    progress = Progress(SpinnerColumn("dots"), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=err_console, transient=True)
    progress.add_task(text, total=None)
    return progress
