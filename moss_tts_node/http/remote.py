"""The remote backend (``model.backend: remote``): speech from an OpenAI-compatible server instead of the local
model, streamed into the same ``AudioChunk``s, so the node, the CLI and the API speak through it unchanged.

The server is any that serves ``POST /v1/audio/speech`` with raw PCM (S16LE, mono): this package's own
(``serve``), or vLLM-Omni or SGLang-Omni on a GPU server (docs/http.md, "Remote backend", says which fields of
theirs a request maps to). Standard library only (``http.client``), so the ROS install does not grow.

A request is checked here as the local model checks it first (``check_request``), then sent at once, so that the
server's refusal (its error body's message) is a RequestError where a local check's would be, before any audio.
Its voices are the server's, by name (``GET /v1/audio/voices``, read when it loads); a path, codes or a sampling
section cannot be sent and are refused, with the reason. What only the local model knows is said, not faked: no
expected duration before the audio (``max_expected_s`` cannot refuse early: ``max_audio_s`` still stops it), no
prompt, rows or codes, a report with the audio's figures only. A cancel closes the connection (the server stops
the request: ours within one step) between two chunks of the body.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from moss_tts_node.config import Config, check_per_request_change
from moss_tts_node.errors import ConfigError, MossTTSError, RequestError
from moss_tts_node.http.api import (
    CHANNELS_HEADER,
    MODELS_PATH,
    SAMPLE_RATE_HEADER,
    SPEECH_PATH,
    VOICES_PATH,
    ApiError,
    request_body,
)
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE
from moss_tts_node.pcm import pcm16_to_float
from moss_tts_node.synthesis.cancel import CancelFlag, cancel_check
from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.fields import with_request_keywords
from moss_tts_node.synthesis.request import REQUEST_FIELDS, SpeechRequest, check_request, request_of
from moss_tts_node.synthesis.results import AudioChunk, AudioStream, StreamResult, Synthesis
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary
from moss_tts_node.timing import StageClock, StopReason, TimingReport

TIMEOUT_S = 120.0  # to connect, and between two pieces of a body (a GPU server's first audio is far sooner)
_READ_BYTES = 8192  # at most, per read of a streamed body: what has arrived is handed on at once
_ERROR_BYTES = 65536  # of an error body, at most
_NO_CODES = 0  # codebooks of a remote voice here: its codes stay on the server
request_keywords = with_request_keywords(REQUEST_FIELDS)  # as Synthesizer's: the fields, typed, in help()


class RemoteError(MossTTSError):
    """The remote server cannot be reached, or answered what this backend cannot use."""


class RemoteSynthesizer:
    """A ``Synthesizer`` whose model is a remote server's: ``stream``, ``synthesize``, ``voices`` and the figures
    of the node's diagnostics (``name``, ``weight_layout``, ``sampling_rate``, ``channels``) as the local one has
    them."""

    def __init__(self, config: Config) -> None:
        self._config = config
        model = config.model
        parts = urlsplit(model.remote_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._base = parts.path.rstrip("/").removesuffix("/v1")  # the API's paths begin with /v1
        self._key = _api_key(model.remote_api_key_file)
        self.sampling_rate = SAMPLE_RATE
        self.channels = 1  # the PCM this backend reads is the server's mono 24 kHz
        self.name = model.remote_model or self._first_model()
        self.weight_layout = f"remote: {model.remote_url} ({self.name})"
        self.voices = self._voices()

    def close(self) -> None:
        """Nothing held between requests: each has its own connection."""

    @property
    def config(self) -> Config:
        """The settings a request runs with when it gives none; ``reconfigure`` changes them."""
        return self._config

    def reconfigure(self, config: Config) -> None:
        """As ``Synthesizer.reconfigure``: later requests run with ``config``, which changes per-request keys only."""
        check_per_request_change(self._config, config)
        self._config = config

    def __enter__(self) -> RemoteSynthesizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prepare_voice(self, request: SpeechRequest | None = None, **fields: Any) -> int:
        """Nothing to prefill here: the server keeps its own cache; 0 rows."""
        return 0

    @request_keywords
    def stream(
        self,
        request: SpeechRequest | str,
        *,
        cancel: CancelFlag = None,
        streaming: bool = True,
        config: Config | None = None,
        max_audio_s: float | None = None,
        max_expected_s: float | None = None,
        **fields: Any,
    ) -> AudioStream:
        """Check the request, send it, and stream the server's PCM as chunks once its answer has begun (its refusal
        raises here). ``streaming`` False asks for the server's whole decode (``stream`` false)."""
        request = request_of(request, fields)
        config = config if config is not None else self.config
        check_request(request, config.limits)
        if request.sampling is not None:
            raise RequestError("a remote server takes no sampling section: leave it out (the server's own applies)")
        try:
            body = request_body(request, self.name, "pcm", streaming)
        except ApiError as error:  # a voice that is not a name
            raise RequestError(str(error)) from None
        clock = StageClock()
        connection, response = self._post(SPEECH_PATH, body)
        try:
            self._check_format(response)
        except RemoteError:
            connection.close()
            raise
        chunks = self._chunks(connection, response, cancel_check(cancel), clock, max_audio_s, request.seed)
        return AudioStream(None, chunks)

    def stream_text(
        self, fragments: Iterable[str] | TextFeed, request: SpeechRequest | None = None, **fields: Any
    ) -> AudioStream:
        """Not served: the API takes a whole text per request."""
        raise RequestError(
            "text that arrives in fragments needs the local model (the remote speech API takes whole texts): send the "
            "whole text, or set model.backend to local"
        )

    @request_keywords
    def synthesize(
        self,
        request: SpeechRequest | str,
        *,
        cancel: CancelFlag = None,
        config: Config | None = None,
        max_audio_s: float | None = None,
        **fields: Any,
    ) -> Synthesis:
        """The whole utterance, as the server decoded it whole; its codes and prompt stay on the server (empty)."""
        stream = self.stream(request, cancel=cancel, streaming=False, config=config, max_audio_s=max_audio_s, **fields)
        return stream.whole(self.sampling_rate)

    # -- the server --------------------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=TIMEOUT_S)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "*/*"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _post(self, path: str, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """The server's answer to ``body`` once its status is in; RequestError with the server's reason for a 4xx,
        RemoteError for another failure."""
        connection = self._connection()
        try:
            connection.request("POST", self._base + path, json.dumps(body).encode(), self._headers())
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise RemoteError(f"the remote server {self.config.model.remote_url} cannot be reached: {error}") from None
        if response.status != 200:
            try:
                reason = _reason(response)
            except (OSError, http.client.HTTPException) as error:  # the error body broke off, or is no HTTP body
                raise RemoteError(
                    f"the remote server refused the request ({response.status}), and its reason broke off: {error!r}"
                ) from None
            finally:
                connection.close()
            kind = RequestError if 400 <= response.status < 500 else RemoteError
            raise kind(f"the remote server refused the request ({response.status}): {reason}")
        return connection, response

    def _get(self, path: str) -> Any:
        connection = self._connection()
        try:
            connection.request("GET", self._base + path, headers=self._headers())
            response = connection.getresponse()
            if response.status != 200:
                raise RemoteError(f"GET {path}: the remote server answered {response.status}: {_reason(response)}")
            return json.loads(response.read(_ERROR_BYTES * 16))
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise RemoteError(
                f"the remote server {self.config.model.remote_url} cannot be reached at {path}: {error} (model."
                "remote_url is the server's base URL, up to /v1)"
            ) from None
        finally:
            connection.close()

    def _first_model(self) -> str:
        listed = self._get(MODELS_PATH)
        models = [model.get("id") for model in listed.get("data", []) if isinstance(model, dict)]
        if not models or not isinstance(models[0], str):
            raise RemoteError(f"the remote server lists no model at GET {MODELS_PATH}: set model.remote_model")
        return models[0]

    def _voices(self) -> VoiceLibrary:
        """The server's voices by name, as a library whose voices hold no codes (they stay on the server), their
        durations, and a transcript ("" for one the server has: it is put before the text there). None where the
        server lists none (a server without ``GET /v1/audio/voices``)."""
        try:
            listed = self._get(VOICES_PATH).get("voices", [])
        except RemoteError:
            return VoiceLibrary({}, None)
        voices, default = {}, None
        for entry in listed:
            info = entry if isinstance(entry, dict) else {"name": entry}
            name = info.get("name")
            if not isinstance(name, str) or not name:
                continue
            frames = round(float(info.get("duration") or 0.0) * FRAMES_PER_SECOND)
            codes = np.zeros((frames, _NO_CODES), np.int64)
            transcript = "" if info.get("has_transcript") else None
            voices[name] = LibraryVoice(name, codes, Path(name), Path(name), False, transcript)
            if info.get("is_default"):
                default = name
        return VoiceLibrary(voices, default)

    def _check_format(self, response: http.client.HTTPResponse) -> None:
        """Refuse PCM of another rate or channel count than this backend reads (a server of MOSS-TTS-Nano, or one
        set to convert its output), rather than play it at the wrong speed; a server that does not say is taken at
        its word of 24 kHz mono."""
        rate, channels = self.sampling_rate, self.channels
        said = (_said(response, SAMPLE_RATE_HEADER, rate), _said(response, CHANNELS_HEADER, channels))
        if said != (rate, channels):
            raise RemoteError(
                f"the remote server {self.config.model.remote_url} speaks {said[0]} Hz in {said[1]} channel(s), "
                f"and the remote backend reads {self.sampling_rate} Hz mono only: set the server's "
                f"audio.output_sample_rate {self.sampling_rate} and audio.output_channels mono, or run the model here"
            )

    def _chunks(
        self,
        connection: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        cancelled: Callable[[], bool],
        clock: StageClock,
        max_audio_s: float | None,
        seed: int | None,
    ) -> Generator[AudioChunk, None, StreamResult]:
        """The body's PCM as chunks as it arrives (a chunk per read, whole samples), then an empty final chunk."""
        index, samples, stop = 0, 0, StopReason.END
        limit = None if max_audio_s is None else round(max_audio_s * self.sampling_rate)
        rest = b""
        try:
            while True:
                if cancelled():
                    stop = StopReason.CANCELLED
                    break
                try:
                    data = response.read1(_READ_BYTES)
                except (OSError, http.client.HTTPException) as error:
                    raise RemoteError(f"the remote server's audio broke off: {error}") from None
                if not data:
                    break
                data, rest = _whole_samples(rest + data)
                if not data:
                    continue
                piece = pcm16_to_float(data)
                if limit is not None and samples + piece.shape[0] >= limit:
                    piece, stop = piece[: limit - samples], StopReason.MAX_NEW_TOKENS
                clock.mark_first_audio()
                yield AudioChunk(piece, self.sampling_rate, index, samples / self.sampling_rate)
                index, samples = index + 1, samples + piece.shape[0]
                if stop is StopReason.MAX_NEW_TOKENS:
                    break
        finally:
            connection.close()
        if stop is not StopReason.CANCELLED:
            yield AudioChunk(np.empty(0, np.float32), self.sampling_rate, index, samples / self.sampling_rate, stop)
        frames = round(samples / self.sampling_rate * FRAMES_PER_SECOND)
        report = TimingReport.from_clock(
            clock,
            model=self.name,
            weights=self.weight_layout,
            seed=-1 if seed is None else seed,
            prompt_rows=0,
            max_new_tokens=0,
            steps=frames,
            frames=frames,
            audio_seconds=samples / self.sampling_rate,
            codec_decode="remote",
            streamed=False,
            stop_reason=stop,
        )
        empty = np.empty((0, 0), np.int64)
        return StreamResult(empty, empty, report, clock, prompt=empty)


def _said(response: http.client.HTTPResponse, header: str, default: int) -> int:
    """The number a response's ``header`` gives; ``default`` where it gives none (or no number: a server of ours
    always gives one)."""
    value = (response.getheader(header) or "").strip()
    return int(value) if value.isdigit() else default


def _whole_samples(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last whole 2-byte sample, and the byte left over."""
    cut = len(data) - len(data) % 2
    return data[:cut], data[cut:]


def _reason(response: http.client.HTTPResponse) -> str:
    """An error body's message (OpenAI's ``error.message``, or FastAPI's ``detail``), else its text, shortened."""
    text = response.read(_ERROR_BYTES).decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or response.reason
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if "detail" in body:
            return str(body["detail"])[:500]
    return text.strip()[:500]


def _api_key(path: str) -> str | None:
    if not path:
        return None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"'model.remote_api_key_file' {path}: {error.strerror}") from None
    if not key:
        raise ConfigError(f"'model.remote_api_key_file' {path} is empty: put the server's API key in it")
    return key
