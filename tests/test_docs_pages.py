"""The README and the docs pages: the README stays short and holds the two commands CI and users run,
and every relative link in README.md and docs/*.md reaches a file that exists and, where it names
an anchor, a heading of that file."""

import re
from pathlib import Path
from urllib.parse import unquote

from .documents import FENCE, ROOT, blocks, section

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.S)
HEADING = re.compile(r"^#{1,6} +(.+?)(?: +#+)? *$", re.M)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped, spaces
    as hyphens, a repeated one numbered), and any `<a id=…>`/`<a name=…>` in it."""
    text, found, seen = FENCE.sub("", path.read_text()), set(), {}
    for heading in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found | set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))


def broken_links(path: Path, root: Path) -> list[str]:
    """Every relative link of `path` (outside code) whose file is missing or outside `root`, whose
    anchor is no heading of its Markdown file, or that names an anchor in a file that is not Markdown."""
    prose = CODE_SPAN.sub("", FENCE.sub("", path.read_text()))
    broken = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = unquote(target).partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.is_relative_to(root) or not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no such anchor")
    return broken


def test_every_relative_link_reaches_its_file_and_heading():
    checked = 0
    for path in DOCUMENTS:
        assert broken_links(path, ROOT) == [], path.relative_to(ROOT)
        checked += len(LINK.findall(path.read_text()))
    assert checked > 50  # the pages link to each other


def test_the_link_check_finds_a_missing_file_a_missing_anchor_and_ignores_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## How it works (`x.py`)\n\n```bash\n# not a heading\n```\n")
    (tmp_path / "data.json").write_text("{}")
    page = tmp_path / "docs" / "b.md"
    page.write_text("[ok](a.md#how-it-works-xpy) [self](#b) [web](https://example.com/x.md)\n\n## B\n\n"
                    "[gone](c.md) [no heading](a.md#not-a-heading) [json](../data.json#top) [out](../../x.md)\n"
                    "`[in code](c.md)`\n\n```text\n[in a block](c.md)\n```\n")
    assert broken_links(page, tmp_path) == ["c.md: no such file", "a.md#not-a-heading: no such anchor",
                                            "../data.json#top: no such anchor", "../../x.md: no such file"]


def test_no_page_points_to_the_projects_internal_notes():
    for path in DOCUMENTS:
        text = path.read_text()
        assert "../shared" not in text and "/work/shared" not in text, path.relative_to(ROOT)


def test_the_readme_is_short_and_holds_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    main_job, tests = blocks(section("README.md", "Fresh machine: two commands"), "bash")
    assert main_job.startswith("python3 -m pip install -c constraints.txt -e . && ensdiag train --out runs/demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines()  # .ci/run runs the README's test command verbatim
