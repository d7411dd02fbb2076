"""docs/interfaces.md is what tools/dev/interface_reference.py writes from the moss_tts_msgs interface files, and
every field of them says what it is."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from generated_pages import assert_page_is_written

from moss_tts_node.tools.dev.interface_reference import (
    COMMAND,
    INTERFACES,
    PAGE,
    PARTS,
    SECTION,
    interfaces,
    parse,
    reference,
    render,
)
from moss_tts_node.tools.doc_sections import end_marker

FOUND = interfaces()


def test_the_checked_in_page_is_what_the_interface_files_write() -> None:
    assert_page_is_written(PAGE, render, "the interface files", COMMAND)


def test_every_interface_file_is_on_the_page_and_every_field_and_constant_has_a_meaning() -> None:
    files = sorted(path.stem for kind in PARTS for path in (INTERFACES / kind).glob(f"*.{kind}"))
    assert sorted(interface.name for interface in FOUND) == files and len(files) >= 7
    page = PAGE.read_text(encoding="utf-8")
    for interface in FOUND:
        assert page.count(f"## `{interface.kind}/{interface.name}`\n") == 1, interface.name
        silent = [row.name for part in interface.parts for row in part.rows if not row.comment]
        assert not silent, f"{interface.kind}/{interface.name}: give {silent} a comment saying what they are"


def test_the_files_are_read_as_rosidl_builds_them() -> None:
    """The fields the page lists are the built interfaces' own, in order (an independent reader: rosidl)."""
    pytest.importorskip("rclpy", reason="ROS 2 is not installed: pip install -r requirements-ros.txt")
    for interface in FOUND:
        try:
            built = getattr(importlib.import_module(f"moss_tts_msgs.{interface.kind}"), interface.name)
        except (ImportError, AttributeError):
            pytest.skip("moss_tts_msgs is not built: scripts/build_msgs.sh .venv")
        for part in interface.parts:
            message = getattr(built, part.name) if part.name else built
            fields = [row.name for row in part.rows if not row.constant]
            assert fields == list(message.get_fields_and_field_types()), f"{interface.name} {part.name}"
            for row in part.rows:
                if row.constant:
                    assert str(getattr(message, row.name)) == row.value.strip('"'), row.name


def test_comments_continued_prose_kept_in_place_and_an_unreadable_line_refused(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    source = tmp_path / "srv" / "Ask.srv"
    source.write_text(
        "# Ask something.\n# On two lines.\n\nstring text  # what to ask\nint64 seed -1 # the seed,\n"
        "              # continued\n# Prose between.\nuint8 A = 1\n---\nbool success\n",
        encoding="utf-8",
    )
    ask = parse(source)
    assert ask.about == "Ask something. On two lines."
    request, response = ask.parts
    assert [(r.name, r.default, r.value, r.comment) for r in request.rows] == [
        ("text", None, None, "what to ask"),
        ("seed", "-1", None, "the seed, continued"),
        ("A", None, "1", ""),
    ]
    assert request.blocks[2] == "Prose between."
    assert response.rows[0].name == "success" and not response.rows[0].comment
    written = reference([ask])
    assert "| `seed` | `int64` | `-1` | the seed, continued |" in written
    assert written.index("Prose between.") < written.index("| constant | type | value | meaning |")
    source.write_text("string text # fine\nnot a field at all\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"Ask.srv:2: cannot read 'not a field at all'"):
        parse(source)


def test_a_page_without_the_markers_is_refused() -> None:
    page = PAGE.read_text(encoding="utf-8").replace(end_marker(SECTION), "")
    with pytest.raises(ValueError, match=SECTION):
        render(page)
