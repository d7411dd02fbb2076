"""The speech API's shape without a socket (http/api.py): a body becomes the SpeechRequest a ROS goal of the same
fields would, the remote backend's body for a request is read back as that request, and the lists are in the
shapes their clients read (test_http_formats.py: the audio bodies)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moss_tts_node.config import LimitsConfig
from moss_tts_node.errors import RequestError
from moss_tts_node.http.api import (
    ApiError,
    audio_models_list,
    max_body_bytes,
    model_card,
    models_list,
    parsed_body,
    request_body,
    speech_order,
    voices_list,
)
from moss_tts_node.synthesis.request import SpeechRequest, check_request
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary

MODEL = "MOSS-TTS"


def voice(name: str, transcript: str | None = None) -> LibraryVoice:
    return LibraryVoice(
        name, np.zeros((25, 32), np.int64), Path(f"/v/{name}.npy"), Path(f"/v/{name}.npy"), True, transcript
    )


LIBRARY = VoiceLibrary({"butler": voice("butler", "Good evening."), "guide": voice("guide")}, "guide")


def test_a_body_becomes_the_request_of_its_fields() -> None:
    order = speech_order(
        {
            "model": MODEL,
            "input": "Dinner is served.",
            "voice": "guide",
            "instructions": "calm",
            "language": "en",
            "seed": 7,
            "prefix_voice": "butler",
            "response_format": "pcm",
            "tokens": 40,
        },
        MODEL,
        LIBRARY,
    )
    request = order.request
    assert (order.response_format, order.stream) == ("pcm", True)
    assert (request.text, request.instruction, request.language, request.seed, request.tokens) == (
        "Dinner is served.",
        "calm",
        "en",
        7,
        40,
    )
    assert request.voice is LIBRARY["guide"] and request.prefix is LIBRARY["butler"]
    check_request(request, LimitsConfig())


@pytest.mark.parametrize(
    ("voice_fields", "expected"),
    [({}, None), ({"voice": "default"}, None), ({"voice": ""}, ""), ({"voices": ["butler", ""]}, ["butler", None])],
)
def test_the_default_voice_no_voice_and_speakers(voice_fields: dict[str, object], expected: object) -> None:
    request = speech_order({"input": "Hi.", **voice_fields}, MODEL, LIBRARY).request
    if isinstance(expected, list):
        assert [v if v is None else v.name for v in request.voice] == expected
    else:
        assert request.voice == expected


def test_the_remote_backends_body_reads_back_as_its_request() -> None:
    request = SpeechRequest(
        "Hello.",
        language="fr",
        instruction="slow",
        seed=3,
        voice=LIBRARY["butler"],
        prefix=LIBRARY["butler"],
        max_new_tokens=99,
        scene="a hall",
    )
    body = request_body(request, MODEL, "pcm", stream=True)
    assert body == {
        "model": MODEL,
        "input": "Hello.",
        "response_format": "pcm",
        "stream": True,
        "stream_format": "audio",
        "instructions": "slow",
        "language": "fr",
        "scene": "a hall",
        "seed": 3,
        "max_new_tokens": 99,
        "voice": "butler",
        "prefix_voice": "butler",
    }
    back = speech_order(body, MODEL, LIBRARY).request
    for field in ("text", "language", "instruction", "seed", "max_new_tokens", "scene"):
        assert getattr(back, field) == getattr(request, field)
    assert back.voice is LIBRARY["butler"] and back.prefix is LIBRARY["butler"]


def test_a_voice_that_is_no_name_cannot_be_sent() -> None:
    with pytest.raises(ApiError, match="must be a voice name of the remote server"):
        request_body(SpeechRequest("Hi.", voice=np.zeros((3, 32), np.int64)), MODEL, "pcm", stream=False)


def test_bad_bodies_name_their_field() -> None:
    with pytest.raises(ApiError) as unknown:
        speech_order({"input": "Hi.", "ref_audio": "/etc/passwd"}, MODEL, LIBRARY)
    assert unknown.value.status == 400 and unknown.value.param == "ref_audio"
    for speed in (0.2, 4.5, "fast", True):
        with pytest.raises(ApiError, match=r"speed must be a number from 0\.25 to 4") as too_fast:
            speech_order({"input": "Hi.", "speed": speed}, MODEL, LIBRARY)
        assert too_fast.value.param == "speed"
    with pytest.raises(ApiError, match="'sse' streams the audio") as whole_sse:
        speech_order({"input": "Hi.", "stream_format": "sse", "stream": False}, MODEL, LIBRARY)
    assert whole_sse.value.param == "stream"
    with pytest.raises(ApiError, match="give one of mp3, opus, aac, flac, wav, pcm"):
        speech_order({"input": "Hi.", "response_format": "ogg"}, MODEL, LIBRARY)
    with pytest.raises(ApiError, match="must be a JSON object"):
        parsed_body(b"3")
    assert ApiError(404, "gone", code="model_not_found").body == {
        "error": {"message": "gone", "type": "invalid_request_error", "param": None, "code": "model_not_found"}
    }


def test_no_format_is_mp3_as_openai_answers_unless_the_owner_chose_another() -> None:
    """Every format streams by default; Home Assistant's body (mp3, a speed) is taken as it is sent."""
    plain = speech_order({"input": "Hi."}, MODEL, LIBRARY)
    assert (plain.response_format, plain.stream, plain.speed, plain.sse) == ("mp3", True, 1.0, False)
    assert speech_order({"input": "Hi."}, MODEL, LIBRARY, "opus").response_format == "opus"
    home_assistant = {"model": MODEL, "input": "Hi.", "voice": "guide", "response_format": "mp3", "speed": 1.5}
    order = speech_order(home_assistant, MODEL, LIBRARY)
    assert (order.response_format, order.stream, order.speed, order.sse) == ("mp3", True, 1.5, False)
    assert speech_order({"input": "Hi.", "stream_format": "sse"}, MODEL, LIBRARY).sse


