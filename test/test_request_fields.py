"""The request's fields, declared once on SpeechRequest (synthesis/fields.py), against what is made from them and
what must agree with them: the ROS interface files (read as text, no ROS needed), the prompt's fields, the API's
keyword signatures, ``check_request``, the CLI's flags, batch's keys and the speech API's fields."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
from pathlib import Path
from typing import Any

import pytest

from moss_tts_node.config import OPTIONS, LimitsConfig
from moss_tts_node.errors import RequestError
from moss_tts_node.http.api import FIELDS, request_body, speech_order
from moss_tts_node.http.remote import RemoteSynthesizer
from moss_tts_node.synthesis.fields import COUNT, TEXT, RequestField
from moss_tts_node.synthesis.request import REQUEST_FIELDS, SpeechRequest, check_request
from moss_tts_node.synthesis.voices import VoiceLibrary
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.prompt import PromptFields
from moss_tts_node.tools.cli.batch import JSONL_FIELDS, Utterance
from moss_tts_node.tools.cli.main import build_parser

MSGS = Path(__file__).resolve().parents[1] / "moss_tts_msgs"
# Each request interface: its file, and which of its parts (between the --- lines) is the request.
REQUEST_INTERFACES = {"Synthesize request": ("srv/Synthesize.srv", 0), "Speak goal": ("action/Speak.action", 0)}
TEXT_CHUNK = ("msg/TextChunk.msg", 0)
STREAM_OWN = {"stream_id": ("string", None), "final": ("bool", None)}  # which stream a TextChunk is of, its end


def interface_fields(path: str, part: int) -> dict[str, tuple[str, str | None]]:
    """The fields of one part of an interface file: name -> (type, default), as ``type name [default]``."""
    lines = (MSGS / path).read_text().split("\n---\n")[part].splitlines()
    fields: dict[str, tuple[str, str | None]] = {}
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words or "=" in words:  # a comment, or a constant
            continue
        assert words[1] not in fields, f"{path}: {words[1]} twice"
        fields[words[1]] = (words[0], words[2] if len(words) > 2 else None)
    return fields


def declared_ros_fields() -> dict[str, tuple[str, str | None]]:
    return {ros.name: (ros.type, ros.default) for field in REQUEST_FIELDS for ros in field.ros}


@pytest.mark.parametrize("interface", list(REQUEST_INTERFACES))
def test_each_request_interface_has_the_declared_fields_and_no_other(interface: str) -> None:
    assert interface_fields(*REQUEST_INTERFACES[interface]) == declared_ros_fields()


def test_a_text_chunk_has_the_declared_fields_and_its_streams_own() -> None:
    assert interface_fields(*TEXT_CHUNK) == {**declared_ros_fields(), **STREAM_OWN}


def test_the_interface_reader_sees_a_field_the_declaration_lacks(tmp_path: Path, monkeypatch: Any) -> None:
    """The comparison above can fail: an interface with one more field than declared differs."""
    folder = tmp_path / "srv"
    folder.mkdir()
    text = (MSGS / "srv/Synthesize.srv").read_text().replace("\n---\n", "\nstring mood  # new\n---\n", 1)
    (folder / "Synthesize.srv").write_text(text)
    monkeypatch.setattr(f"{__name__}.MSGS", tmp_path)
    fields = interface_fields("srv/Synthesize.srv", 0)
    assert fields != declared_ros_fields() and fields["mood"] == ("string", None)


def test_the_prompt_fields_are_the_declared_ones() -> None:
    declared = [field.name for field in REQUEST_FIELDS if field.prompt]
    assert sorted(f.name for f in dataclasses.fields(PromptFields)) == sorted(["text", *declared])
    for field in REQUEST_FIELDS:
        assert field.config_default is None or OPTIONS[field.config_default].per_request, field.name


KEYWORD_METHODS = [
    Synthesizer.stream,
    Synthesizer.stream_text,
    Synthesizer.synthesize,
    Synthesizer.prepare_voice,
    RemoteSynthesizer.stream,
    RemoteSynthesizer.synthesize,
]


@pytest.mark.parametrize("method", KEYWORD_METHODS, ids=lambda m: m.__qualname__)
def test_the_request_keywords_show_typed_in_the_signature(method: Any) -> None:
    parameters = inspect.signature(method).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for field in REQUEST_FIELDS:
        if field.name == "text":  # the request's text is ``request``
            assert field.name not in parameters
            continue
        parameter = parameters[field.name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert (parameter.annotation, parameter.default) == (field.annotation, field.default)
    assert "language: 'str | None' = None" in pydoc.render_doc(method, renderer=pydoc.plaintext)


@pytest.mark.parametrize("field", [f for f in REQUEST_FIELDS if f.kind in (TEXT, COUNT)], ids=lambda f: f.name)
def test_check_request_checks_each_text_and_count_field(field: RequestField) -> None:
    bad = 3 if field.kind == TEXT else 0
    with pytest.raises(RequestError, match=f"the request's {field.name} must be"):
        check_request(SpeechRequest(**{"text": "Hi.", field.name: bad}), LimitsConfig())
    if field.kind == TEXT:
        with pytest.raises(RequestError, match=rf"{field.name}.* together"):
            check_request(SpeechRequest(**{"text": "Hi.", field.name: "x" * 20}), LimitsConfig(max_text_chars=10))


def test_the_character_limit_names_the_declared_text_fields() -> None:
    """config.py sits below the declaration and cannot read it: its help, which becomes docs/configuration.md and
    the ROS parameter's description, lists the fields limits.max_text_chars counts by hand, so it is held to it."""
    named = [f.name for f in REQUEST_FIELDS if f.kind == TEXT]
    assert f"{', '.join(named[:-1])} and {named[-1]} together" in OPTIONS["limits.max_text_chars"].doc


def test_the_cli_has_a_flag_for_each_field_declared_for_it() -> None:
    (synth,) = (action.choices["synth"] for action in build_parser()._actions if getattr(action, "choices", None))
    flags = {flag: action for action in synth._actions for flag in action.option_strings}
    values = {"language": "fr", "tokens": "40", "seed": "3", "scene": "a lab", "prefix_text": "Good."}
    argv = ["synth", "--config", "c.yaml"]
    for field in REQUEST_FIELDS:
        if field.cli:
            assert flags[field.cli_flag].help == field.help
            argv += [field.cli_flag, values.get(field.name, field.name)]
    args = build_parser().parse_args(argv)
    assert (args.tokens, args.seed, args.scene, args.language) == (40, 3, "a lab", "fr")


def test_batch_takes_each_field_declared_for_it() -> None:
    line_fields = {f.name: f for f in dataclasses.fields(Utterance)}
    for field in REQUEST_FIELDS:
        if field.batch:
            assert field.name in JSONL_FIELDS
            assert line_fields[field.name].default is None


def test_the_speech_api_round_trips_each_field_declared_for_it() -> None:
    given = {f.name: 5 if f.kind == COUNT or f.name == "seed" else f"the {f.name}" for f in REQUEST_FIELDS if f.http}
    assert set(given) <= set(FIELDS)
    body = request_body(SpeechRequest("Hi.", **given), "moss", "wav", stream=False)
    order = speech_order(body, "moss", VoiceLibrary({}, None))
    assert {name: getattr(order.request, name) for name in given} == given
