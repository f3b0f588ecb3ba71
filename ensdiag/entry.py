"""The `ensdiag` console script: the CLI behind a guard that turns a failing import (a broken or
half-installed dependency such as typer or rich) into the same one-line error and exit code as
any other failure, instead of a traceback before the CLI's own handler exists."""

import os
import sys


def main(argv=None):
    # before torch loads (OpenMP reads it once): threads that wait for work sleep instead of spinning on
    # cores another process needs (ensdiag/threads.py); a user's own setting stays
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        from .cli import main as cli_main
    except ImportError as error:  # nothing of ensdiag's error handling is loaded yet
        missing = getattr(error, "name", None) or str(error)
        sys.stderr.write(f"error: ensdiag cannot start: importing {missing} failed ({error}); reinstall it "
                         "(pip install -c constraints.txt -e .) in a fresh virtual environment\n")
        sys.exit(1)
    cli_main(argv)
