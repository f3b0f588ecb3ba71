"""README.md and docs/*.md as the tests read them: a section under its heading, the fenced blocks in
it, and the commands its bash blocks run. A document is named by its path from the repository root."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)


def section(document: str, heading: str) -> str:
    """The text under the line `## heading` of `document`, up to the next `## ` heading."""
    text = (ROOT / document).read_text()
    assert f"\n## {heading}\n" in text, f"{document} has no section '## {heading}'"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    """Every fenced block of `text` in `language` (```bash, ```text, …), without its fences."""
    return [body for _, kind, body in FENCE.findall(text) if kind == language]


def block_after(document: str, marker: str, language: str = "text") -> str:
    """The first fenced block in `language` after the first `marker` in `document`."""
    text = (ROOT / document).read_text()
    assert marker in text, f"{marker!r} is not in {document}"
    found = blocks(text.split(marker, 1)[1], language)
    assert found, f"no ```{language} block after {marker!r} in {document}"
    return found[0]


def recorded_commands(document: str, heading: str, folder) -> list[list[str]]:
    """The commands of the section `heading` of `document`, as bash runs its bash blocks in
    `folder`: `ensdiag` and `python` are only recorded (bash still expands loops and globs and checks
    the syntax), so a test can run them in-process, in order (`tests.cli.run_recorded`)."""
    record = ("set -e\nrecord() { printf '%s\\t' \"$@\" >> commands.tsv; printf '\\n' >> commands.tsv; }\n"
              "ensdiag() { record ensdiag \"$@\"; }\npython() { record python \"$@\"; }\n")
    script = record + "\n".join(blocks(section(document, heading), "bash"))
    subprocess.run(["bash", "-c", script], cwd=folder, check=True, timeout=60)
    commands = [line.rstrip("\t").split("\t") for line in (Path(folder) / "commands.tsv").read_text().splitlines()]
    (Path(folder) / "commands.tsv").unlink()
    return commands
