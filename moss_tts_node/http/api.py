"""The speech API's shape, as OpenAI's ``POST /v1/audio/speech`` defines it and this package's server and remote
backend both speak it: its paths, fields, formats and error body, and a request body as a ``SpeechRequest``.

Pure (no web framework), so the server (``http/server.py``) and the remote backend (``http/remote.py``) share one
home for every name of the API, and every rule here is tested without a socket (``test/test_http_api.py``).

A body is bounded before it is parsed (``max_body_bytes``), then every field is checked here by its HTTP name:
an unknown field is refused, not ignored; a voice is a name of the library, never a path (``voices_by_name``); the
MOSS fields go into the ``SpeechRequest`` as they came, for ``check_request`` to check like a ROS request's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from moss_tts_node.config import LimitsConfig
from moss_tts_node.model.family import MOSS_TTS
from moss_tts_node.model.identity import ModelIdentity
from moss_tts_node.synthesis.request import REQUEST_FIELDS, SpeechRequest
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary, voices_by_name

SPEECH_PATH = "/v1/audio/speech"
MODELS_PATH = "/v1/models"
VOICES_PATH = "/v1/audio/voices"
AUDIO_MODELS_PATH = "/v1/audio/models"  # Open WebUI's model menu
HEALTH_PATH = "/health"

# Every format streams (http/formats.py); mp3 is what OpenAI's API answers when a request names none. Ogg Opus is
# audio/ogg, the type a browser plays it as (audio/opus is RTP's).
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FORMATS = tuple(MEDIA_TYPES)
DEFAULT_FORMAT = "mp3"
SSE_MEDIA_TYPE = "text/event-stream"
SAMPLE_RATE_HEADER = "X-Sample-Rate"
CHANNELS_HEADER = "X-Channels"
SPEEDS = (0.25, 4.0)  # OpenAI's range; the audio is time-stretched, its pitch kept (http/formats.py)
STREAM_FORMATS = ("audio", "sse")
# A request's voice that asks for the server's default voice (none where it has none), as over ROS an empty one does.
DEFAULT_VOICE = "default"

# The fields of OpenAI's request that this server takes, then the MOSS fields it takes as extras (the openai
# client sends them in ``extra_body``): the SpeechRequest fields its declaration says the API takes under their own
# names (synthesis/fields.py), then the voices by name and whether to stream.
OPENAI_FIELDS = ("model", "input", "voice", "response_format", "speed", "instructions", "stream_format")
REQUEST_EXTRAS = tuple(field.name for field in REQUEST_FIELDS if field.http)
OTHER_EXTRAS = ("stream", "voices", "prefix_voice")
FIELDS = (*OPENAI_FIELDS, *REQUEST_EXTRAS, *OTHER_EXTRAS)

# Bytes of a body besides its text fields: the other fields' names and values, JSON's punctuation and spaces.
_BODY_OVERHEAD = 16384
# Bytes one character of text may take in JSON: a \uXXXX escape, twice for a character outside the BMP (a pair).
_BYTES_PER_CHAR = 12


class ApiError(Exception):
    """A request the API refuses: an HTTP status and OpenAI's error body (``body``)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code
        self.param = param

    @property
    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``, as OpenAI's API answers an error."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Order:
    """A speech request's body, checked: what to synthesize, in which format, streamed or whole."""

    request: SpeechRequest
    response_format: str
    stream: bool
    speed: float = 1.0
    sse: bool = False  # OpenAI's stream_format "sse": the audio in speech.audio.delta events


def max_body_bytes(limits: LimitsConfig) -> int:
    """The most bytes a body may hold: its text fields at ``limits.max_text_chars`` written the longest way JSON
    writes them, and the rest; a longer body is refused before it is read whole."""
    return limits.max_text_chars * _BYTES_PER_CHAR + _BODY_OVERHEAD


