"""docs/usage.md's option tables are what tools/cli/usage_reference.py writes from the CLI's parsers, and every
command the docs show is one the CLI takes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from generated_pages import assert_page_is_written

from moss_tts_node.tools.cli import batch
from moss_tts_node.tools.cli.main import build_parser
from moss_tts_node.tools.cli.usage_reference import (
    BATCH_KEYS_SECTION,
    COMMAND,
    COMMANDS_SECTION,
    PAGE,
    begin,
    commands,
    options,
    render,
)
from moss_tts_node.tools.doc_sections import end_marker

REPO = Path(__file__).resolve().parents[1]
PARSER = build_parser()
COMMANDS = commands(PARSER)


def test_the_checked_in_page_is_what_the_parsers_write() -> None:
    assert_page_is_written(PAGE, render, "the CLI's parsers", COMMAND)


def test_a_stale_row_is_written_anew_and_every_option_and_key_has_one() -> None:
    page = PAGE.read_text(encoding="utf-8")
    stale = page.replace("| `--prefix-text` | text |", "| `--prefix-txt` | text |").replace("| `scene` |", "")
    assert stale != page and render(stale) == page
    for name, (_, parser) in COMMANDS.items():
        assert page.count(f"### `{name}`\n") == 1, name
        for action in options(parser):
            assert action.help, f"{name} {action.option_strings or action.dest} has no help: the docs would say nothing"
    keys = page[page.index(begin(BATCH_KEYS_SECTION)) : page.index(end_marker(BATCH_KEYS_SECTION))]
    for key in batch.JSONL_FIELDS:
        assert keys.count(f"| `{key}` |") == 1, key


def test_a_page_without_the_markers_is_refused_with_where_they_go() -> None:
    for section in (COMMANDS_SECTION, BATCH_KEYS_SECTION):
        page = PAGE.read_text(encoding="utf-8").replace(end_marker(section), "")
        with pytest.raises(ValueError, match=section) as refused:
            render(page)
        assert begin(section) in str(refused.value)


# -- the commands the docs show --------------------------------------------------------------------------------

_FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SHOWN = re.compile(r"python -m moss_tts_node ([a-z][a-z-]*)(.*)")
_OTHER_COMMAND = re.compile(r" \| | && |\s#\s|; ")  # where a shown command line goes on to another, or a comment
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def shown_commands(text: str) -> Iterator[tuple[str, str]]:
    """(command, the rest of its line) of every ``python -m moss_tts_node COMMAND ...`` of a Markdown page: in code
    blocks, whose lines a trailing backslash continues, and in inline code, which may wrap."""
    snippets = [block.replace("\\\n", " ") for block in _FENCED.findall(text)]
    snippets += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", _FENCED.sub("", text))]
    for snippet in snippets:
        for match in _SHOWN.finditer(snippet):
            yield match.group(1), _OTHER_COMMAND.split(match.group(2))[0]


def problems(text: str) -> list[str]:
    """What is wrong with the commands ``text`` shows: no such command, an option it does not take, one it requires
    left out."""
    found = []
    for name, rest in shown_commands(text):
        if name not in COMMANDS:
            found.append(f"no command {name!r}")
            continue
        takes = options(COMMANDS[name][1])
        flags = {flag for action in takes for flag in action.option_strings}
        required = {action.option_strings[0] for action in takes if action.required and action.option_strings}
        used = set(_FLAG.findall(rest))
        found += [f"{name} takes no {flag}" for flag in sorted(used - flags)]
        found += [f"{name} {rest.strip()!r} lacks its required {flag}" for flag in sorted(required - used)]
    return found


def test_every_command_the_docs_show_takes_the_options_shown_and_has_its_required_ones() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    shown = {page.name: list(shown_commands(page.read_text(encoding="utf-8"))) for page in pages}
    assert len(shown["usage.md"]) > len(COMMANDS)  # the synopsis at least
    wrong = {page.name: problems(page.read_text(encoding="utf-8")) for page in pages}
    assert not any(wrong.values()), {name: found for name, found in wrong.items() if found}


def test_the_check_of_a_shown_command_finds_what_it_is_for() -> None:
    text = (
        "`llm | python -m moss_tts_node synth --text - --play`\n\n```bash\npython -m moss_tts_node batch L \\\n"
        "    --out D --config c.yaml --voice v  # a comment --x\npython -m moss_tts_node speak\n```\n"
    )
    assert problems(text) == [
        "batch takes no --voice",
        "no command 'speak'",
        "synth '--text - --play' lacks its required --config",
    ]
