"""MOSS-Audio-Tokenizer-Nano on ONNX Runtime against upstream's PyTorch code (test/data/nano-codec-tiny)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import REPO_ROOT, linked_copy

from moss_tts_node.codec.audio_io import load_reference_audio
from moss_tts_node.codec.factory import CodecParams, open_codec
from moss_tts_node.codec.layout import NANO_META_FILE
from moss_tts_node.codec.nano import NanoOnnxCodec, NanoStreamDecoder
from moss_tts_node.codec.streaming import SegmentDecoder, StatefulStreamDecoding
from moss_tts_node.errors import CodecError, RequestError, WeightsError

FIXTURE = REPO_ROOT / "test" / "data" / "nano-codec-tiny"
REFERENCE = np.load(FIXTURE / "reference.npz")
# ONNX Runtime's decode differs from PyTorch's by at most 3.5e-7 of the peak (measured 2026-12-06, CPU, whole,
# streamed and step against whole alike); the bound leaves room for another CPU's kernels. Codes are equal.
TOLERANCE = 1e-5 * float(np.abs(REFERENCE["decoded"]).max())


@pytest.fixture(scope="module")
def codec() -> NanoOnnxCodec:
    return NanoOnnxCodec(FIXTURE, provider="cpu", threads=1)


def params(directory: Path, backend: str = "onnx", n_quantizers: int = 16) -> CodecParams:
    return CodecParams(backend, directory, None, "cpu", 1, 750, n_quantizers, NanoOnnxCodec.sample_rate)


def test_encode_gives_pytorchs_codes(codec: NanoOnnxCodec) -> None:
    codes = codec.encode(REFERENCE["waveform"])
    assert codes.dtype == np.int64
    np.testing.assert_array_equal(codes, REFERENCE["codes"])


def test_decode_gives_pytorchs_audio(codec: NanoOnnxCodec) -> None:
    audio = codec.decode(REFERENCE["decode_codes"])
    assert audio.dtype == np.float32 and audio.shape == (8 * 3840, 2) and audio.flags.c_contiguous
    np.testing.assert_allclose(audio, REFERENCE["decoded"], rtol=0, atol=TOLERANCE)
    assert np.abs(audio[:, 0] - audio[:, 1]).max() > 100 * TOLERANCE  # the two channels are two signals


def test_stream_gives_pytorchs_stream_and_the_whole_decode(codec: NanoOnnxCodec) -> None:
    """Through StatefulStreamDecoding, in PyTorch's chunks; again after a reset; and frame by frame."""
    decoding = StatefulStreamDecoding(codec.stream_decoder())
    frames = list(REFERENCE["decode_codes"])
    whole = codec.decode(REFERENCE["decode_codes"])
    for _ in range(2):
        pieces, start = [], 0
        for size in REFERENCE["stream_chunks"]:
            pieces.append(decoding.decode(frames[: start + size], start))
            start += size
        streamed = np.concatenate(pieces)
        np.testing.assert_allclose(streamed, REFERENCE["streamed"], rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(streamed, whole, rtol=0, atol=TOLERANCE)
        decoding.reset()
    segment = SegmentDecoder(decoding, chunk_frames=1)
    pieces = [segment.push(frame) for frame in frames]
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=0, atol=TOLERANCE)


def test_stream_decoder_state(codec: NanoOnnxCodec) -> None:
    decoder = codec.stream_decoder()
    assert isinstance(decoder, NanoStreamDecoder) and decoder.max_frames is None
    meta = json.loads((FIXTURE / NANO_META_FILE).read_text(encoding="utf-8"))["streaming_decode"]
    caches = meta["attention_caches"]
    # 4 bytes a value: the offsets, and per attention layer its offset, keys, values and positions.
    values = len(meta["transformer_offsets"]) + sum(
        1 + 2 * int(np.prod(c["cache_shape"])) + int(np.prod(c["positions_shape"])) for c in caches
    )
    assert decoder.state_bytes == 4 * values
    first = decoder.decode(REFERENCE["decode_codes"][:3])
    assert decoder.frames_done == 3
    decoder.reset()
    assert decoder.frames_done == 0
    np.testing.assert_array_equal(decoder.decode(REFERENCE["decode_codes"][:3]), first)


