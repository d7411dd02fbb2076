"""Audio files in and out: reference clips for voice cloning, WAV output (S16LE, by ``pcm.py``).

Reference clips are prepared the way upstream prepares them for the codec at hand, so that a voice cloned
here sounds like the same voice cloned upstream. For MOSS-Audio-Tokenizer (docs/model.md, "Upstream"): mono
(channels averaged), 24 kHz, -20 dBFS RMS with the gain clamped to +-3 dB, zero-padded to whole codec frames.
For MOSS-Audio-Tokenizer-Nano (docs/nano.md, "The codec"): 48 kHz stereo (a mono clip in both channels, more
than two channels refused), its level as it is, whole frames only (the partial last frame dropped, as
upstream's encoder drops it). The resampler is written in NumPy so the package needs neither SciPy nor torch on
a robot (upstream resamples with torchaudio's windowed sinc; both filter out what would alias).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from math import gcd
from pathlib import Path

import numpy as np
import soundfile as sf

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.errors import RequestError
from moss_tts_node.model.rates import SAMPLE_RATE
from moss_tts_node.pcm import float_to_pcm16

TARGET_DBFS = -20.0
MAX_GAIN_DB = 3.0
SILENCE_DBFS = -70.0  # below this RMS a clip holds no usable voice

# Windowed-sinc design: 32 zero crossings each side of the kernel and a Kaiser window
# (beta 9) give > 80 dB of stopband; the pass band ends at 94 % of the lower Nyquist
# so the transition band stays clear of aliasing.
_ZERO_CROSSINGS = 32
_KAISER_BETA = 9.0
_ROLLOFF = 0.94
_CHUNK = 16384  # output samples per gather, bounds the working memory to a few MB


def load_reference_audio(
    path: str | Path, max_seconds: float | None = None, codec: type[AudioCodec] = AudioCodec
) -> np.ndarray:
    """Read a voice reference clip and return it ready for ``codec``'s ``encode``.

    WAV, FLAC and OGG (anything libsndfile reads) are accepted. The result is float32 at the codec's rate and
    in its channels ((n,) mono, (n, channels) else), prepared as the codec's ``reference_*`` attributes say (the
    default, MOSS-Audio-Tokenizer's: mono 24 kHz, RMS-normalized toward -20 dBFS with the gain limited to +-3 dB
    so a quiet room is not pumped up into noise, zero-padded at the end to a multiple of 1920 samples).
    Raises RequestError for a missing, unreadable, empty or silent file, one of channels the codec's cannot be
    made from, one shorter than a frame where partial frames are dropped, and one that holds more than
    ``max_seconds`` (at most that much is decoded, whatever its header says: check ``clip_seconds`` first for a
    refusal that decodes nothing).
    """
    path = Path(path)
    samples, rate = _read_audio(path, max_seconds)
    samples = _to_channels(samples, codec.channels, path)
    samples = np.stack([resample(channel, rate, codec.sample_rate) for channel in samples.T], axis=1)
    samples = _normalize_loudness(samples, path) if codec.reference_loudness else _check_not_silent(samples, path)
    whole = _whole_frames(samples, codec.samples_per_frame, codec.reference_pads_last_frame, path)
    return whole[:, 0].copy() if codec.channels == 1 else whole


def _to_channels(samples: np.ndarray, channels: int, path: Path) -> np.ndarray:
    """(n, c) samples as (n, ``channels``) float32: averaged to mono, a mono clip copied to every channel."""
    have = samples.shape[1]
    if have == channels:
        return samples
    if channels == 1:
        return samples.mean(axis=1, dtype=np.float64, keepdims=True).astype(np.float32)
    if have == 1:
        return np.repeat(samples, channels, axis=1)
    raise RequestError(
        f"reference audio {path} has {have} channels; the codec takes {channels} (or mono): "
        f"mix it down, e.g. ffmpeg -i {path} -ac {channels} voice.wav"
    )


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample 1-D ``samples`` with a Kaiser-windowed sinc polyphase filter.

    Output length is ceil(n * to_rate / from_rate). Works for any pair of integer rates:
    the ratio is reduced to up/down by their gcd, and one filter phase is tabulated per
    distinct fractional position (at most ``up`` of them).
    """
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {from_rate} -> {to_rate}")
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"resample expects 1-D samples, got shape {samples.shape}")
    if from_rate == to_rate or samples.size == 0:
        return samples.copy()
    divisor = gcd(from_rate, to_rate)
    up, down = to_rate // divisor, from_rate // divisor
    phases, half = _sinc_phases(up, down)
    n_out = -(-samples.size * up // down)
    positions = np.arange(n_out, dtype=np.int64) * down  # output n sits at input n * down / up
    starts, phase_of = positions // up, positions % up
    padded = np.concatenate([np.zeros(half, np.float32), samples, np.zeros(half + 1, np.float32)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, phases.shape[1])
    out = np.empty(n_out, dtype=np.float32)
    for begin in range(0, n_out, _CHUNK):
        rows = slice(begin, begin + _CHUNK)
        out[rows] = np.einsum("ij,ij->i", windows[starts[rows]], phases[phase_of[rows]])
    return out


def _sinc_phases(up: int, down: int) -> tuple[np.ndarray, int]:
    """Tabulate the anti-aliasing kernel at the ``up`` fractional offsets it is used at.

    Row p holds the taps for an output lying p/up of an input sample past the tap window's
    centre sample; taps run from +half to -half input samples away. The cutoff is the
    lower of the two Nyquist rates, so downsampling filters out what would alias. Each
    row is normalized to unit sum so DC passes exactly whatever the phase.
    """
    cutoff = min(1.0, up / down) * _ROLLOFF  # in cycles per input sample, times 2
    reach = _ZERO_CROSSINGS / cutoff  # kernel half-width in input samples
    half = int(np.ceil(reach))
    offsets = np.arange(up)[:, None] / up + half - np.arange(2 * half + 1)[None, :]
    inside = np.clip(1.0 - (offsets / reach) ** 2, 0.0, None)
    kernel = cutoff * np.sinc(cutoff * offsets) * np.i0(_KAISER_BETA * np.sqrt(inside)) / np.i0(_KAISER_BETA)
    kernel[np.abs(offsets) > reach] = 0.0
    kernel /= kernel.sum(axis=1, keepdims=True)
    return kernel.astype(np.float32), half


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write float samples, mono ``(n,)`` or ``(n, channels)``, as a 16-bit PCM WAV, clipping to [-1, 1] first."""
    pcm = np.frombuffer(float_to_pcm16(samples), dtype="<i2").reshape(np.shape(samples))
    sf.write(str(path), pcm, sample_rate, subtype="PCM_16", format="WAV")


def clip_seconds(path: str | Path) -> float:
    """How long an audio file lasts, from its header: nothing is decoded. RequestError when it is missing
    or not an audio file libsndfile reads."""
    path = Path(path)
    with _readable(path):
        info = sf.info(str(path))
    return info.frames / info.samplerate if info.samplerate > 0 else 0.0


def _read_audio(path: Path, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Read (frames, channels) float32 samples and the rate, with errors a user can act on; at most
    ``max_seconds`` of them (RequestError when the file holds more)."""
    with _readable(path), sf.SoundFile(str(path)) as file:
        rate = file.samplerate
        limit = -1 if max_seconds is None else int(max_seconds * rate) + 1
        samples = file.read(limit, dtype="float32", always_2d=True)
    if max_seconds is not None and samples.shape[0] > max_seconds * rate:
        raise RequestError(f"reference audio {path} holds more than {max_seconds:g} s of audio")
    if samples.shape[0] == 0:
        raise RequestError(f"reference audio {path} is empty; record 3 to 20 s of clear speech")
    return samples, int(rate)


def is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False, not an error, for a name the file system cannot take (too long)."""
    try:
        return path.is_file()
    except OSError:
        return False


@contextmanager
def _readable(path: Path) -> Iterator[None]:
    """Turn libsndfile's failures to open or read ``path`` into a RequestError a user can act on."""
    if not is_file(path):
        raise RequestError(f"reference audio {path} not found; give the path of a WAV, FLAC or OGG file")
    try:
        yield
    except (sf.LibsndfileError, RuntimeError) as error:
        raise RequestError(
            f"reference audio {path} is not a readable audio file ({error}); convert it to WAV, "
            f"e.g. ffmpeg -i {path} -ac 1 -ar {SAMPLE_RATE} voice.wav"
        ) from error


def _check_not_silent(samples: np.ndarray, path: Path) -> np.ndarray:
    """``samples`` unchanged; RequestError when their RMS is below SILENCE_DBFS (no usable voice)."""
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    level_db = 20.0 * np.log10(rms) if rms > 0 else -np.inf
    if level_db < SILENCE_DBFS:
        raise RequestError(
            f"reference audio {path} is silent (RMS {level_db:.1f} dBFS); record clear speech "
            "or raise the microphone gain"
        )
    return samples


def _normalize_loudness(samples: np.ndarray, path: Path) -> np.ndarray:
    """Scale toward -20 dBFS RMS, the gain limited to +-3 dB; reject silent clips."""
    rms = float(np.sqrt(np.mean(np.square(_check_not_silent(samples, path), dtype=np.float64))))
    gain_db = float(np.clip(TARGET_DBFS - 20.0 * np.log10(rms), -MAX_GAIN_DB, MAX_GAIN_DB))
    return (samples * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)


def _whole_frames(samples: np.ndarray, samples_per_frame: int, pad: bool, path: Path) -> np.ndarray:
    """(n, c) samples cut to whole codec frames: the end zero-padded (``pad``) or the partial frame dropped."""
    if pad:
        missing = -samples.shape[0] % samples_per_frame
        return np.concatenate([samples, np.zeros((missing, samples.shape[1]), dtype=np.float32)])
    whole = samples.shape[0] - samples.shape[0] % samples_per_frame
    if whole == 0:
        raise RequestError(f"reference audio {path} is shorter than one codec frame; record 3 to 20 s of clear speech")
    return np.ascontiguousarray(samples[:whole])
