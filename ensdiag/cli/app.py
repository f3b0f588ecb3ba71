"""The typer application every command registers on, and the small parsers commands share.

Usage lines as Unix tools write them, plain help that reads at 80 columns, `--version`.
"""

import sys

import typer

from .. import __version__


class _Command(typer.core.TyperCommand):
    """Usage lines as Unix tools write them: `MODEL...`, `[RUN_DIR]` (typer writes `{MODEL}...`)."""

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                continue
            name = (param.metavar or param.name).upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


class _App(typer.Typer):
    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)


# Plain help (no boxes): at 80 columns rich's panels cut option names and fold every line
app = _App(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
           context_settings={"help_option_names": ["-h", "--help"]},
           help="Is your ensemble really an ensemble? Diagnostics for trained ensembles.")


def _version(value: bool):
    if value:
        sys.stdout.write(f"ensdiag {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print ensdiag's version and exit.")):
    """Is your ensemble really an ensemble? Diagnostics for trained ensembles.

    Exit codes: 0 ok, 1 internal error, 2 bad input, 130 interrupted (rerun to resume)."""


def csv_list(text):
    """A comma-separated option as a list of its non-empty parts (None stays None)."""
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]
