"""The interface reference: docs/interfaces.md, every field of moss_tts_msgs written from the interface files.

Each field and constant of ``moss_tts_msgs/{msg,srv,action}`` is documented by the comment after it in its file
(an indented comment line below continues it); comment lines at the left margin are the file's own prose, kept
in their place. The page says what the files say, and a field's meaning is edited in its file: comments change no
interface. The reference stands between marker lines; the page's prose around it is its own. Rewrite it with::

    python -m moss_tts_node.tools.dev.interface_reference

``test/test_interface_reference.py`` fails while the page differs from what this writes, or a field has no comment.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from moss_tts_node.tools.doc_sections import begin_marker, cell, replace_section, rewrite

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "interfaces.md"
INTERFACES = REPO / "moss_tts_msgs"
COMMAND = "python -m moss_tts_node.tools.dev.interface_reference"
SECTION = "interface fields"
# Each kind of interface file, in the page's order, and the names of the parts its '---' lines separate.
PARTS = {"msg": ("",), "srv": ("Request", "Response"), "action": ("Goal", "Result", "Feedback")}
_SEPARATOR = "---"
_CONSTANTS = "| constant | type | value | meaning |\n|---|---|---|---|"
_FIELDS = "| field | type | default | meaning |\n|---|---|---|---|"
_ROW = re.compile(
    r"""^(?P<type>\S+) \s+ (?P<name>\w+)
    (?: \s*=\s* (?P<value>"[^"]*"|\S+)     # a constant: type NAME = value
      | \s+ (?P<default>"[^"]*"|\S+) )?     # a field, with its default
    \s* (?:\#\s? (?P<comment>.*))? $""",
    re.VERBOSE,
)


@dataclass
class Row:
    """A field (``value`` None) or a constant of an interface, and the comment its file gives it."""

    type: str
    name: str
    default: str | None
    value: str | None
    comment: str

    @property
    def constant(self) -> bool:
        return self.value is not None


@dataclass
class Part:
    """A message, or one part of a service (request, response) or action (goal, result, feedback): its rows and the
    prose between them, in file order."""

    name: str
    blocks: list[str | Row] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        return [block for block in self.blocks if isinstance(block, Row)]


@dataclass
class Interface:
    kind: str  # msg, srv or action
    name: str
    about: str  # the prose before its first row
    parts: list[Part]


def parse(path: Path) -> Interface:
    """The interface file at ``path`` (``.../msg/AudioChunk.msg``); raises ValueError, naming the line, on a line
    this cannot read."""
    kind = path.parent.name
    parts = [Part(name) for name in PARTS[kind]]
    about: list[str] = []
    index, last, prose = 0, None, False
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        blocks = parts[index].blocks
        if line == _SEPARATOR:
            index, last = index + 1, None
        elif not line:
            last, prose = None, False
        elif line.startswith("#") and raw[0].isspace() and last is not None:
            last.comment = f"{last.comment} {line[1:].strip()}".strip()
        elif line.startswith("#"):
            text = line[1:].strip()
            if index == 0 and not parts[0].blocks:
                about.append(text)
            elif prose:
                blocks[-1] = f"{blocks[-1]} {text}"
            else:
                blocks.append(text)
            prose, last = True, None
        elif match := _ROW.match(line):
            last = Row(match["type"], match["name"], match["default"], match["value"], match["comment"] or "")
            blocks.append(last)
            prose = False
        else:
            raise ValueError(f"{path}:{number}: cannot read {line!r} as a field or a constant")
    return Interface(kind, path.stem, " ".join(about), parts)


def interfaces(root: Path = INTERFACES) -> list[Interface]:
    """Every interface under ``root``, messages first, then services, then actions, each kind by name."""
    return [parse(path) for kind in PARTS for path in sorted((root / kind).glob(f"*.{kind}"))]


def reference(found: list[Interface]) -> str:
    """The Markdown of ``found``: a heading for each interface, its prose, and tables of its constants and fields."""
    sections = []
    for interface in found:
        text = f"## `{interface.kind}/{interface.name}`\n\n"
        text += f"{cell(interface.about)}\n\n" if interface.about else ""
        for part in interface.parts:
            if part.name:
                text += f"### {part.name}\n\n"
            text += _blocks(part) if part.blocks else "Nothing: an empty message.\n\n"
        sections.append(text)
    return "".join(sections)


def _blocks(part: Part) -> str:
    """The part's prose as paragraphs and each run of rows of one kind (constants, fields) as one table."""
    chunks: list[str] = []
    table_of: bool | None = None  # whether the table being written lists constants; None: no table open
    for block in part.blocks:
        if isinstance(block, str):
            chunks.append(cell(block))
            table_of = None
            continue
        if table_of != block.constant:
            chunks.append(_CONSTANTS if block.constant else _FIELDS)
            table_of = block.constant
        shown = block.value if block.constant else block.default
        chunks[-1] += f"\n| `{block.name}` | `{block.type}` | {f'`{shown}`' if shown else ''} | {cell(block.comment)} |"
    return "\n\n".join(chunks) + "\n\n"


def render(page: str) -> str:
    """``page`` with its reference written anew; raises ValueError when a marker is missing."""
    begin = begin_marker(SECTION, COMMAND, "the interface files' comments")
    return replace_section(page, PAGE.name, SECTION, begin, reference(interfaces()))


def main() -> int:
    print(rewrite(PAGE, render(PAGE.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
