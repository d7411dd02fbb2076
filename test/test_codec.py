"""Codec interface, ONNX Runtime backend, demo codec and audio file helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import soundfile as sf
from conftest import REPO_ROOT, REQUIRE_CODEC_TINY_VARIABLE, SHARED_DIR_VARIABLE, codec_tiny_or_skip
from onnx import TensorProto, helper

from moss_tts_node.codec.audio_io import load_reference_audio, resample, write_wav
from moss_tts_node.codec.base import ONNX_SOURCE, PUBLISHED_ATTENTION_SPAN_FRAMES, read_attention_span
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.errors import CodecError, RequestError, WeightsError
from moss_tts_node.model.rates import SAMPLE_RATE as RATE
from moss_tts_node.model.rates import SAMPLES_PER_FRAME as FRAME
from moss_tts_node.tools.dev.demo_codec import write_demo_codec


@pytest.fixture(scope="module", params=["demo", "codec-tiny"])
def codec(request: pytest.FixtureRequest, demo_codec: tuple[Path, Path]) -> OnnxCodec:
    """The demo codec (3-frame receptive field) and codec-tiny (the real architecture's graph patterns)."""
    if request.param == "demo":
        encoder, decoder = demo_codec
    else:
        tiny = request.getfixturevalue("codec_tiny_dir")
        encoder, decoder = tiny / "encoder.onnx", tiny / "decoder.onnx"
    return OnnxCodec(decoder, encoder, provider="cpu", threads=1)


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 1024, size=(6, 32), dtype=np.int64)


def noise(n_frames: int, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(n_frames * FRAME)).astype(np.float32)


def sine(freq: float, rate: int, seconds: float, amplitude: float) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def rms_db(samples: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))))


# --- demo codec files and the ONNX backend ---------------------------------------------


def test_demo_files_are_small_and_reproducible(demo_codec: tuple[Path, Path], tmp_path: Path) -> None:
    again = write_demo_codec(tmp_path)
    for first, second in zip(demo_codec, again, strict=True):
        assert first.stat().st_size < 2_000_000
        assert first.read_bytes() == second.read_bytes()


def test_encode_shape_dtype_and_range(codec: OnnxCodec) -> None:
    codes = codec.encode(noise(5))
    assert codes.shape == (5, 32)
    assert codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() <= 1023
    assert len(np.unique(codes)) > 32  # more than one frame's worth: the frames differ


def test_encoder_is_deterministic_and_depends_on_audio(codec: OnnxCodec) -> None:
    np.testing.assert_array_equal(codec.encode(noise(3)), codec.encode(noise(3)))
    assert not np.array_equal(codec.encode(noise(3)), codec.encode(noise(3, seed=1)))


def test_decode_gives_one_frame_of_samples_per_code_frame(codec: OnnxCodec, codes: np.ndarray) -> None:
    for n_frames in (1, 6):
        audio = codec.decode(codes[:n_frames])
        assert audio.shape == (n_frames * FRAME,)
        assert audio.dtype == np.float32
        assert np.abs(audio).max() <= 1.0


def test_decode_accepts_any_integer_dtype(codec: OnnxCodec, codes: np.ndarray) -> None:
    np.testing.assert_array_equal(codec.decode(codes.astype(np.int32)), codec.decode(codes))


def test_decoder_is_causal_prefix(codec: OnnxCodec, codes: np.ndarray) -> None:
    full = codec.decode(codes)
    for t in range(1, len(codes)):
        np.testing.assert_allclose(codec.decode(codes[:t]), full[: t * FRAME], atol=1e-5)