def test_the_lists_are_in_the_shapes_their_clients_read() -> None:
    """Open WebUI reads {"voices": [{"id", "name"}]} and {"models": [{"id"}]}; OpenAI's client {"data": [...]}."""
    voices = voices_list(LIBRARY)["voices"]
    assert [(v["id"], v["name"], v["is_default"]) for v in voices] == [
        ("butler", "butler", False),
        ("guide", "guide", True),
    ]
    assert audio_models_list(MODEL) == {"models": [{"id": MODEL, "name": MODEL}]}
    assert models_list(MODEL)["data"] == [model_card(MODEL)]


def test_the_body_bound_holds_the_longest_text_a_request_may_have() -> None:
    limits = LimitsConfig(max_text_chars=100)
    import json

    longest = json.dumps({"model": MODEL, "input": "\U0001f600" * 100, "instructions": ""}).encode()
    assert len(longest) < max_body_bytes(limits)


def test_a_remote_backend_needs_a_url_and_no_voices_of_its_own(tmp_path: Path) -> None:
    """model.backend remote loads no model files (none need be there), and its voices are the server's."""
    from moss_tts_node.config import from_flat
    from moss_tts_node.errors import ConfigError

    remote = {"model.backend": "remote", "model.weights_dir": "/nowhere", "model.remote_url": "http://gpu:8000/v1"}
    assert from_flat(remote, tmp_path, "test").model.remote_url == "http://gpu:8000/v1"
    with pytest.raises(ConfigError, match=r"'model\.remote_url' must be the speech server's http:// or https://"):
        from_flat({**remote, "model.remote_url": "gpu:8000"}, tmp_path, "test")
    with pytest.raises(ConfigError, match=r"'voices\.directories' is set, but with model\.backend remote"):
        from_flat({**remote, "voices.directories": (str(tmp_path),)}, tmp_path, "test")
    with pytest.raises(ConfigError, match=r"'model\.remote_api_key_file' file not found"):
        from_flat({**remote, "model.remote_api_key_file": str(tmp_path / "key")}, tmp_path, "test")


def test_a_voice_added_to_the_library_is_found_at_once_and_removed_the_same_way() -> None:
    """VoiceLibrary.add and remove (the server's uploaded voices): a name, never replaced; the default stays."""
    library = VoiceLibrary({"guide": voice("guide")}, "guide")
    added = voice("visitor", "Hello there.")
    library.add(added)
    assert library.named("visitor", "voice", "the list") is added
    assert library.find("/v/visitor.npy", "voice", "") is added
    assert library.names == ["guide", "visitor"]
    with pytest.raises(RequestError, match="'visitor' exists already"):
        library.add(voice("visitor"))
    with pytest.raises(RequestError, match="'guide' exists already"):
        library.add(voice("guide"))
    assert library.remove("visitor") is added
    assert "visitor" not in library and library.get("visitor") is None
    with pytest.raises(RequestError, match=r"'/v/visitor\.npy' is not a voice"):
        library.find("/v/visitor.npy", "voice", "")
    with pytest.raises(KeyError):
        library.remove("visitor")
    with pytest.raises(ValueError, match="default voice"):
        library.remove("guide")
