"""Signed 16-bit little-endian PCM (S16LE), to and from float samples: the one home of the conversion.

WAV output (``codec/audio_io.py``), the node's ``~/audio`` and audio_common topics, and the player's decoding
of them all go through here. NumPy only, so the playback-only ``moss_tts_player`` imports nothing else.
"""

from __future__ import annotations

import numpy as np

# Full scale: floats are clipped to [-1, 1] and scaled by this, so +1 and -1 are symmetric and never wrap.
PCM16_FULL_SCALE = 32767.0


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Convert float samples, mono ``(n,)`` or ``(n, channels)`` frames, to signed 16-bit little-endian PCM bytes
    (S16LE), channels interleaved as WAV and raw PCM carry them.

    Values are clipped to [-1, 1] and scaled by 32767, so full scale never wraps around.
    """
    samples = np.asarray(samples)
    if samples.ndim not in (1, 2):
        raise ValueError(f"expected samples of shape (n,) or (n, channels), got {samples.shape}")
    scaled = np.round(np.clip(samples.astype(np.float64), -1.0, 1.0) * PCM16_FULL_SCALE)
    return scaled.astype("<i2").tobytes()  # C order: frame by frame, the channels of each in turn


def pcm16_to_float(data: bytes) -> np.ndarray:
    """The float32 samples of S16LE bytes, scaled as ``float_to_pcm16`` scales (so a round trip is within one step)."""
    if len(data) % 2:
        raise ValueError(f"S16LE data holds 2 bytes per sample, got {len(data)} bytes")
    return (np.frombuffer(data, dtype="<i2") / PCM16_FULL_SCALE).astype(np.float32)


def channels_of(samples: np.ndarray) -> int:
    """The channels of float samples: (n,) is one, (n, channels) its columns."""
    return 1 if samples.ndim == 1 else samples.shape[1]
