"""What each field of a request is, and which interfaces carry it: declared once, where ``SpeechRequest`` declares
its fields (``synthesis/request.py``), and read back from there by every adapter.

Beside the name, type and default the dataclass gives, ``declared`` says of a field what kind of value it holds
(what ``check_request`` checks), whether it is a field of the prompt (``PromptFields``, ``text/prompt.py``) and which
config key a None takes there, how the ROS request messages carry it (the Speak goal, the Synthesize request and a
TextChunk: moss_tts_msgs/), whether the CLI's ``synth``, batch's JSONL lines and the speech API take it under its
own name, and its help. ``request_fields`` reads it all back as ``RequestField``s: ``check_request``, the prompt's
fields, the ROS mapping (``ros/messages.py``), the CLI's flags, batch's keys, the API's extras and the keyword
signature of ``Synthesizer.stream`` are made from them, and a test holds the ROS interface files to them.

Adding a field is one ``declared`` entry on ``SpeechRequest`` plus its line in each interface file (and, for a field
of the prompt, its place in ``PromptFields``, which test/test_request_fields.py ties to the entry, and its label in
the templates, ``model/template.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

# The kinds of value a field holds, which say how ``check_request`` checks it.
TEXT = "text"  # a string a user writes: counted in limits.max_text_chars, valid Unicode; None but for the text
COUNT = "count"  # a whole number from 1 to generation.max_new_tokens' maximum
SEED = "seed"  # -1 (sampling.seed) or a seed of sampling.seed's range
VOICES = "voices"  # one voice, or one per speaker
VOICE = "voice"  # one voice
SAMPLING = "sampling"  # a SamplingConfig
KINDS = (TEXT, COUNT, SEED, VOICES, VOICE, SAMPLING)

_METADATA_KEY = "moss_tts_node.request_field"


@dataclass(frozen=True)
class RosField:
    """A field of the ROS request messages as their interface files write it: ``type name default``. ``unset`` is
    the value that says the field is not given (the request's None); None: every value is kept as it came."""

    name: str
    type: str = "string"
    default: str | None = None
    unset: str | int | None = ""


@dataclass(frozen=True)
class RequestField:
    """One field of ``SpeechRequest``, as ``declared`` declares it.

    ``ros``: the fields of the ROS request messages that carry it; ``ros_by_name``: they name voices of the node's
    library, which the node looks up itself (``ros/voices.py``), else the one field is the value, ``unset`` meaning
    None. ``cli``: the CLI's ``synth`` takes it as ``--name-with-dashes`` (``cli_flag``); ``batch``: a JSONL line of
    ``batch`` under its name; ``http``: the speech API's body under its name (an extra of OpenAI's request)."""

    name: str
    annotation: Any  # the type as the class writes it (a string, under postponed annotations)
    default: Any  # dataclasses.MISSING: required
    kind: str
    help: str
    prompt: bool
    config_default: str | None  # the config key whose value the prompt takes where the request leaves it None
    ros: tuple[RosField, ...]
    ros_by_name: bool
    cli: bool
    batch: bool
    http: bool

    @property
    def cli_flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def from_ros(self, message: object) -> Any:
        """The value a ROS request message gives this field (not one of those named by name)."""
        (carrier,) = self.ros
        value = getattr(message, carrier.name)
        return None if carrier.unset is not None and value == carrier.unset else value


def declared(
    default: Any = dataclasses.MISSING,
    *,
    kind: str,
    help: str,
    prompt: bool = False,
    config_default: str | None = None,
    ros: tuple[RosField, ...] = (),
    ros_by_name: bool = False,
    cli: bool = False,
    batch: bool = False,
    http: bool = False,
) -> Any:
    """A dataclass field of ``SpeechRequest`` with what ``RequestField`` says of it (typed Any, as
    ``dataclasses.field`` is, so that the class's annotation is the field's type)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    if ros and not ros_by_name and len(ros) != 1:
        raise ValueError("a field given by value travels in one ROS field")
    said = RequestField("", None, default, kind, help, prompt, config_default, ros, ros_by_name, cli, batch, http)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: said})  # request_fields adds name and type


def request_fields(cls: type) -> tuple[RequestField, ...]:
    """The declared fields of the dataclass ``cls``, in its order."""
    return tuple(
        dataclasses.replace(field.metadata[_METADATA_KEY], name=field.name, annotation=field.type)
        for field in dataclasses.fields(cls)
    )


_Method = TypeVar("_Method", bound=Callable[..., Any])


def with_request_keywords(fields: tuple[RequestField, ...]) -> Callable[[_Method], _Method]:
    """A decorator for a method taking ``request`` (its text, say) and ``**fields``: the signature that ``help()``
    and ``inspect`` show then lists the request's other fields as the keyword-only parameters they are, typed and
    with their defaults, in place of ``**fields``."""

    def decorate(method: _Method) -> _Method:
        signature = inspect.signature(method)
        given = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in given}
        keywords = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.annotation)
            for f in fields
            if f.name not in taken and f.default is not dataclasses.MISSING
        ]
        method.__signature__ = signature.replace(parameters=[*given, *keywords])  # type: ignore[attr-defined]
        return method

    return decorate
