"""``--set KEY=VALUE``: config overrides on the command line, for every command that loads a params file.

Shared by ``cli/`` and ``dev/`` (bench), so it sits beside them rather than in either.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import yaml

from moss_tts_node.errors import RequestError


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable): config overrides, read by ``parse_overrides``."""
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any config key, e.g. llama.n_threads=2"
    )


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """The pairs as config values, each read as YAML, except that a key that takes a string gets the text as typed:
    ``--set llama.flash_attn=off`` means the word, which YAML would read as False."""
    from moss_tts_node.config import OPTIONS

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise RequestError(f"--set {pair!r}: expected KEY=VALUE, e.g. llama.n_threads=2")
        key = key.strip()
        option = OPTIONS.get(key)
        parsed = yaml.safe_load(value) if value.strip() else ""
        if option is not None and option.type is str and isinstance(parsed, bool):
            parsed = value.strip()
        overrides[key] = parsed
    return overrides
