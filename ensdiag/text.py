"""One way out for every string ensdiag did not write itself: one function per kind of output.

Names and text from files, folders, JSON and options (a task from `samples_<task>_<date>.jsonl`,
a filter, a split, a folder, a layer, a reason stored in metrics.json) reach people through a
terminal, a spreadsheet, a Markdown viewer or a browser, and each of them executes something:
escape sequences set a terminal's title, colours or clear its screen; a CSV cell starting with
`=` is a formula; `<img onerror=…>` is script in HTML and in Markdown. Each sink below is the
one place its output kind is made safe, and every renderer passes user-controlled text through
it (the renderers' tests run hostile names through every output):

    terminal(text)      control characters (C0, DEL, C1), bidirectional overrides and line
                        separators written as visible escapes ("\\x1b"), never emitted raw
    csv_cell(value)     terminal(), then text starting with = + - @ (or a tab or CR) prefixed
                        with a single quote, as OWASP recommends against CSV injection; numbers
                        stay numbers
    markdown(text)      terminal(), then HTML escaped (Markdown passes HTML through), `|` that
                        would end a table cell and `](` that would make a link escaped
    html(text)          terminal(), then HTML escaped (quotes too: safe in attributes)
    latex(text)         terminal(), then every character TeX treats specially escaped

Torch-free and dependency-free: the console, the loggers and every renderer import it.
"""

import html as _html
import re

# Characters a terminal acts on instead of drawing: C0 controls, DEL, C1 controls (U+009B is
# CSI on many terminals), the bidirectional embeddings, overrides and isolates that reorder what
# is shown (Trojan Source), and the line and paragraph separators some terminals break lines at.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _escape(match) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(text, keep: str = "") -> str:
    """`text` with every control character written as a visible escape ("\\x1b[31m" shows as
    those characters instead of turning the terminal red); `keep` names controls left as they
    are (ensdiag's own multi-line text keeps "\\n")."""
    text = str(text)
    if not keep:
        return CONTROL.sub(_escape, text)
    return CONTROL.sub(lambda match: match.group(0) if match.group(0) in keep else _escape(match), text)


def terminal_safe(value):
    """A copy of nested dicts, lists and tuples whose strings (keys too) passed `terminal()`:
    what a terminal view of data read from files (metrics.json, a report) renders from."""
    if isinstance(value, str):
        return terminal(value)
    if isinstance(value, dict):
        return {terminal_safe(key): terminal_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(terminal_safe(item) for item in value)
    return value


def csv_cell(value):
    """A spreadsheet cell: a number as it is; text through `terminal()` and, where it starts like a
    formula (= + - @, a tab or a carriage return, after any spaces), behind a single quote, which spreadsheets show
    as text and never evaluate."""
    if not isinstance(value, str):
        return value
    text = terminal(value)
    return "'" + text if text.lstrip(" ").startswith(FORMULA_START) else text


def markdown(text, keep: str = "") -> str:
    """Text for a Markdown document: `terminal()`, then HTML escaped (Markdown renders raw HTML,
    so `<img src=x onerror=…>` would run), `|` escaped (it would end a table cell) and `](`
    broken (it would make the text before it a link or an image)."""
    text = _html.escape(terminal(text, keep), quote=False)
    return text.replace("|", "\\|").replace("](", "]\\(")


def counted(number: int, noun: str) -> str:
    """"1 member", "3 members": a count and its noun, singular for one."""
    return f"{number:,} {noun}{'s' * (number != 1)}"


def html(text) -> str:
    """Text for an HTML element or attribute: `terminal()`, then `<`, `>`, `&` and quotes escaped."""
    return _html.escape(terminal(text), quote=True)


LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
         "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "↑": r"$\uparrow$",
         "↓": r"$\downarrow$", "−": "-"}
LATEX_SPECIAL = re.compile("|".join(map(re.escape, LATEX)))


def latex(text) -> str:
    """Text for a LaTeX document: `terminal()`, then every character TeX reads as a command,
    group or math (`\\`, braces, `$`, `^`, …) replaced in one pass by its literal form."""
    return LATEX_SPECIAL.sub(lambda match: LATEX[match.group(0)], terminal(text))
