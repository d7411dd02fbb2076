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
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise RequestError(f"--set {pair!r}: expected KEY=VALUE, e.g. llama.n_threads=2")
        overrides[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return overrides
