"""Every section of README.md or of a page in docs/ that a comment, docstring or message cites by title exists.

A citation names the file, then the section's title in double quotes: ``README "Streaming"``,
``README, "Speed"``, ``docs/model.md ("Prompt format")``; a title may wrap onto the next comment line. A
section is a Markdown heading or a paragraph's bold lead (``**Requests.**``); a heading's trailing
parenthesis may be left out (``"Converting a checkpoint"``). A page cited without a section must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("moss_tts_node", "test", "scripts", "launch", "config", "docs", ".ci")
SOURCE_FILES = ("README.md", "Makefile", "setup.py")
SUFFIXES = {".py", ".sh", ".yaml", ".md", ".txt", ""}

CITATION = re.compile(
    r"(?P<page>README(?:\.md)?|docs/[\w.-]+\.md)`?"
    r"(?:,\s*|\s*\(\s*|\s+)"  # README, "X" / README ("X") / README "X"
    r'"(?P<title>[^"\n]+(?:\n[ \t]*(?:#[ \t]*)?[^"\n]+)?)"'  # a title may go on in the next comment line
)
PAGE = re.compile(r"docs/[\w.-]+\.md")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*$")
BOLD_LEAD = re.compile(r"^\*\*(.+?)\.\*\*")
FENCE = re.compile(r"^[ \t]*(```|~~~)")


def _sources() -> list[Path]:
    files = [ROOT / name for name in SOURCE_FILES]
    for folder in SOURCE_DIRS:
        files += [
            path
            for path in (ROOT / folder).rglob("*")
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
        ]
    return sorted(path for path in files if path != Path(__file__).resolve())


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line, page, title) of each section citation in ``text``; a wrapped title is joined with one space."""
    return [
        (
            text.count("\n", 0, match.start()) + 1,
            "README.md" if match["page"].startswith("README") else match["page"],
            re.sub(r"\s*\n[ \t]*(?:#[ \t]*)?", " ", match["title"]).strip(),
        )
        for match in CITATION.finditer(text)
    ]


def sections(markdown: str) -> set[str]:
    """The titles a page's sections can be cited by: headings outside code blocks, with and without a trailing
    parenthesis, and bold paragraph leads."""
    titles: set[str] = set()
    in_code = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        heading = HEADING.match(line)
        if heading:
            title = heading[1]
            titles |= {title, re.sub(r"\s*\([^()]*\)$", "", title)}
        lead = BOLD_LEAD.match(line)
        if lead:
            titles.add(lead[1])
    return titles


def test_citations_are_read_in_every_form_the_code_writes_them() -> None:
    text = (
        '# README "Streaming": the trade-off\n'
        'x = 1  # faster (README, "Speed"), and\n'
        '"""Order (docs/model.md, "Sampling"): ... docs/design.md ("Data flow") and `docs/model.md`, "Prompt format"\n'
        '# the checkpoint (README, "Converting a\n'
        '# checkpoint", has measured peaks)\n'
        'README = (ROOT / "README.md").read_text()  # not a citation\n'
    )
    assert citations(text) == [
        (1, "README.md", "Streaming"),
        (2, "README.md", "Speed"),
        (3, "docs/model.md", "Sampling"),
        (3, "docs/design.md", "Data flow"),
        (3, "docs/model.md", "Prompt format"),
        (4, "README.md", "Converting a checkpoint"),
    ]
    page = "# Title\n## Converting a checkpoint (fine-tunes)\n```\n# not a heading\n```\n**Requests.** One at a time.\n"
    assert sections(page) == {"Title", "Converting a checkpoint (fine-tunes)", "Converting a checkpoint", "Requests"}


def test_every_cited_section_exists() -> None:
    known: dict[str, set[str]] = {}
    missing, found = [], 0
    for path in _sources():
        text = path.read_text(errors="replace")
        where = path.relative_to(ROOT)
        for page in PAGE.findall(text):
            if not (ROOT / page).is_file():
                missing.append(f"{where}: cites {page}, which does not exist")
        for line, page, title in citations(text):
            found += 1
            if not (ROOT / page).is_file():
                continue  # reported above
            if page not in known:
                known[page] = sections((ROOT / page).read_text())
            if title not in known[page]:
                missing.append(f'{where}:{line}: cites {page} "{title}", which has no such section')
    assert found > 0, "no citations found: has CITATION stopped matching the way the code cites?"
    assert not missing, "\n".join(missing)
