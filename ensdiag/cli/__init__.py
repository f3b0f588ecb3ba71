"""The `ensdiag` command line: one thin module per command (parse → inputs → the core → render),
registered on `app` (app.py) in the order `ensdiag --help` lists them. No maths here, and nothing
imports torch before a command needs it, so `--help` and `--version` start fast.

    ensdiag --help

Exit codes and how failures are shown: console.py.
"""

from ..console import run
from ..threads import owned
from . import catalog, train, import_model, evaluate, analyze, diversity, report, bench  # noqa: F401  (registers, in help order)
from .app import app

__all__ = ["app", "main"]


def main(argv=None):
    """Entry point (`ensdiag`): see console.py for the exit codes."""
    with owned():  # torch's thread count given back (a command run in-process leaves the process as it was)
        run(app, argv)
