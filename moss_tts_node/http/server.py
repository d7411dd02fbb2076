"""The HTTP server: OpenAI's ``POST /v1/audio/speech`` over the core, on Starlette and uvicorn (docs/http.md).

    python -m moss_tts_node serve --config config/default.yaml      # http://127.0.0.1:8000/v1/audio/speech

A thin ASGI layer over ``SpeechService``: it checks the API key, reads a body no longer than ``max_body_bytes``,
checks its fields (``http/api.py``), awaits the intake's verdict, then sends the audio in its format as each chunk
is decoded and encoded (``http/formats.py``; OpenAI's Server-Sent Events where asked), or whole (``stream`` false).
It lists the model and the voices in the shapes OpenAI's API, Open WebUI and Kokoro-FastAPI read, and takes the
voices clients upload where the owner allows it (``http/uploads.py``). Every refusal is OpenAI's error body with
its status. It listens on loopback unless told otherwise, and elsewhere only with an API key.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import logging
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from moss_tts_node.errors import ConfigError, MossTTSError
from moss_tts_node.http.api import (
    AUDIO_MODELS_PATH,
    CHANNELS_HEADER,
    DEFAULT_FORMAT,
    HEALTH_PATH,
    MEDIA_TYPES,
    MODELS_PATH,
    SAMPLE_RATE_HEADER,
    SPEECH_PATH,
    SSE_MEDIA_TYPE,
    VOICES_PATH,
    ApiError,
    Order,
    audio_models_list,
    max_body_bytes,
    model_card,
    models_list,
    parsed_body,
    speech_order,
    voices_list,
    voices_list_entry,
)
from moss_tts_node.http.formats import Encoder, whole_body
from moss_tts_node.http.service import CLIENT_GONE, Audio, SpeechService
from moss_tts_node.http.uploads import MAX_UPLOAD_BYTES, UPLOAD_FIELDS, VoiceUploads
from moss_tts_node.pcm import channels_of
from moss_tts_node.serving.queue import SYNTHESIS_FAILED, Outcome, Refused
from moss_tts_node.synthesis.results import AudioChunk
from moss_tts_node.timing import TimingReport

log = logging.getLogger("moss_tts_node.http")
LISTENING_LINE = "listening on"  # what the server logs once it takes requests
_FORM_OVERHEAD = 65536  # bytes of an upload's body besides its clip: the parts' headers, the name, the transcript


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``), reachable from this machine alone."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None) -> None:
    """ConfigError unless the server listens on loopback or takes an API key: anyone who reaches the port could
    make the robot speak."""
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"listening on {host} lets anyone who reaches it make the robot speak: give an API key (--api-key-file, or "
            "the MOSS_TTS_API_KEY variable), or listen on 127.0.0.1"
        )


@dataclass(frozen=True)
class Settings:
    """What the owner chose of the server's behaviour (``serve``'s options)."""

    model_id: str
    api_key: str | None = None
    default_format: str = DEFAULT_FORMAT  # where a request names none (OpenAI answers mp3)
    public_lists: bool = False  # the model and voice lists, without the key
    uploads: VoiceUploads | None = None  # clients with the key may add and delete voices


def build_app(service: SpeechService, settings: Settings) -> Starlette:
    """The ASGI app of ``service``; with an API key, every request but a public one must bear it."""
    limit = max_body_bytes(service.synth.config.limits)
    model_id = settings.model_id

    async def speech(request: Request) -> Response:
        body = parsed_body(await _bounded_body(request, limit))
        order = speech_order(body, model_id, service.synth.voices, settings.default_format)
        return await _speak(service, order)

    async def models(request: Request) -> Response:
        return JSONResponse(models_list(model_id))

    async def model(request: Request) -> Response:
        if request.path_params["model"] != model_id:
            raise ApiError(
                404, f"the model is not served here: this server serves {model_id!r}", code="model_not_found"
            )
        return JSONResponse(model_card(model_id))

    async def audio_models(request: Request) -> Response:
        return JSONResponse(audio_models_list(model_id))

    async def voices(request: Request) -> Response:
        return JSONResponse(voices_list(service.synth.voices))

    async def upload(request: Request) -> Response:
        uploads = _uploads(settings)
        form = await _form(request)
        clip, name = form.get("audio_sample"), form.get("name")
        transcript = form.get("ref_text")
        if not isinstance(clip, UploadFile) or not isinstance(name, str):
            raise ApiError(400, "give the clip in 'audio_sample' (a file) and its 'name' (a field)")
        if transcript is not None and not isinstance(transcript, str):
            raise ApiError(400, "ref_text must be a field, the clip's transcript", param="ref_text")
        data = await clip.read()
        voice = await asyncio.wrap_future(service.run_checked(lambda: uploads.add(name, data, transcript)))
        log.info(f"voice {voice.name!r} uploaded ({voice.seconds:.1f} s)")
        listed = voices_list_entry(voice, service.synth.voices.default_name)
        return JSONResponse({"success": True, "voice": listed}, 201)

    async def delete(request: Request) -> Response:
        uploads = _uploads(settings)
        name = request.path_params["name"]
        await asyncio.wrap_future(service.run_checked(lambda: uploads.remove(name)))
        log.info(f"voice {name!r} deleted")
        return JSONResponse({"success": True, "name": name})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def guarded(
        endpoint: Callable[[Request], Awaitable[Response]], public: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            try:
                if settings.api_key is not None and not public:
                    _check_key(request, settings.api_key)
                return await endpoint(request)
            except ApiError as error:
                refused = error
            except Refused as refusal:
                refused = ApiError(429, str(refusal), "rate_limit_error", code="busy")
            except MossTTSError as error:  # a bad request: RequestError and its kind
                refused = ApiError(400, str(error))
            except Exception as error:  # a bug here must not take the server down: the client learns it failed
                log.exception("request failed")
                refused = ApiError(500, f"the server failed: {type(error).__name__}", "server_error")
            log.warning(f"{request.method} {request.url.path} refused ({refused.status}): {refused}")
            return _error(refused)

        return checked

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind))

    public = settings.public_lists
    return Starlette(
        routes=[
            Route(SPEECH_PATH, guarded(speech), methods=["POST"]),
            Route(MODELS_PATH, guarded(models, public), methods=["GET"]),
            Route(MODELS_PATH + "/{model}", guarded(model, public), methods=["GET"]),
            Route(AUDIO_MODELS_PATH, guarded(audio_models, public), methods=["GET"]),
            Route(VOICES_PATH, guarded(voices, public), methods=["GET"]),
            Route(VOICES_PATH, guarded(upload), methods=["POST"]),
            Route(VOICES_PATH + "/{name}", guarded(delete), methods=["DELETE"]),
            Route(HEALTH_PATH, health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )


def _uploads(settings: Settings) -> VoiceUploads:
    """The uploads, where the owner allows them: a directory named, and a key to bear (checked before this)."""
    if settings.uploads is None or settings.api_key is None:
        raise ApiError(
            403,
            "this server takes no uploaded voices: its owner allows them with --voice-upload-dir and an API key",
            "permission_error",
        )
    return settings.uploads


async def _form(request: Request) -> FormData:
    """A multipart body of one file and the upload's fields, bounded before it is read whole (413 past that)."""
    data = await _bounded_body(request, MAX_UPLOAD_BYTES + _FORM_OVERHEAD)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "an upload is multipart/form-data: the clip in 'audio_sample', its 'name'")

    async def chunks() -> AsyncIterator[bytes]:
        yield data

    parser = MultiPartParser(request.headers, chunks(), max_files=1, max_fields=len(UPLOAD_FIELDS))
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise ApiError(400, f"the upload is not a form this server reads: {error.message}") from None
    unknown = sorted(set(form.keys()) - set(UPLOAD_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0][:40]!r}: an upload takes {', '.join(UPLOAD_FIELDS)}")
    return form