def test_long_audio_is_decoded_in_windows(codec: NanoOnnxCodec) -> None:
    """A limit of fewer frames than the codes: windows of stereo samples, stitched in order."""
    windowed = NanoOnnxCodec(FIXTURE, provider="cpu", threads=1, max_frames=6, encoder=False)
    codes = np.concatenate([REFERENCE["decode_codes"]] * 2)
    audio = windowed.decode(codes)
    assert audio.shape == (16 * 3840, 2)
    # The first window is decoded whole: exactly the unlimited decode of its frames.
    np.testing.assert_array_equal(audio[: 6 * 3840], codec.decode(codes[:6]))


def test_factory_opens_the_codec_the_directory_holds(tmp_path: Path) -> None:
    with open_codec(params(FIXTURE)) as codec:
        assert isinstance(codec, NanoOnnxCodec)
        assert codec.channels == 2 and codec.sample_rate == 48000 and codec.samples_per_frame == 3840
    with open_codec(params(FIXTURE), encoder=False) as codec, pytest.raises(CodecError, match="without its encoder"):
        codec.encode(REFERENCE["waveform"])
    with pytest.raises(WeightsError, match=r"neither decoder\.onnx.*codec_browser_onnx_meta\.json"):
        open_codec(params(tmp_path))
    with pytest.raises(CodecError, match="onnx backend only"):
        open_codec(params(FIXTURE, backend="tensorrt"))
    with pytest.raises(CodecError, match="16 codebooks; the model has 32"):
        open_codec(params(FIXTURE, n_quantizers=32))


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        (np.zeros(3840, np.float32), r"2-channel samples of shape \(n, 2\), got \(3840,\)"),
        (np.zeros((3840, 3), np.float32), r"shape \(n, 2\), got \(3840, 3\)"),
        (np.zeros((2, 3840), np.float32), r"got \(2, 3840\)"),
        (np.zeros((3840, 2), np.int16), "float samples"),
        (np.zeros((3000, 2), np.float32), "multiple of 3840 samples, got 3000"),
        (np.full((3840, 2), np.nan, np.float32), "NaN"),
    ],
)
def test_bad_audio_is_refused(codec: NanoOnnxCodec, samples: np.ndarray, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        codec.encode(samples)


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (np.zeros((2, 32), np.int64), r"shape \(frames, 16\), got \(2, 32\)"),
        (np.zeros((0, 16), np.int64), "at least one frame"),
        (np.zeros((2, 16), np.float32), "integer codes"),
        (np.full((2, 16), 1024, np.int64), r"\[0, 1023\]"),
    ],
)
def test_bad_codes_are_refused(codec: NanoOnnxCodec, codes: np.ndarray, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        codec.decode(codes)
    with pytest.raises(CodecError, match=message):
        codec.stream_decoder().decode(codes)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"codec_browser_onnx_meta\.json not found.*Nano-ONNX"):
        NanoOnnxCodec(tmp_path)
    broken = linked_copy(FIXTURE, tmp_path / "broken", skip=["moss_audio_tokenizer_decode_step.onnx"])
    with pytest.raises(WeightsError, match=r"decode_step graph .*moss_audio_tokenizer_decode_step\.onnx"):
        NanoOnnxCodec(broken)


