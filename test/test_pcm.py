"""pcm.py: S16LE to and from float samples, against bytes written out by hand."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from moss_tts_node.pcm import float_to_pcm16, pcm16_to_float


def test_float_to_pcm16_is_little_endian_s16_clipped_not_wrapped() -> None:
    raw = float_to_pcm16(np.array([0.0, 0.5, -1.0, 2.0, -2.0, 1 / 32767], np.float32))
    assert raw == struct.pack("<6h", 0, 16384, -32767, 32767, -32767, 1)


def test_pcm16_to_float_reads_little_endian_at_the_same_scale() -> None:
    samples = pcm16_to_float(struct.pack("<4h", 0, 32767, -32767, -32768))
    assert samples.dtype == np.float32
    np.testing.assert_array_equal(samples, np.array([0.0, 1.0, -1.0, -32768 / 32767], np.float32))


def test_a_round_trip_is_within_half_a_step() -> None:
    samples = np.random.default_rng(0).uniform(-1.0, 1.0, 4801).astype(np.float32)
    back = pcm16_to_float(float_to_pcm16(samples))
    assert np.max(np.abs(back - samples)) <= 0.5 / 32767 + 1e-7


def test_frames_of_channels_are_interleaved() -> None:
    stereo = np.array([[0.5, -0.5], [1.0, 0.0]], np.float32)
    np.testing.assert_array_equal(np.frombuffer(float_to_pcm16(stereo), "<i2"), [16384, -16384, 32767, 0])


def test_malformed_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected samples of shape \(n,\) or \(n, channels\), got \(4, 2, 1\)"):
        float_to_pcm16(np.zeros((4, 2, 1), np.float32))
    with pytest.raises(ValueError, match="2 bytes per sample, got 3 bytes"):
        pcm16_to_float(b"\x00\x01\x02")
