"""The speech API's shape without a socket (http/api.py, http/formats.py): a body becomes the SpeechRequest a ROS
goal of the same fields would, the remote backend's body for a request is read back as that request, and the
audio bodies hold the samples."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from moss_tts_node.config import LimitsConfig
from moss_tts_node.http.api import ApiError, max_body_bytes, parsed_body, request_body, speech_order
from moss_tts_node.http.formats import wav_header, whole_body
from moss_tts_node.pcm import float_to_pcm16
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
    with pytest.raises(ApiError, match="flac is sent whole") as streamed_flac:
        speech_order({"input": "Hi.", "response_format": "flac", "stream": True}, MODEL, LIBRARY)
    assert streamed_flac.value.param == "stream"
    with pytest.raises(ApiError, match="must be a JSON object"):
        parsed_body(b"3")
    assert ApiError(404, "gone", code="model_not_found").body == {
        "error": {"message": "gone", "type": "invalid_request_error", "param": None, "code": "model_not_found"}
    }


def test_the_body_bound_holds_the_longest_text_a_request_may_have() -> None:
    limits = LimitsConfig(max_text_chars=100)
    import json

    longest = json.dumps({"model": MODEL, "input": "\U0001f600" * 100, "instructions": ""}).encode()
    assert len(longest) < max_body_bytes(limits)


def test_the_audio_bodies_hold_the_samples() -> None:
    samples = np.sin(np.linspace(0, 40, 2400)).astype(np.float32) * 0.5
    pcm = float_to_pcm16(samples)
    assert whole_body(samples, 24000, "pcm") == pcm
    wav = whole_body(samples, 24000, "wav")
    read, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000
    np.testing.assert_array_equal(read, np.frombuffer(pcm, "<i2"))
    flac, _ = sf.read(io.BytesIO(whole_body(samples, 24000, "flac")), dtype="int16")
    np.testing.assert_array_equal(flac, np.frombuffer(pcm, "<i2"))
    streamed, _ = sf.read(io.BytesIO(wav_header(24000) + pcm), dtype="int16")  # sizes unknown: to the end
    np.testing.assert_array_equal(streamed, np.frombuffer(pcm, "<i2"))


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
