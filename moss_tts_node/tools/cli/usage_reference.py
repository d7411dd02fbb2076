"""The command reference: docs/usage.md's option tables, written from the CLI's own parsers.

Every command's table is read from the parser ``python -m moss_tts_node`` builds (``main.build_parser``), and the
JSONL keys of a batch list from ``batch.JSONL_FIELDS``, each key's meaning from ``batch.JSONL_KEY_HELP`` or else
from ``synth``'s option for the same request field: the page says what the parsers take, and a help text is
edited where the option is declared. The tables stand between marker lines; the page's prose around them is its
own. Rewrite them with::

    python -m moss_tts_node.tools.cli.usage_reference

``test/test_usage_reference.py`` fails while the page differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moss_tts_node.tools.cli import batch
from moss_tts_node.tools.cli.main import build_parser
from moss_tts_node.tools.doc_sections import begin_marker, cell, replace_section, rewrite

PAGE = Path(__file__).resolve().parents[3] / "docs" / "usage.md"
COMMAND = "python -m moss_tts_node.tools.cli.usage_reference"
COMMANDS_SECTION = "command options"
BATCH_KEYS_SECTION = "batch keys"
_SOURCES = {COMMANDS_SECTION: "the CLI's parsers", BATCH_KEYS_SECTION: "batch.py and synth's options"}
_VALUE_NAMES = {Path: "path", int: "integer", float: "number", str: "text", None: "text"}


def begin(name: str) -> str:
    return begin_marker(name, COMMAND, _SOURCES[name])


def commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Each command of ``parser``, in the order ``--help`` lists them: its one-line help and its own parser.
    argparse has no public way to walk its subparsers; these attributes have been stable since Python 3.2."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {name: (summaries.get(name, ""), sub) for name, sub in action.choices.items()}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """What a command takes, ``--help`` left out."""
    return [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]


def command_tables(parser: argparse.ArgumentParser) -> str:
    """A heading, a line saying what it does and a table of options for every command of ``parser``."""
    sections = []
    for name, (summary, sub) in commands(parser).items():
        rows = "".join(
            f"| {_invocation(a)} | {_takes(a)} | {_default(a)} | {cell(a.help or '')} |\n" for a in options(sub)
        )
        about = cell(sub.description or summary)
        sections.append(f"### `{name}`\n\n{about}\n\n| option | takes | default | meaning |\n|---|---|---|---|\n{rows}")
    return "\n".join(sections)


def batch_keys_table(parser: argparse.ArgumentParser) -> str:
    """One row per key a JSONL line of a batch list may have: the ``synth`` option it stands for, and its meaning."""
    synth = {action.dest: action for action in options(commands(parser)["synth"][1])}
    rows = []
    for key in batch.JSONL_FIELDS:
        option = synth.get(key)
        meaning = batch.JSONL_KEY_HELP.get(key) or (option.help if option else None)
        if not meaning:
            raise ValueError(f"batch key {key!r} has no meaning: give it one in batch.JSONL_KEY_HELP")
        flag = f"`{option.option_strings[0]}`" if option and option.option_strings else ""
        rows.append(f"| `{key}` | {flag} | {cell(meaning)} |\n")
    return "| key | as `synth`'s | meaning |\n|---|---|---|\n" + "".join(rows)


def render(page: str) -> str:
    """``page`` with its tables written anew; raises ValueError when a marker is missing."""
    parser = build_parser()
    for name, body in ((COMMANDS_SECTION, command_tables(parser)), (BATCH_KEYS_SECTION, batch_keys_table(parser))):
        page = replace_section(page, PAGE.name, name, begin(name), body)
    return page


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return " ".join(f"`{flag}`" for flag in action.option_strings)


def _takes(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "a switch"
    kind = " ".join(f"`{choice}`" for choice in action.choices) if action.choices else _VALUE_NAMES[action.type]
    return f"{kind}, repeatable" if isinstance(action, argparse._AppendAction) else kind


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default is None or action.default is False or action.default == []:  # 0 is a default to show
        return ""
    return f"`{action.default}`"


def main() -> int:
    print(rewrite(PAGE, render(PAGE.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