def test_decoder_is_causal_future_change(codec: OnnxCodec, codes: np.ndarray) -> None:
    t = 2
    changed = codes.copy()
    changed[t + 1] = (changed[t + 1] + 512) % 1024
    before, after = codec.decode(codes), codec.decode(changed)
    np.testing.assert_allclose(after[: (t + 1) * FRAME], before[: (t + 1) * FRAME], atol=1e-5)
    assert not np.allclose(after[(t + 1) * FRAME : (t + 2) * FRAME], before[(t + 1) * FRAME : (t + 2) * FRAME])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.full((2, 32), 1024), r"\[0, 1023\].*1024"),
        (np.full((2, 32), -1), r"\[0, 1023\]"),
        (np.zeros((32,), np.int64), r"shape \(frames, 32\)"),
        (np.zeros((2, 31), np.int64), r"shape \(frames, 32\)"),
        (np.zeros((0, 32), np.int64), "at least one frame"),
        (np.zeros((2, 32), np.float32), "integer codes"),
    ],
)
def test_decode_rejects_bad_codes(codec: OnnxCodec, bad: np.ndarray, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        codec.decode(bad)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros(FRAME + 1, np.float32), "multiple of 1920"),
        (np.zeros(0, np.float32), "multiple of 1920"),
        (np.zeros((2, FRAME), np.float32), "mono"),
        (np.zeros(FRAME, np.int16), "float samples"),
        (np.full(FRAME, np.nan, np.float32), "NaN"),
    ],
)
def test_encode_rejects_bad_audio(codec: OnnxCodec, bad: np.ndarray, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        codec.encode(bad)


def test_without_encoder_decode_works_and_encode_says_why(demo_codec: tuple[Path, Path]) -> None:
    codec = OnnxCodec(demo_codec[1], provider="cpu")
    assert codec.decode(np.zeros((1, 32), np.int64)).shape == (FRAME,)
    with pytest.raises(CodecError, match=r"no encoder.*encoder_path"):
        codec.encode(noise(1))


def test_encoder_loads_lazily(demo_codec: tuple[Path, Path], tmp_path: Path) -> None:
    broken = tmp_path / "encoder.onnx"
    broken.write_bytes(b"not a model")
    codec = OnnxCodec(demo_codec[1], broken, provider="cpu")  # does not touch the encoder yet
    with pytest.raises(CodecError, match=r"encoder\.onnx"):
        codec.encode(noise(1))


def test_missing_file_names_it_and_the_source(demo_codec: tuple[Path, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "decoder.onnx"
    with pytest.raises(WeightsError, match=ONNX_SOURCE) as info:
        OnnxCodec(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(WeightsError, match="encoder"):
        OnnxCodec(demo_codec[1], tmp_path / "encoder.onnx")


def _passthrough_model(path: Path, inputs: list[tuple[str, int, list]]) -> Path:
    """An ONNX file whose outputs copy its inputs: right file format, wrong contract."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], [f"{name}_out"]) for name, _, _ in inputs],
        "impostor",
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs],
        [helper.make_tensor_value_info(f"{name}_out", dtype, shape) for name, dtype, shape in inputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([("codes", TensorProto.INT64, [32, "b", "t"]), ("n_quantizers", TensorProto.INT64, [])], "audio_codes"),
        ([("audio_codes", TensorProto.FLOAT, [32, "b", "t"]), ("n_quantizers", TensorProto.INT64, [])], "type"),
        ([("audio_codes", TensorProto.INT64, ["b", "t"]), ("n_quantizers", TensorProto.INT64, [])], "rank"),
        ([("audio_codes", TensorProto.INT64, [16, "b", "t"]), ("n_quantizers", TensorProto.INT64, [])], "axis 0"),
    ],
)
def test_wrong_graph_is_rejected_at_load(tmp_path: Path, inputs: list, message: str) -> None:
    path = _passthrough_model(tmp_path / "decoder.onnx", inputs)
    with pytest.raises(CodecError, match=message) as info:
        OnnxCodec(path, provider="cpu")
    assert str(path) in str(info.value)


def test_encoder_file_given_as_decoder_is_rejected(demo_codec: tuple[Path, Path]) -> None:
    with pytest.raises(CodecError, match="input_values"):
        OnnxCodec(demo_codec[0], provider="cpu")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA present")
def test_cuda_provider_without_cuda_names_the_available_ones(demo_codec: tuple[Path, Path]) -> None:
    with pytest.raises(CodecError, match=r"CPUExecutionProvider.*onnxruntime-gpu"):
        OnnxCodec(demo_codec[1], provider="cuda")


def test_unknown_provider(demo_codec: tuple[Path, Path]) -> None:
    with pytest.raises(CodecError, match="'auto', 'cpu' or 'cuda'"):
        OnnxCodec(demo_codec[1], provider="tpu")


def test_closed_codec_refuses_work(demo_codec: tuple[Path, Path]) -> None:
    with OnnxCodec(demo_codec[1], provider="cpu") as codec:
        assert codec.providers == ["CPUExecutionProvider"]
    with pytest.raises(CodecError, match="closed"):
        codec.decode(np.zeros((1, 32), np.int64))


# --- codec-tiny against the codec's own PyTorch outputs ----------------------------------

# ONNX Runtime vs PyTorch float32 on codec-tiny: its README measures 2.2e-8 on a peak of 1.1e-2.
REFERENCE_ATOL = 1e-6


def test_codec_tiny_decodes_and_encodes_as_pytorch_does(codec_tiny_dir: Path) -> None:
    reference = np.load(codec_tiny_dir / "reference.npz")
    codec = OnnxCodec(codec_tiny_dir / "decoder.onnx", codec_tiny_dir / "encoder.onnx", provider="cpu", threads=1)
    np.testing.assert_allclose(
        codec.decode(reference["codes"][:, 0, :].T), reference["audio_full"], atol=REFERENCE_ATOL
    )
    np.testing.assert_array_equal(codec.encode(reference["waveform"]), reference["codes_encoded"][:, 0, :].T)


def test_codec_tiny_decodes_16_codebooks_as_pytorch_does(codec_tiny_dir: Path) -> None:
    """A 16-codebook model's codes (MOSS-TTSD, -VoiceGenerator, -SoundEffect) against PyTorch's decode with
    n_quantizers 16; the codes of codebooks 17-32 the file also holds tell a decode that ignored the count."""
    reference = np.load(codec_tiny_dir / "reference16.npz")
    codes16, upper = reference["codes16"][:, 0, :].T, reference["codes_upper"][:, 0, :].T
    codec16 = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu", threads=1, n_quantizers=16)
    audio = codec16.decode(codes16)
    np.testing.assert_allclose(audio, reference["audio_16q"], atol=REFERENCE_ATOL)
    # Decoding all 32 codebooks, whatever fills the rows past 16 (our padding's zeros, or the upper codes), is
    # another sound: the tolerance above tells them apart.
    codec32 = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu", threads=1)
    with_upper = codec32.decode(np.concatenate([codes16, upper], axis=1))
    np.testing.assert_allclose(with_upper, reference["audio_32q_with_upper"], atol=REFERENCE_ATOL)
    for ignored in (with_upper, codec32.decode(np.concatenate([codes16, np.zeros_like(upper)], axis=1))):
        assert np.abs(ignored - reference["audio_16q"]).max() > 100 * REFERENCE_ATOL


def test_codec_tiny_encodes_16_codebooks_as_the_first_16_levels(codec_tiny_dir: Path) -> None:
    """A residual quantizer's first 16 levels are its 16-level code: PyTorch's 32-level encode, cut."""
    reference = np.load(codec_tiny_dir / "reference.npz")
    codec16 = OnnxCodec(
        codec_tiny_dir / "decoder.onnx", codec_tiny_dir / "encoder.onnx", provider="cpu", threads=1, n_quantizers=16
    )
    codes = codec16.encode(reference["waveform"])
    np.testing.assert_array_equal(codes, reference["codes_encoded"][:16, 0, :].T)
    assert codes.shape == (20, 16)


def test_a_codec_decodes_and_encodes_its_own_codebook_count_only(demo_codec: tuple[Path, Path]) -> None:
    encoder, decoder = demo_codec
    codec16 = OnnxCodec(decoder, encoder, provider="cpu", n_quantizers=16)
    assert codec16.encode(noise(3)).shape == (3, 16)
    with pytest.raises(CodecError, match=r"decode expects codes of shape \(frames, 16\), got \(4, 32\)"):
        codec16.decode(np.zeros((4, 32), dtype=np.int64))
    for count in (0, 33, 16.0):
        with pytest.raises(CodecError, match=rf"1 to 32 quantizers .*not {count!r}"):
            OnnxCodec(decoder, provider="cpu", n_quantizers=count)  # type: ignore[arg-type]


def test_attention_span_comes_from_the_checkpoint_config(
    codec_tiny_dir: Path, demo_codec: tuple[Path, Path], tmp_path: Path
) -> None:
    assert OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu").attention_span_frames == 10  # 0.8 s
    assert OnnxCodec(demo_codec[1], provider="cpu").attention_span_frames == PUBLISHED_ATTENTION_SPAN_FRAMES
    (tmp_path / "config.json").write_text('{"sampling_rate": 24000}')
    with pytest.raises(CodecError, match=r"config\.json.*causal_transformer_context_duration"):
        read_attention_span(tmp_path)


def test_without_codec_tiny_its_tests_skip_and_in_ci_they_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARED_DIR_VARIABLE, str(tmp_path))
    monkeypatch.delenv(REQUIRE_CODEC_TINY_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"lacks decoder\.onnx, encoder\.onnx, reference\.npz"):
        codec_tiny_or_skip()
    monkeypatch.setenv(REQUIRE_CODEC_TINY_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception, match=rf"lacks decoder\.onnx.*{REQUIRE_CODEC_TINY_VARIABLE} is set"):
        codec_tiny_or_skip()
    # CI is where it is set: .ci/run, the CI entry point, exports it before running the suites.
    assert f"\nexport {REQUIRE_CODEC_TINY_VARIABLE}=1\n" in (REPO_ROOT / ".ci" / "run").read_text()


# --- audio files ---------------------------------------------------------------------


@pytest.mark.parametrize("rate", [48000, 44100, 22050, 16000, 8000])
def test_resample_keeps_frequency_and_amplitude(rate: int) -> None:
    out = resample(sine(1000, rate, 0.5, 0.5), rate, RATE)
    assert len(out) == -(-round(rate * 0.5) * RATE // rate)
    body = out[RATE // 20 : -RATE // 20]  # skip the filter's edge transients
    spectrum = np.abs(np.fft.rfft(body * np.hanning(len(body))))
    assert abs(np.fft.rfftfreq(len(body), 1 / RATE)[spectrum.argmax()] - 1000) < 3
    assert np.sqrt(2 * np.mean(body.astype(np.float64) ** 2)) == pytest.approx(0.5, rel=1e-3)


def test_resample_removes_what_would_alias() -> None:
    out = resample(sine(15000, 48000, 0.5, 0.5), 48000, RATE)  # above the 12 kHz output Nyquist
    assert rms_db(out[RATE // 20 : -RATE // 20]) < -80


def _write(path: Path, samples: np.ndarray, rate: int = RATE) -> Path:
    sf.write(str(path), samples, rate, subtype="FLOAT" if path.suffix == ".wav" else "PCM_24")
    return path


@pytest.mark.parametrize(("level_db", "expected_db"), [(-30, -27), (-21.5, -20), (-18.2, -20), (-12, -15)])
def test_loudness_normalized_toward_minus_20_with_3_db_clamp(
    tmp_path: Path, level_db: float, expected_db: float
) -> None:
    tone = sine(440, RATE, 1.6, 10 ** (level_db / 20) * np.sqrt(2))  # 1.6 s: 20 whole frames, no padding
    audio = load_reference_audio(_write(tmp_path / "tone.wav", tone))
    assert rms_db(audio) == pytest.approx(expected_db, abs=0.05)


def test_reference_padded_to_whole_frames(tmp_path: Path) -> None:
    audio = load_reference_audio(_write(tmp_path / "one_second.wav", sine(440, RATE, 1.0, 0.1)))
    assert audio.dtype == np.float32
    assert len(audio) == 13 * FRAME
    assert not audio[RATE:].any() and audio[RATE - 10 : RATE].any()


def test_reference_stereo_mixed_to_mono_and_resampled(tmp_path: Path) -> None:
    tone = sine(440, 48000, 0.8, 0.1)
    mono = load_reference_audio(_write(tmp_path / "mono.flac", tone, 48000))
    stereo = load_reference_audio(_write(tmp_path / "stereo.wav", np.stack([tone, tone], axis=1), 48000))
    assert mono.shape == stereo.shape == (10 * FRAME,)
    np.testing.assert_allclose(stereo, mono, atol=1e-4)


def test_reference_feeds_the_encoder(tmp_path: Path, codec: OnnxCodec) -> None:
    audio = load_reference_audio(_write(tmp_path / "voice.wav", sine(220, 16000, 0.5, 0.2), 16000))
    assert codec.encode(audio).shape == (len(audio) // FRAME, 32)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "not found"),
        ("text", "not a readable audio file"),
        ("empty", "empty"),
        ("silent", "silent"),
        ("cancelling", "silent"),
    ],
)
def test_bad_reference_audio(tmp_path: Path, case: str, message: str) -> None:
    path = tmp_path / f"{case}.wav"
    if case == "text":
        path.write_text("this is not audio\n")
    elif case == "empty":
        _write(path, np.zeros(0, np.float32))
    elif case == "silent":
        _write(path, np.zeros(RATE, np.float32))
    elif case == "cancelling":  # opposite channels cancel in the mono mix
        tone = sine(440, RATE, 0.5, 0.3)
        _write(path, np.stack([tone, -tone], axis=1))
    with pytest.raises(RequestError, match=message) as info:
        load_reference_audio(path)
    assert str(path) in str(info.value)


def test_write_wav_round_trip(tmp_path: Path) -> None:
    samples = np.concatenate([sine(440, RATE, 0.2, 0.5), [1.5, -1.5]]).astype(np.float32)
    path = tmp_path / "out.wav"
    write_wav(path, samples, RATE)
    info = sf.info(str(path))
    assert (info.samplerate, info.channels, info.subtype, info.format) == (RATE, 1, "PCM_16", "WAV")
    back, _ = sf.read(str(path), dtype="int16")
    np.testing.assert_array_equal(back[-2:], [32767, -32767])  # clipped, not wrapped
    np.testing.assert_allclose(back[:-2] / 32767, samples[:-2], atol=1 / 32767)
