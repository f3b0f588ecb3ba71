"""Run the ensdiag CLI in-process and capture what a user would see."""

import pytest

from ensdiag.cli import main


def run_cli(capsys, *args):
    """(exit code, stdout, stderr) of `ensdiag ARGS`."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(capsys, *args, match: str):
    import re
    code, out, err = run_cli(capsys, *args)
    assert code != 0, f"exit code 0 for {args}"
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line: {err!r}"
    assert "Traceback" not in err
    assert re.search(match, lines[0]), f"{match!r} not in {lines[0]!r}"
    return lines[0]


def run_recorded(capsys, command: list[str], root) -> str:
    """Run one command recorded from a document (`tests.documents.recorded_commands`) in-process from
    the current folder; its stdout."""
    import runpy
    from pathlib import Path
    if command[0] == "python":
        if command[1] == "-c":
            exec(compile(command[2], "<python -c>", "exec"), {"__name__": "__main__"})
        else:
            runpy.run_path(str(Path(root) / command[1]), run_name="__main__")
        return ""
    code, out, err = run_cli(capsys, *command[1:])
    assert code == 0, f"{command}: {err}"
    return out


__all__ = ["assert_one_line_error", "pytest", "run_cli", "run_recorded"]
