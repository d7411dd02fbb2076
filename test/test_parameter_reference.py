"""docs/configuration.md's tables are what ros/parameter_reference.py writes from the declarations."""

from __future__ import annotations

import pytest
from generated_pages import assert_page_is_written
from ros_helpers import require_ros

require_ros()

from moss_tts_node.config import OPTIONS  # noqa: E402
from moss_tts_node.ros.parameter_reference import COMMAND, PAGE, begin_marker, end_marker, render  # noqa: E402
from moss_tts_node.ros.parameters import NODE_OPTIONS  # noqa: E402


def test_the_checked_in_page_is_what_the_declarations_write() -> None:
    assert_page_is_written(PAGE, render, "the declarations", COMMAND)


def test_a_stale_row_is_written_anew_and_every_parameter_has_one() -> None:
    page = PAGE.read_text(encoding="utf-8")
    stale = page.replace("| `llama.n_ctx` |", "| `llama.n_context` |").replace("Context length in rows", "Rows")
    assert stale != page and render(stale) == page
    for key in [*OPTIONS, *(o.key for o in NODE_OPTIONS)]:
        assert page.count(f"| `{key}` |") == 1, key


def test_a_page_without_the_markers_is_refused_with_where_they_go() -> None:
    page = PAGE.read_text(encoding="utf-8").replace(end_marker("node parameters"), "")
    with pytest.raises(ValueError, match="node parameters") as refused:
        render(page)
    assert begin_marker("node parameters") in str(refused.value)
