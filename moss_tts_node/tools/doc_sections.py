"""Generated sections of a docs page: text between two marker lines, rewritten by a tool, the prose around it kept.

Shared by the page writers of ``cli/`` (docs/usage.md) and ``dev/`` (docs/interfaces.md), so it sits beside them.
"""

from __future__ import annotations

from pathlib import Path


def begin_marker(name: str, command: str, source: str) -> str:
    return f"<!-- {name}: written by `{command}` from {source}; edit them there -->"


def end_marker(name: str) -> str:
    return f"<!-- end of {name} -->"


def replace_section(page: str, page_name: str, name: str, begin: str, body: str) -> str:
    """``page`` with the text between ``begin`` and the end marker of ``name`` replaced by ``body``; raises
    ValueError, saying which lines to put where, when the page lacks them."""
    end = end_marker(name)
    start, stop = page.find(begin), page.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{page_name} has no place for the {name}: put the lines {begin!r} and {end!r} there")
    return f"{page[: start + len(begin)]}\n\n{body.strip()}\n\n{page[stop:]}"  # blank lines keep tables tables


def rewrite(page_path: Path, written: str) -> str:
    """Write ``written`` to ``page_path`` where it differs; returns what was done, for the tool to print."""
    if page_path.read_text(encoding="utf-8") == written:
        return f"{page_path} is up to date"
    page_path.write_text(written, encoding="utf-8")
    return f"wrote the generated sections of {page_path}"


def cell(text: str) -> str:
    """``text`` as one Markdown table cell: on one line, with what Markdown would read as a column's end, emphasis or
    an HTML tag escaped (help texts are plain text: ``config/*.yaml``, ``DIR/<id>.wav``)."""
    flat = " ".join(text.split())
    return flat.replace("|", "\\|").replace("*", "\\*").replace("<", "\\<")
