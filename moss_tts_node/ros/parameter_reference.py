"""The parameter reference: docs/configuration.md's two tables, written from the declarations.

Every config key (``config.OPTIONS``) is a parameter of the node, which adds its own (``parameters.NODE_OPTIONS``).
A row gives each one's type, default and range, when ``ros2 param set`` may change it (``parameters.read_only``
and ``load_time``) and its description, the text ``ros2 param describe`` shows: the page says what the code
declares, and a description is edited where it is declared. The tables stand between marker lines; the page's
prose around them is its own. Rewrite them with::

    python -m moss_tts_node.ros.parameter_reference

``test/test_parameter_reference.py`` fails while the page differs from what this writes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from moss_tts_node.config import OPTIONS, Option
from moss_tts_node.ros.parameters import INT64_MAX, NODE_OPTIONS, load_time, read_only

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMAND = "python -m moss_tts_node.ros.parameter_reference"
# The marker name of each table, and the parameters it lists.
TABLES: dict[str, tuple[Option, ...]] = {"config keys": tuple(OPTIONS.values()), "node parameters": NODE_OPTIONS}
_HEADER = "| parameter | type | default | range | `ros2 param set` | meaning |\n|---|---|---|---|---|---|\n"


def begin_marker(name: str) -> str:
    return f"<!-- {name}: written by `{COMMAND}` from the declarations; edit the descriptions there -->"


def end_marker(name: str) -> str:
    return f"<!-- end of {name} -->"


def table(options: Iterable[Option]) -> str:
    """A Markdown table of ``options``, one row each, in declaration order."""
    rows = (
        f"| `{o.key}` | {_type(o)} | {_default(o)} | {_range(o)} | {_changes(o)} | {_cell(o.doc)} |\n" for o in options
    )
    return _HEADER + "".join(rows)


def render(page: str) -> str:
    """``page`` with every table between its markers written anew; raises ValueError when a marker is missing."""
    for name, options in TABLES.items():
        begin, end = begin_marker(name), end_marker(name)
        start, stop = page.find(begin), page.find(end)
        if start < 0 or stop < start:
            raise ValueError(f"{PAGE.name} has no place for the {name}: put the lines {begin!r} and {end!r} there")
        page = f"{page[: start + len(begin)]}\n\n{table(options)}\n{page[stop:]}"  # blank lines keep it a table
    return page


def _type(option: Option) -> str:
    return "list of str" if option.type in (tuple, list) else option.type.__name__


def _default(option: Option) -> str:
    value = option.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return f"`[{', '.join(value)}]`"
    return "" if value == "" else f"`{value}`"


def _range(option: Option) -> str:
    if option.choices:
        return " ".join(option.choices)
    if option.keywords:
        return f"{' '.join(option.keywords)}, or a path"
    low = None if option.min is None else _number(option, option.min)
    high = None if option.max is None or option.max == INT64_MAX else _number(option, option.max)
    if low is not None and high is not None:
        span = f"{low} .. {high}"
    else:
        span = f">= {low}" if low is not None else ("" if high is None else f"<= {high}")
    # A key that also takes a value below its range meaning "not set" (the sampling keys' -1) says so.
    return span if option.unset is None else f"{_number(option, option.unset)}, or {span}"


def _number(option: Option, value: float) -> str:
    return str(int(value)) if option.type is int else f"{value:g}"


def _changes(option: Option) -> str:
    """When the node takes a new value (docs/ros.md, "Parameters")."""
    if read_only(option):
        return "never (read-only)"
    return "while unconfigured" if load_time(option) else "in any state"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def main() -> int:
    page = PAGE.read_text(encoding="utf-8")
    written = render(page)
    if written == page:
        print(f"{PAGE} is up to date")
    else:
        PAGE.write_text(written, encoding="utf-8")
        print(f"wrote the parameter tables of {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
