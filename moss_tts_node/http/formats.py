"""The speech API's audio bodies: WAV and raw PCM (S16LE, mono), which stream, and FLAC, encoded whole.

The samples become S16LE in ``pcm.py``, as everywhere else. A streamed WAV's header comes before its length is
known: its sizes say "as long as the stream", 0xFFFFFFFF, as OpenAI's API sends them; readers take the data to
the end of the body.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf

from moss_tts_node.pcm import float_to_pcm16

_UNKNOWN_SIZE = 0xFFFFFFFF
_HEADER_BYTES = 44


def wav_header(sample_rate: int, samples: int | None = None) -> bytes:
    """The 44-byte header of a mono S16LE WAV of ``samples`` samples (None: not known yet, a stream)."""
    data = _UNKNOWN_SIZE if samples is None else samples * 2
    riff = _UNKNOWN_SIZE if samples is None else data + _HEADER_BYTES - 8
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def whole_body(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """A whole utterance's body in ``response_format`` (one of ``api.FORMATS``)."""
    pcm = float_to_pcm16(samples)
    if response_format == "pcm":
        return pcm
    if response_format == "wav":
        return wav_header(sample_rate, samples.shape[0]) + pcm
    out = io.BytesIO()
    sf.write(out, np.frombuffer(pcm, dtype="<i2"), sample_rate, format="FLAC", subtype="PCM_16")
    return out.getvalue()