def serve(service: SpeechService, settings: Settings, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, which first ends the requests in line (the one spoken within one step), so
    that their responses end and the server stops at once."""
    check_exposure(host, settings.api_key)
    app = build_app(service, settings)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5), service)
    server.run()


class _Server(uvicorn.Server):
    """uvicorn's server, which on a signal to stop first closes the line (off the event loop: closing waits for the
    worker's step)."""

    def __init__(self, config: uvicorn.Config, service: SpeechService) -> None:
        super().__init__(config)
        self._service = service

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.config.host, self.config.port
            log.info(f"{LISTENING_LINE} http://{host}:{port}{SPEECH_PATH}")

    def handle_exit(self, sig: int, frame: Any) -> None:
        """As uvicorn's, but a signal to stop is how this server ends: it exits 0, without the signal raised again
        once it has stopped (uvicorn's own does that, for a host program's handler)."""
        threading.Thread(target=self._service.close, name="close-line", daemon=True).start()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C
        else:
            self.should_exit = True


def _check_key(request: Request, api_key: str) -> None:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "no valid API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) once it passes ``limit`` bytes, before it is read whole."""
    too_long = ApiError(413, f"the body is longer than the {limit} bytes a request of {request.url.path} may take")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_long
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            raise too_long
    return bytes(data)


async def _speak(service: SpeechService, order: Order) -> Response:
    """Check the order on the intake, wait for its first audio (so a request that fails before any sound gets an
    error status), then answer with its audio in its format, encoded as it comes, or whole."""
    audio = Audio(asyncio.get_running_loop())
    try:
        ticket = await asyncio.wrap_future(service.submit(order, audio))
    except Refused as refusal:
        raise ApiError(429, str(refusal), "rate_limit_error", code="busy") from None
    done = False
    try:
        first = await audio.get()
        if isinstance(first, Outcome):  # ended before any audio: a stream that ends well ends with a chunk
            done = True
            raise _failed(first)
        assert isinstance(first, AudioChunk)
        channels = channels_of(first.samples)
        headers = {SAMPLE_RATE_HEADER: str(first.sample_rate), CHANNELS_HEADER: str(channels)}
        media = SSE_MEDIA_TYPE if order.sse else MEDIA_TYPES[order.response_format]
        if not order.stream:
            samples = await _whole(first, audio)
            done = True
            body = await asyncio.to_thread(whole_body, samples, first.sample_rate, order.response_format, order.speed)
            return Response(body, 200, headers, media)
    except BaseException:
        if not done:
            service.cancel(ticket, CLIENT_GONE)
        raise
    encoder = Encoder(order.response_format, first.sample_rate, channels, order.speed)
    pieces = _sse_events(_encoded(first, audio, encoder)) if order.sse else _encoded(first, audio, encoder)

    async def body() -> AsyncIterator[bytes]:
        finished = False
        try:
            async for piece in pieces:
                if isinstance(piece, Outcome):
                    finished = True
                    if not piece.success:  # after the status went out: the body ends short, and the log says why
                        log.warning(f"speech ended early: {piece.message}")
                elif isinstance(piece, bytes) and piece:  # not the report, which only the events tell
                    yield piece
        finally:
            if not finished:
                service.cancel(ticket, CLIENT_GONE)

    return StreamingResponse(body(), 200, headers, media)


async def _encoded(first: AudioChunk, audio: Audio, encoder: Encoder) -> AsyncIterator[bytes | TimingReport | Outcome]:
    """A streamed response's bytes as each chunk is encoded (off the event loop), the stream's report, then its
    outcome; the encoder's last bytes only when it ended well."""
    item: Any = first
    while not isinstance(item, Outcome):
        if isinstance(item, AudioChunk):
            yield await asyncio.to_thread(encoder.encode, item.samples)
        else:
            yield item
        item = await audio.get()
    if item.success:
        yield await asyncio.to_thread(encoder.close)
    yield item


async def _sse_events(pieces: AsyncIterator[bytes | TimingReport | Outcome]) -> AsyncIterator[bytes | Outcome]:
    """OpenAI's stream_format "sse": each piece of audio a speech.audio.delta event (base64), then speech.audio.done
    with the usage (the prompt's rows in, the generation's steps out), or an error event."""
    report = None
    async for piece in pieces:
        if isinstance(piece, TimingReport):
            report = piece
        elif isinstance(piece, Outcome):
            if piece.success and report is not None:
                rows, steps = report.prompt_rows, report.steps
                usage = {"input_tokens": rows, "output_tokens": steps, "total_tokens": rows + steps}
                yield _sse({"type": "speech.audio.done", "usage": usage})
            elif not piece.success:
                yield _sse({"type": "error", "error": _failed(piece).body["error"]})
            yield piece
        elif piece:
            yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode("ascii")})


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


async def _whole(first: AudioChunk, audio: Audio) -> np.ndarray:
    """Every sample of a whole response, up to its outcome; ApiError when it did not end well."""
    pieces = []
    item: Any = first
    while not isinstance(item, Outcome):
        if isinstance(item, AudioChunk):
            pieces.append(item.samples)
        item = await audio.get()
    if not item.success:
        raise _failed(item)
    return np.concatenate(pieces)


def _failed(outcome: Outcome) -> ApiError:
    """A request that ended before its audio did: 500 when its synthesis failed, 503 when the server ended it."""
    status = 500 if outcome.message.startswith(SYNTHESIS_FAILED) else 503
    return ApiError(status, outcome.message, "server_error")


def _error(error: ApiError) -> Response:
    return JSONResponse(error.body, error.status)
