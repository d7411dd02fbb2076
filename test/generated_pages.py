"""The check every generated page's test makes first: the checked-in page is what its generator writes."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path


def assert_page_is_written(page_path: Path, render: Callable[[str], str], source: str, command: str) -> None:
    """``page_path`` is unchanged by ``render`` (its generator); else fail with the first lines of the difference
    and the ``command`` that writes the page anew from ``source`` (what its tables are made from)."""
    page = page_path.read_text(encoding="utf-8")
    written = render(page)
    diff = "".join(list(difflib.unified_diff(page.splitlines(True), written.splitlines(True), "page", "written"))[:40])
    assert written == page, f"docs/{page_path.name} differs from {source}: run `{command}`\n{diff}"
