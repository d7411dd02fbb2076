"""Voices uploaded over HTTP: vLLM-Omni's ``POST /v1/audio/voices`` (multipart: the clip ``audio_sample``, its
``name``, its transcript ``ref_text``; ``consent`` is taken and not kept) and ``DELETE /v1/audio/voices/{name}``.

Only where the owner names an upload directory that is one of ``voices.directories`` (so an uploaded voice is a
voice of the library after a restart too), and only from a client that bears the server's API key. A clip is
bounded before it is read: its bytes (``MAX_UPLOAD_BYTES``, the body's bound), then its duration from its header
(``limits.max_reference_seconds``), and at most that much is decoded. The client's bytes are never written: the
decoded samples are, as a 16-bit WAV named after a name checked against ``NAME_PATTERN`` (no path, no dot), which
must be free. Then the clip is encoded as a configured voice is, and the voice is in the library at once.
"""

from __future__ import annotations

import io
import os
import re
import threading
import uuid
from pathlib import Path

import numpy as np
import soundfile as sf

from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.synthesis.voices import TRANSCRIPT_SUFFIX, LibraryVoice
from moss_tts_node.synthesizer import Synthesizer

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # vLLM-Omni's bound of an upload
MAX_UPLOADED = 100  # voices in the upload directory, so that uploads cannot fill the disk
UPLOAD_FIELDS = ("audio_sample", "name", "ref_text", "consent")
_PART_SUFFIX = ".part"  # a clip being written: no voice directory reads it


class VoiceUploads:
    """The voices clients add to and delete from ``synth``'s library, as WAV files in ``directory``."""

    def __init__(self, synth: Synthesizer, directory: Path) -> None:
        self.directory = directory.resolve()
        configured = {Path(d).resolve() for d in synth.config.voices.directories}
        if self.directory not in configured:
            raise ConfigError(
                f"--voice-upload-dir {directory} is not one of voices.directories: list it there, so that an uploaded "
                "voice is a voice of the library after a restart too"
            )
        self._synth = synth
        self._changing = threading.Lock()  # one upload or delete at a time: the name's check and its file

    def add(self, name: str, clip: bytes, transcript: str | None) -> LibraryVoice:
        """Check, decode, write and encode the clip; the voice, already in the library. RequestError says why not."""
        library = self._synth.voices
        _check_name(name)
        limits = self._synth.config.limits
        if transcript is not None and len(transcript) > limits.max_text_chars:
            raise RequestError(
                f"ref_text holds more than the {limits.max_text_chars} characters of 'limits.max_text_chars'"
            )
        samples, rate = _decoded(clip, limits.max_reference_seconds)
        with self._changing:
            library.check_free(name)
            if len(list(self.directory.glob("*.wav"))) >= MAX_UPLOADED:
                raise RequestError(f"the upload directory holds {MAX_UPLOADED} voices, its most: delete one first")
            path = self.directory / f"{name}.wav"
            part = self.directory / f".{uuid.uuid4().hex}{_PART_SUFFIX}"
            try:
                sf.write(part, samples, rate, format="WAV", subtype="PCM_16")
                codes = self._synth.encode_reference(part)
                os.link(part, path)  # fails, rather than replaces, where a file of that name is there
            except FileExistsError:
                raise RequestError(f"{path.name} is in the upload directory already: give another name") from None
            finally:
                part.unlink(missing_ok=True)
            text = transcript.strip() if transcript else None
            if text:  # after the clip is in place: a failed upload leaves no transcript behind
                path.with_suffix(TRANSCRIPT_SUFFIX).write_text(text, encoding="utf-8")
            voice = LibraryVoice(name, codes, path, path, True, text)
            library.add(voice)
            return voice

    def remove(self, name: str) -> None:
        """Take an uploaded voice out of the library and delete its files; RequestError for any other name."""
        with self._changing:
            voice = self._synth.voices.get(name) if NAME_PATTERN.match(name) else None
            if voice is None or voice.resolved.parent != self.directory:
                raise RequestError(f"{name[:40]!r} is not an uploaded voice (GET /v1/audio/voices lists the voices)")
            try:
                self._synth.voices.remove(name)
            except ValueError as error:
                raise RequestError(f"{error}: it cannot be deleted") from None
            voice.resolved.unlink(missing_ok=True)
            voice.resolved.with_suffix(TRANSCRIPT_SUFFIX).unlink(missing_ok=True)


def _check_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise RequestError(
            f"name {name[:40]!r} cannot be a voice's name: give 1 to 64 letters, digits, '_' or '-', beginning with a "
            "letter or digit"
        )


def _decoded(clip: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """The clip's samples (frames, channels) and rate, read by libsndfile (WAV, FLAC, Ogg, MP3); its duration is read
    from its header and refused past ``max_seconds`` before anything is decoded, and no more than that is."""
    try:
        with sf.SoundFile(io.BytesIO(clip)) as file:
            if file.samplerate <= 0 or file.frames <= 0:
                raise RequestError("audio_sample holds no audio")
            seconds = file.frames / file.samplerate
            if seconds > max_seconds:
                raise RequestError(
                    f"audio_sample lasts {seconds:.1f} s, longer than the {max_seconds:g} s of "
                    "limits.max_reference_seconds: use 3 to 20 s of clear speech"
                )
            limit = int(max_seconds * file.samplerate) + 1
            samples = file.read(frames=limit, dtype="float32", always_2d=True)
            rate = file.samplerate
    except (sf.LibsndfileError, RuntimeError, TypeError) as error:
        raise RequestError(f"audio_sample is not audio this server reads (WAV, FLAC, Ogg or MP3): {error}") from None
    if samples.shape[0] >= limit:  # a header that said less than the file holds
        raise RequestError(f"audio_sample holds more than the {max_seconds:g} s of limits.max_reference_seconds")
    return samples, rate
