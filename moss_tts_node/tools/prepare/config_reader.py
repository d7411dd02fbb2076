"""Reading a checkpoint's ``config.json``: the file as a JSON object, and its values typed and checked.

Both builders read one (``convert`` the model's, ``build-stream-decoder`` the codec's); every failure names the
file and the key, and is raised as the caller's own error type, so each command keeps its messages' kind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moss_tts_node.errors import MossTTSError

_MISSING: Any = object()  # no default: the key is required


def read_json_object(path: Path, error: type[MossTTSError], missing_hint: str) -> dict[str, Any]:
    """``path``'s JSON object; ``error`` (``missing_hint`` says what to point at) when it is absent, unreadable
    or not an object."""
    if not path.is_file():
        raise error(f"{path} not found; {missing_hint}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


class ConfigReader:
    """Typed access to a config's values; ``where`` is the dotted path of the mapping a key is in ("" at the
    top), so a failure reads ``<file>: language_config.hidden_size must be ...``."""

    def __init__(self, path: Path, error: type[MossTTSError]) -> None:
        self.path = path
        self.error = error

    def fail(self, key: str, problem: str) -> MossTTSError:
        return self.error(f"{self.path}: {key} {problem}")

    def value(self, mapping: Mapping[str, Any], key: str, where: str, default: Any = _MISSING) -> Any:
        if key in mapping:
            return mapping[key]
        if default is _MISSING:
            raise self.fail(_dotted(where, key), "is missing; is this the right config.json?")
        return default

    def number(self, mapping: Mapping[str, Any], key: str, where: str, default: Any = _MISSING) -> float:
        """A positive number (an int stays an int)."""
        value = self.value(mapping, key, where, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(_dotted(where, key), f"must be a positive number, got {value!r}")
        return value

    def integer(self, mapping: Mapping[str, Any], key: str, where: str, default: Any = _MISSING) -> int:
        value = self.value(mapping, key, where, default)
        if type(value) is not int or value <= 0:
            raise self.fail(_dotted(where, key), f"must be a positive integer, got {value!r}")
        return value

    def mapping(self, mapping: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
        value = self.value(mapping, key, where)
        if not isinstance(value, dict):
            raise self.fail(_dotted(where, key), f"must be an object, got {type(value).__name__}")
        return value


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