def parsed_body(data: bytes) -> dict[str, Any]:
    """The JSON object of a body (ApiError 400 for anything else)."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as error:  # RecursionError: nested deeper than the parser goes
        raise ApiError(400, f"the body is not JSON: {str(error)[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object of the request's fields, got {type(body).__name__}")
    return body


def speech_order(
    body: dict[str, Any], model_id: str, library: VoiceLibrary, default_format: str = DEFAULT_FORMAT
) -> Order:
    """A request body as an Order: every field checked by its name here, the voices looked up by name in
    ``library``, ``default_format`` where it names no format; what only the synthesizer can judge (the texts' types
    and lengths, the seed, the counts) is left in the SpeechRequest for ``check_request``. ApiError names the field
    at fault."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        shown = ", ".join(repr(name[:40]) for name in unknown[:5])
        raise ApiError(400, f"unknown field {shown}: this server takes {', '.join(FIELDS)}", param=unknown[0][:40])
    model = _string(body, "model", model_id)
    if model != model_id:
        raise ApiError(
            404,
            f"the model {model[:80]!r} is not served here: this server serves {model_id!r} (GET {MODELS_PATH})",
            code="model_not_found",
            param="model",
        )
    text = body.get("input")
    if not isinstance(text, str):
        raise ApiError(400, "'input' must be the text to speak, a string", param="input")
    response_format = _string(body, "response_format", default_format)
    if response_format not in FORMATS:
        raise ApiError(
            400,
            f"response_format {response_format[:20]!r} is not served here: give one of {', '.join(FORMATS)}",
            param="response_format",
        )
    speed = body.get("speed", 1.0)
    low, high = SPEEDS
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not low <= speed <= high:
        raise ApiError(400, f"speed must be a number from {low:g} to {high:g} (1 the model's own pace)", param="speed")
    stream_format = _string(body, "stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise ApiError(400, f"stream_format must be one of {', '.join(STREAM_FORMATS)}", param="stream_format")
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    if stream_format == "sse" and not stream:
        raise ApiError(400, "stream_format 'sse' streams the audio: leave stream out", param="stream")
    voice, prefix = _voices(body, library)
    fields = {name: body[name] for name in REQUEST_EXTRAS if name in body}
    request = SpeechRequest(text, instruction=body.get("instructions"), voice=voice, prefix=prefix, **fields)
    return Order(request, response_format, stream, float(speed), stream_format == "sse")


def request_body(request: SpeechRequest, model: str, response_format: str, stream: bool) -> dict[str, Any]:
    """The body that asks a server of this API for ``request``, its voices given by name (a remote server knows
    the voices by name, and no other way): the inverse of ``speech_order``, without the fields left at None."""
    body: dict[str, Any] = {"model": model, "input": request.text, "response_format": response_format}
    if stream:  # vLLM-Omni reads stream alone as Server-Sent Events; stream_format asks every server for the bytes
        body |= {"stream": True, "stream_format": "audio"}
    if request.instruction is not None:
        body["instructions"] = request.instruction
    body |= {name: getattr(request, name) for name in REQUEST_EXTRAS if getattr(request, name) is not None}
    voices = request.voice
    if isinstance(voices, list | tuple):
        body["voices"] = [_voice_name(voice, "voices") or "" for voice in voices]
    elif voices is not None:
        body["voice"] = _voice_name(voices, "voice") or ""
    if request.prefix is not None and _voice_name(request.prefix, "prefix"):
        body["prefix_voice"] = _voice_name(request.prefix, "prefix")
    return body


def _voice_name(voice: object, field: str) -> str | None:
    """A voice as a remote server takes it: its name (a string: a voice name of that server; "" none)."""
    name = getattr(voice, "name", voice)
    if not isinstance(name, str):
        raise ApiError(
            400,
            f"the request's {field} must be a voice name of the remote server (its {VOICES_PATH}), got "
            f"{type(voice).__name__}",
            param=field,
        )
    return name


def _voices(body: dict[str, Any], library: VoiceLibrary) -> tuple[Any, Any]:
    """A body's references (None: the default voice) and the voice it continues (None: none), by name."""
    voice = _string(body, "voice", DEFAULT_VOICE)
    names = body.get("voices")
    prefix_name = _string(body, "prefix_voice", "")
    prefix_text = _string(body, "prefix_text", "")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ApiError(400, "voices must be a list of voice names, one per speaker ([S1] first)", param="voices")
        if "voice" in body:
            raise ApiError(
                400, "give every speaker's voice in 'voices' alone ([S1] first), not also 'voice'", param="voice"
            )
    listing = f"GET {VOICES_PATH}"
    if names is not None:
        return voices_by_name(library, names, prefix_name, prefix_text, listing)
    prefix = voices_by_name(library, [], prefix_name, prefix_text, listing)[1]
    if voice == DEFAULT_VOICE and DEFAULT_VOICE not in library:
        return None, prefix
    return (library.named(voice, "voice", listing) if voice else ""), prefix


def _string(body: dict[str, Any], name: str, default: str) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string, got {type(value).__name__}", param=name)
    return value


def voices_list(library: VoiceLibrary) -> dict[str, Any]:
    """``GET /v1/audio/voices``: every voice of the library by name, as ROS's ``~/list_voices`` says them, each also
    under ``id`` (Open WebUI's and Kokoro-FastAPI's key of a voice)."""
    default = library.default_name
    return {"voices": [voices_list_entry(voice, default) for voice in library]}


def voices_list_entry(voice: LibraryVoice, default: str | None) -> dict[str, Any]:
    """One voice as ``GET /v1/audio/voices`` lists it."""
    return {
        "id": voice.name,
        "name": voice.name,
        "kind": voice.kind,
        "duration": voice.seconds,
        "is_default": voice.name == default,
        "has_transcript": voice.transcript is not None,
    }


def served_model(identity: ModelIdentity) -> str:
    """The id a server of these weights serves them as: the model of the family (``MOSS-TTS``,
    ``MOSS-VoiceGenerator``), as a client asks for it."""
    return (identity.model or MOSS_TTS).name


def model_card(model_id: str) -> dict[str, Any]:
    """``GET /v1/models/{id}``: the model served, as OpenAI's API describes a model."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "moss_tts_node"}


def models_list(model_id: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model served, as OpenAI's API lists models."""
    return {"object": "list", "data": [model_card(model_id)]}


def audio_models_list(model_id: str) -> dict[str, Any]:
    """``GET /v1/audio/models``: the one model served, as Open WebUI reads its menu (``{"models": [{"id"}]}``)."""
    return {"models": [{"id": model_id, "name": model_id}]}