def _with_meta(tmp_path: Path, change: dict[str, object]) -> Path:
    directory = linked_copy(FIXTURE, tmp_path / "copy", skip=[NANO_META_FILE])
    meta = json.loads((FIXTURE / NANO_META_FILE).read_text(encoding="utf-8"))
    for dotted, value in change.items():
        *parents, key = dotted.split(".")
        target = meta
        for parent in parents:
            target = target[parent]
        target[key] = value
    (directory / NANO_META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return directory


def test_a_graph_of_the_wrong_io_is_refused(tmp_path: Path) -> None:
    swapped = _with_meta(tmp_path, {"files.decode_full": "moss_audio_tokenizer_encode.onnx"})
    with pytest.raises(CodecError, match=r"encode\.onnx: graph inputs missing \['audio_code_lengths', 'audio_codes'\]"):
        NanoOnnxCodec(swapped)
    # A state the meta declares at another size than the graph's input.
    caches = json.loads((FIXTURE / NANO_META_FILE).read_text(encoding="utf-8"))["streaming_decode"]["attention_caches"]
    caches[0]["cache_shape"] = [1, 2, 99, 8]
    resized = _with_meta(tmp_path / "b", {"streaming_decode.attention_caches": caches})
    with pytest.raises(CodecError, match=r"attn_cached_keys_0' has size 16 on axis 2, expected 99"):
        NanoOnnxCodec(resized).stream_decoder()
    mono = _with_meta(tmp_path / "c", {"codec_config.channels": 1})
    with pytest.raises(CodecError, match="'channels': 1"):
        NanoOnnxCodec(mono)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / NANO_META_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(CodecError, match="not a readable codec meta file"):
        NanoOnnxCodec(tmp_path / "d")


def test_a_wrong_graph_under_the_published_name_is_refused(tmp_path: Path) -> None:
    """Another graph saved as decode_full's file: refused by its I/O at load, not run."""
    directory = linked_copy(FIXTURE, tmp_path / "copy")
    target = directory / "moss_audio_tokenizer_decode_full.onnx"
    target.unlink()
    shutil.copy(FIXTURE / "moss_audio_tokenizer_encode.onnx", target)
    with pytest.raises(CodecError, match=r"graph inputs missing"):
        NanoOnnxCodec(directory)


# --- reference clips for the Nano codec ------------------------------------------------


def test_a_mono_clip_becomes_stereo_at_48k(tmp_path: Path) -> None:
    t = np.arange(24000) / 24000
    clip = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    sf.write(tmp_path / "mono.wav", clip, 24000, subtype="FLOAT")
    samples = load_reference_audio(tmp_path / "mono.wav", codec=NanoOnnxCodec)
    assert samples.dtype == np.float32 and samples.shape == (12 * 3840, 2)  # 48000 samples, whole frames kept
    np.testing.assert_array_equal(samples[:, 0], samples[:, 1])
    # Not normalized (upstream's runtime encodes the clip's own level): the 0.2 sine's RMS, 0.141, stays.
    assert np.sqrt(np.mean(samples[1000:-1000, 0] ** 2)) == pytest.approx(0.2 / np.sqrt(2), rel=0.01)


def test_a_stereo_clip_keeps_its_channels_and_drops_a_partial_frame(tmp_path: Path) -> None:
    stereo = REFERENCE["waveform"]
    sf.write(tmp_path / "stereo.wav", stereo[:-100], 48000, subtype="FLOAT")
    samples = load_reference_audio(tmp_path / "stereo.wav", codec=NanoOnnxCodec)
    np.testing.assert_array_equal(samples, stereo[: 3 * 3840])  # as upstream's encoder: whole frames only
    mono = load_reference_audio(tmp_path / "stereo.wav")  # the default codec's: channels averaged, 24 kHz
    assert mono.ndim == 1 and mono.size % 1920 == 0


def test_clips_the_nano_codec_cannot_take_are_refused(tmp_path: Path) -> None:
    sf.write(tmp_path / "three.wav", np.full((48000, 3), 0.1, np.float32), 48000, subtype="FLOAT")
    with pytest.raises(RequestError, match="3 channels; the codec takes 2"):
        load_reference_audio(tmp_path / "three.wav", codec=NanoOnnxCodec)
    sf.write(tmp_path / "short.wav", np.full((3000, 2), 0.1, np.float32), 48000, subtype="FLOAT")
    with pytest.raises(RequestError, match="shorter than one codec frame"):
        load_reference_audio(tmp_path / "short.wav", codec=NanoOnnxCodec)
    sf.write(tmp_path / "silent.wav", np.zeros((48000, 2), np.float32), 48000, subtype="FLOAT")
    with pytest.raises(RequestError, match="silent"):
        load_reference_audio(tmp_path / "silent.wav", codec=NanoOnnxCodec)
