"""The node's parameters: which there are, how ROS describes them, and the check of a full set of values.

Pure (no node), so every rule here is tested without a middleware (``test/test_ros_parameters.py``). The
parameters are the config keys (``config.OPTIONS``: the same names, ranges and messages as a config file
for the CLI) and the few in ``NODE_OPTIONS`` that only a node has.

When a parameter may change (docs/ros.md, "Parameters"; docs/security.md):

- a key marked ``per_request`` is read for each request (from the ``Settings`` it was accepted under), so
  it may change in any state;
- the ``STARTUP_KEYS`` are read once, when the process starts (``queue_size`` sizes the executor's threads,
  ``autostart`` is what the process does first, the ``text_stream_*`` bounds hold for streams that arrive in
  any state): read-only parameters;
- the ``OWNER_KEYS`` are read-only too, whenever they are read: the limits of what a request may ask, and the
  voices, whose directories bound the files a remote path may name. Any participant of the domain may set a
  parameter that is not read-only, and a bound it could move would bound nothing: these, like the text
  stream bounds, come from the owner's parameter file;
- every other key is read when the model loads, on configure (model files, llama.cpp context, codec and
  heads backends, the encoded default voice): ``load_time``, changeable only while the node is
  unconfigured (``ros/lifecycle.py`` refuses it otherwise, with the way there). A key added to the config
  later is load-time until it is marked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

from moss_tts_node.config import OPTIONS, Config, Option, check_value, from_flat
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.ros.audio import ENCODINGS
from moss_tts_node.ros.text_stream import StreamLimits
from moss_tts_node.serving.queue import POLICIES
from moss_tts_node.synthesis.request import request_language
from moss_tts_node.text.languages import language_code


def _node_option(
    key: str,
    default: Any,
    doc: str,
    *,
    per_request: bool,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Option:
    return Option(key, type(default), default, doc, min, max, choices, path=False, per_request=per_request)


# Parameters of the node alone; the config keys come from config.OPTIONS.
NODE_OPTIONS = (
    _node_option(
        "queue_size",
        8,
        "Requests that may wait behind the one being spoken; more are refused.",
        per_request=False,
        min=0,
        max=64,
    ),
    _node_option(
        "autostart",
        True,
        "Configure and activate at start-up; false leaves the node unconfigured for a lifecycle manager.",
        per_request=False,
    ),
    _node_option(
        "queue_policy",
        "queue",
        "queue: first in, first out. interrupt: a new request stops the current one and drops those waiting.",
        per_request=True,
        choices=POLICIES,
    ),
    _node_option(
        "stop_empties_queue",
        True,
        "~/stop (service or topic) also drops every request waiting behind the one it stops, and those being "
        "checked; false: the next one in line is spoken.",
        per_request=True,
    ),
    _node_option(
        "output_encoding",
        ENCODINGS[0],
        "Sample encoding of ~/audio and of the synthesize response.",
        per_request=True,
        choices=ENCODINGS,
    ),
    _node_option(
        "text_stream_max_open",
        4,
        "~/text_stream streams that may receive text at once; a new one beyond them is refused.",
        per_request=False,
        min=0,
        max=64,
    ),
    _node_option(
        "text_stream_max_chars",
        20000,
        "Characters one ~/text_stream stream may hold (a long LLM reply is 2,000 to 5,000); the chunk that would "
        "pass them closes the stream with what it had.",
        per_request=False,
        min=1,
        max=1_000_000,
    ),
    _node_option(
        "text_stream_idle_timeout",
        10.0,
        "Seconds without a chunk after which a ~/text_stream stream is taken as abandoned: what it received is "
        "spoken and it ends.",
        per_request=False,
        min=0.1,
        max=3600.0,
    ),
    _node_option(
        "text_stream_max_duration",
        300.0,
        "Seconds a ~/text_stream stream may stay open from its first chunk, however often chunks come; then what "
        "it received is spoken and it ends (a reply of 5,000 characters takes about 1.5 minutes at 15 tokens a "
        "second).",
        per_request=False,
        min=1.0,
        max=86400.0,
    ),
    _node_option(
        "languages",
        [],
        "Languages a request may ask for, codes or English names, e.g. [en, zh]; empty accepts all 31. An empty "
        "request language takes generation.language.",
        per_request=True,
    ),
    _node_option(
        "max_response_seconds",
        120.0,
        "Most seconds of audio in one ~/synthesize response: a text expected to take longer is refused, and "
        "the response stops there (it is held whole until it is sent).",
        per_request=True,
        min=0.08,
        max=3600.0,
    ),
)
ALL_OPTIONS: dict[str, Option] = {**OPTIONS, **{o.key: o for o in NODE_OPTIONS}}
STARTUP_KEYS = (
    "queue_size",
    "autostart",
    "text_stream_max_open",
    "text_stream_max_chars",
    "text_stream_idle_timeout",
    "text_stream_max_duration",
)
OWNER_KEYS = ("limits.", "max_response_seconds", "voices.")  # prefixes, or whole keys
INT64_MAX = 2**63 - 1  # a ROS integer parameter's range where an option has no bound of its own
LOAD_TIME_CONSTRAINT = "changeable only while the node is unconfigured (read when the model loads, on configure)"


@dataclass(frozen=True)
class Startup:
    """The parameters read once, when the process starts."""

    queue_size: int
    autostart: bool
    text_stream_max_open: int
    text_stream_max_chars: int
    text_stream_idle_timeout: float
    text_stream_max_duration: float

    @property
    def text_stream_limits(self) -> StreamLimits:
        return StreamLimits(
            self.text_stream_max_open,
            self.text_stream_max_chars,
            self.text_stream_idle_timeout,
            self.text_stream_max_duration,
        )


@dataclass(frozen=True)
class Settings:
    """Every parameter, checked: the synthesizer's config and the node's own.

    Immutable and replaced whole on a parameter change, so a request accepted under one keeps it
    (its snapshot) whatever changes while it waits or runs.
    """

    config: Config
    queue_policy: str
    stop_empties_queue: bool
    output_encoding: str
    languages: tuple[str, ...]  # codes (text/languages.py), whatever spelling the parameter used
    max_response_seconds: float

    def check_language(self, language: str | None) -> None:
        """Raise RequestError unless a request may ask for ``language`` (None: generation.language), in any of
        its spellings (a code or an English name)."""
        if language is None:
            return
        code = language_code(request_language(language))
        if self.languages and code not in self.languages:
            raise RequestError(
                f"unknown language {language!r}: this node accepts {', '.join(self.languages)} (parameter 'languages')"
            )


def read_only(option: Option) -> bool:
    """Whether the node refuses to change this parameter in any state: it is read when the process starts,
    or it bounds what a remote participant may do."""
    return option.key in STARTUP_KEYS or option.key.startswith(OWNER_KEYS)


def load_time(option: Option) -> bool:
    """Whether this parameter is read when the model loads, so that it may change only while none is loaded."""
    return not option.per_request and not read_only(option)


def descriptor(option: Option) -> ParameterDescriptor:
    """A parameter's description, range, choices, read-only flag and when it may change, from its Option.

    Typing is dynamic so that values are checked by ``check_value`` exactly as in a config file
    (``1`` is a valid float there, and a wrong type gets the same message as from the CLI).
    """
    described = ParameterDescriptor(
        name=option.key, description=option.doc, dynamic_typing=True, read_only=read_only(option)
    )
    constraints = [f"one of: {', '.join(option.choices)}"] if option.choices else []
    if load_time(option):
        constraints.append(LOAD_TIME_CONSTRAINT)
    described.additional_constraints = "; ".join(constraints)
    if option.type is int and (option.min is not None or option.max is not None):
        low = -INT64_MAX - 1 if option.lowest is None else int(option.lowest)
        high = INT64_MAX if option.max is None else int(option.max)
        described.integer_range = [IntegerRange(from_value=low, to_value=high, step=0)]
    if option.type is float and (option.min is not None or option.max is not None):
        low = -math.inf if option.lowest is None else option.lowest
        high = math.inf if option.max is None else option.max
        described.floating_point_range = [FloatingPointRange(from_value=low, to_value=high, step=0.0)]
    return described


def declarations() -> list[tuple[str, Any, ParameterDescriptor]]:
    """Every parameter as ``Node.declare_parameters`` takes it: name, default, descriptor."""
    return [(o.key, o.default, descriptor(o)) for o in ALL_OPTIONS.values()]


def checked_values(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Validate each value on its own as the CLI validates a config file's (type, range, choices; ``languages``
    becomes codes); raises ConfigError. ``source`` begins each message (the node's "<name> parameters")."""
    checked = {key: check_value(ALL_OPTIONS[key], value, source) for key, value in values.items()}
    if "languages" in checked:
        checked["languages"] = _language_codes(checked["languages"], source)
    return checked


def checked_settings(values: Mapping[str, Any], source: str, base_dir: Path) -> Settings:
    """Validate a value for every parameter, each and together, as the CLI validates a config file; raises
    ConfigError.

    Relative paths are taken from ``base_dir`` (the node's working directory, as ``ros2 run --params-file``
    leaves them).
    """
    checked = checked_values(values, source)
    config = from_flat({key: checked[key] for key in OPTIONS}, base_dir, source)
    return Settings(config=config, **{o.key: checked[o.key] for o in NODE_OPTIONS if o.key not in STARTUP_KEYS})


def checked_startup(values: Mapping[str, Any], source: str) -> Startup:
    """The ``STARTUP_KEYS`` of ``values``, validated; raises ConfigError."""
    return Startup(**checked_values({key: values[key] for key in STARTUP_KEYS}, source))


def _language_codes(languages: list[Any], source: str) -> tuple[str, ...]:
    if not all(isinstance(language, str) and language for language in languages):
        raise ConfigError(f"{source}: 'languages' must be a list of language codes or names, got {languages!r}")
    try:
        return tuple(dict.fromkeys(language_code(language) for language in languages))
    except ValueError as error:
        raise ConfigError(f"{source}: 'languages': {error}") from None
