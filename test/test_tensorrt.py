"""The TensorRT codec: profile shapes, the engine record and its checks, clear errors without TensorRT,
and, where TensorRT and a GPU are present, engines built from the demo codec compared with ONNX Runtime.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.cuda import GpuInfo
from moss_tts_node.codec.engines import (
    METADATA_FILE,
    EngineSet,
    build_engines,
    check_compatible,
    frozen_quantizers_model,
    import_tensorrt,
    profile_shapes,
    read_engine_set,
)
from moss_tts_node.codec.factory import open_codec
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.config import load_config
from moss_tts_node.errors import CodecError, ConfigError, MossTTSError, WeightsError
from moss_tts_node.model.rates import SAMPLES_PER_FRAME
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesis.stages import codec_params

ORIN = GpuInfo("Orin", "8.7", 7 * 2**30)


def tensorrt_missing_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when TensorRT, a CUDA binding and a GPU are usable."""
    from moss_tts_node.codec.cuda import cuda_api

    try:
        import_tensorrt()
        cuda_api().release()
    except MossTTSError as error:
        return str(error)
    return None


MISSING = tensorrt_missing_reason()
needs_gpu = pytest.mark.skipif(MISSING is not None, reason=f"needs TensorRT and a CUDA GPU: {MISSING}")
without_tensorrt = pytest.mark.skipif(MISSING is None, reason="TensorRT and a GPU are usable here")


# -- profile shapes and the engine record (any machine) ---------------------------------------


def test_profiles_follow_upstream_for_40_seconds() -> None:
    encoder, decoder = profile_shapes("encoder", 40), profile_shapes("decoder", 40)
    assert (encoder.input_name, encoder.min, encoder.opt, encoder.max) == (
        "input_values",
        (1, 1, 1920),
        (1, 1, 192000),
        (1, 1, 960000),
    )
    assert (decoder.input_name, decoder.min, decoder.opt, decoder.max) == (
        "audio_codes",
        (32, 1, 1),
        (32, 1, 100),
        (32, 1, 500),
    )


def test_short_profiles_clamp_opt_and_keep_whole_frames() -> None:
    assert profile_shapes("decoder", 2).opt == profile_shapes("decoder", 2).max == (32, 1, 25)
    assert profile_shapes("encoder", 5).max == (1, 1, 62 * SAMPLES_PER_FRAME)  # 62.5 frames: whole frames only
    with pytest.raises(CodecError, match="positive"):
        profile_shapes("decoder", 0)


def engine_set(directory: Path, **changes: object) -> EngineSet:
    record = EngineSet(
        directory=directory,
        tensorrt_version="10.3.0",
        gpu=ORIN,
        max_seconds=40.0,
        max_frames=500,
        precision="tf32",
        engines={"encoder": "encoder.engine", "decoder": "decoder.engine"},
    )
    return dataclasses.replace(record, **changes)


def write_record(directory: Path, record: EngineSet) -> None:
    for name in record.engines.values():
        (directory / name).write_bytes(b"plan")
    (directory / METADATA_FILE).write_text(record.to_json())


def test_engine_record_round_trips(tmp_path: Path) -> None:
    record = engine_set(tmp_path)
    write_record(tmp_path, record)
    assert read_engine_set(tmp_path) == record
    saved = json.loads((tmp_path / METADATA_FILE).read_text())
    assert saved["tensorrt_version"] == "10.3.0" and saved["gpu"]["name"] == "Orin" and saved["max_seconds"] == 40.0


def test_missing_or_broken_engine_records_say_how_to_rebuild(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="build-engines"):
        read_engine_set(tmp_path)
    write_record(tmp_path, engine_set(tmp_path))
    (tmp_path / "encoder.engine").unlink()
    with pytest.raises(WeightsError, match=r"encoder engine.*missing"):
        read_engine_set(tmp_path)
    (tmp_path / METADATA_FILE).write_text('{"format": 1, "gpu": {}}')
    with pytest.raises(WeightsError, match="not an engine record"):
        read_engine_set(tmp_path)


def test_engine_records_keep_their_quantizer_count_and_older_ones_read_as_32(tmp_path: Path) -> None:
    record = engine_set(tmp_path, n_quantizers=16)
    write_record(tmp_path, record)
    assert read_engine_set(tmp_path).n_quantizers == 16
    saved = json.loads((tmp_path / METADATA_FILE).read_text())
    del saved["n_quantizers"]  # as build-engines wrote it before 16-codebook models: always 32, frozen in
    (tmp_path / METADATA_FILE).write_text(json.dumps(saved))
    assert read_engine_set(tmp_path).n_quantizers == 32


def test_engines_of_another_tensorrt_or_gpu_are_refused_with_the_reason(tmp_path: Path) -> None:
    record = engine_set(tmp_path)
    check_compatible(record, "10.3.0", ORIN)
    check_compatible(dataclasses.replace(record, n_quantizers=16), "10.3.0", ORIN, 16)
    with pytest.raises(CodecError, match=r"built for 16 quantizers, this model has 32 codebooks.*--quantizers 32"):
        check_compatible(dataclasses.replace(record, n_quantizers=16), "10.3.0", ORIN, 32)
    check_compatible(record, "10.3.0", dataclasses.replace(ORIN, memory_bytes=15 * 2**30))  # memory is not compared
    with pytest.raises(CodecError, match=r"TensorRT 10\.3\.0, this machine has TensorRT 8\.6\.2.*build-engines"):
        check_compatible(record, "8.6.2", ORIN)
    with pytest.raises(CodecError, match=r"built for Orin \(compute capability 8\.7\).*NVIDIA H200 \(9\.0\)"):
        check_compatible(record, "10.3.0", GpuInfo("NVIDIA H200", "9.0"))


def test_tensorrt_backend_needs_an_engine_dir(demo_config: Path, tmp_path: Path) -> None:
    weights = demo_config.parent
    base = {"model.weights_dir": str(weights), "audio.backend": "tensorrt"}
    with pytest.raises(ConfigError, match=r"'model\.engine_dir' is not set.*build-engines"):
        load_config(demo_config, base)
    # The codec directory is not needed with engines; the engines are checked when the codec opens.
    config = load_config(demo_config, {**base, "model.codec_dir": str(tmp_path), "model.engine_dir": str(tmp_path)})
    assert config.audio.backend == "tensorrt"


# -- clear errors where TensorRT or a GPU is missing --------------------------------------------


@without_tensorrt
def test_without_tensorrt_every_entry_point_says_what_is_missing(demo_config: Path, tmp_path: Path) -> None:
    weights = demo_config.parent
    config = load_config(demo_config, {"audio.backend": "tensorrt", "model.engine_dir": str(tmp_path)})
    with pytest.raises(MossTTSError, match=r"TensorRT is not usable|no CUDA|CUDA is not usable"):
        open_codec(codec_params(config, ModelSpec()))
    out = tmp_path / "engines"
    command = ["build-engines", "--decoder", weights / "codec" / "decoder.onnx", "--out", out, "--max-seconds", "2"]
    done = run_cli(*command)
    assert done.returncode == 2
    assert "TensorRT is not usable" in done.stderr or "CUDA" in done.stderr, done.stderr
    assert not (out / METADATA_FILE).exists()


def test_build_engines_checks_its_inputs_first(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"decoder ONNX file not found"):
        build_engines(tmp_path / "absent.onnx", tmp_path / "out", 2.0)
    with pytest.raises(CodecError, match="positive"):
        build_engines(tmp_path / "absent.onnx", tmp_path / "out", -1.0)


@pytest.mark.parametrize("quantizers", [32, 16])
@pytest.mark.parametrize("codec", ["demo", "codec-tiny"])
def test_frozen_quantizers_graph_computes_what_the_original_does(
    request: pytest.FixtureRequest, codec: str, quantizers: int, tmp_path: Path
) -> None:
    """What TensorRT parses: n_quantizers a constant, the weights still read from the original's folder.

    codec-tiny's graphs have the published files' patterns (n_quantizers gating every codebook).
    """
    import onnx
    import onnxruntime as ort

    if codec == "demo":
        encoder, decoder = request.getfixturevalue("demo_codec")
    else:
        tiny = request.getfixturevalue("codec_tiny_dir")
        encoder, decoder = tiny / "encoder.onnx", tiny / "decoder.onnx"
    split = tmp_path / "external"  # as published: weights in a data file beside the graph
    split.mkdir()
    rng = np.random.default_rng(0)
    feeds = {
        "encoder": {"input_values": (0.1 * rng.standard_normal((1, 1, 3 * SAMPLES_PER_FRAME))).astype(np.float32)},
        "decoder": {"audio_codes": rng.integers(0, 1024, (32, 1, 7)).astype(np.int64)},
    }
    for graph, source in (("encoder", encoder), ("decoder", decoder)):
        original = split / f"{graph}.onnx"
        onnx.save(
            onnx.load(str(source)),
            str(original),
            save_as_external_data=True,
            location=f"{graph}.data",
            size_threshold=1024,
        )
        assert (split / f"{graph}.data").stat().st_size > 10_000  # the weights really are outside the graph
        frozen = split / f"{graph}_frozen.onnx"  # beside the original: where its external data resolves
        frozen.write_bytes(frozen_quantizers_model(original, quantizers))
        assert [i.name for i in ort.InferenceSession(str(frozen)).get_inputs()] == list(feeds[graph])
        want = ort.InferenceSession(str(original)).run(None, {**feeds[graph], "n_quantizers": np.array(quantizers)})
        got = ort.InferenceSession(str(frozen)).run(None, feeds[graph])
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w)

    (tmp_path / "not.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(CodecError, match="not a readable ONNX file"):
        frozen_quantizers_model(tmp_path / "not.onnx")
    heads = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])],
            "other",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
    )
    onnx.save(heads, str(tmp_path / "other.onnx"))
    with pytest.raises(CodecError, match=r"graph inputs are \['x'\], expected the codec's"):
        frozen_quantizers_model(tmp_path / "other.onnx")


# -- on a GPU: engines from the demo codec against ONNX Runtime ---------------------------------

MAX_SECONDS = 2.0  # 25 frames: small engines, quick builds, and windowing exercised at 60 frames


@pytest.fixture(scope="module")
def engines(demo_codec: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> EngineSet:
    if MISSING is not None:
        pytest.skip(f"needs TensorRT and a CUDA GPU: {MISSING}")
    encoder, decoder = demo_codec
    return build_engines(decoder, tmp_path_factory.mktemp("engines"), MAX_SECONDS, encoder)


@pytest.fixture(scope="module")
def reference(demo_codec: tuple[Path, Path]) -> OnnxCodec:
    encoder, decoder = demo_codec
    return OnnxCodec(decoder, encoder, provider="cpu", threads=1)


def usable_bindings() -> list[str]:
    """The CUDA bindings that work here, so the codec is tested on each (pycuda and/or cuda-python)."""
    from moss_tts_node.codec.cuda import CUDA_APIS, cuda_api

    usable = []
    for name in CUDA_APIS:
        try:
            cuda_api(name).release()
        except MossTTSError:
            continue
        usable.append(name)
    return usable or ["auto"]


@pytest.fixture(scope="module", params=usable_bindings())
def trt_codec(request: pytest.FixtureRequest, engines: EngineSet) -> Iterator[AudioCodec]:
    from moss_tts_node.codec.tensorrt import TensorRTCodec

    with TensorRTCodec(engines.directory, cuda=request.param) as codec:
        yield codec


@needs_gpu
def test_built_engines_are_recorded(engines: EngineSet) -> None:
    trt = import_tensorrt()
    assert engines.tensorrt_version == trt.__version__ and engines.precision == "tf32"
    assert engines.max_frames == 25 and set(engines.engines) == {"encoder", "decoder"}
    assert read_engine_set(engines.directory) == engines


@needs_gpu
@pytest.mark.parametrize("frames", [1, 10, 25])
def test_decode_matches_onnx_runtime(trt_codec: AudioCodec, reference: OnnxCodec, frames: int) -> None:
    codes = np.random.default_rng(frames).integers(0, 1024, size=(frames, 32))
    audio = trt_codec.decode(codes)
    assert audio.shape == (frames * SAMPLES_PER_FRAME,) and audio.dtype == np.float32
    np.testing.assert_allclose(audio, reference.decode(codes), atol=1e-2)  # TF32 matmuls: ~1e-3


@needs_gpu
def test_audio_longer_than_the_engine_is_decoded_and_encoded_in_windows(
    trt_codec: AudioCodec, reference: OnnxCodec
) -> None:
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 1024, size=(60, 32))  # 4.8 s through 2 s engines
    np.testing.assert_allclose(trt_codec.decode(codes), reference.decode(codes), atol=1e-2)
    audio = (0.1 * rng.standard_normal(60 * SAMPLES_PER_FRAME)).astype(np.float32)
    assert trt_codec.encode(audio).shape == (60, 32)


@needs_gpu
def test_encode_matches_onnx_runtime_up_to_tf32_rounding(trt_codec: AudioCodec, reference: OnnxCodec) -> None:
    audio = (0.1 * np.random.default_rng(3).standard_normal(20 * SAMPLES_PER_FRAME)).astype(np.float32)
    got, want = trt_codec.encode(audio), reference.encode(audio)
    assert got.shape == want.shape == (20, 32) and got.dtype == np.int64
    # The demo encoder quantizes a 1920-long dot product; TF32's 10-bit mantissa moves values that lie
    # near a level boundary by one level. Anything more would be a real difference.
    difference = np.abs(got - want)
    assert difference.max() <= 1 and np.mean(difference > 0) < 0.4


@needs_gpu
def test_calls_reuse_the_buffers_allocated_at_load(trt_codec: AudioCodec) -> None:
    runner = trt_codec._runner("decoder")  # type: ignore[attr-defined]

    def no_allocation(*args: object) -> int:
        raise AssertionError("a device buffer was allocated during a call")

    cuda = runner._cuda
    allocate, cuda.device_buffer = cuda.device_buffer, no_allocation
    try:
        for frames in (3, 25, 7):
            trt_codec.decode(np.zeros((frames, 32), dtype=np.int64))
    finally:
        cuda.device_buffer = allocate


@needs_gpu
def test_engines_from_another_tensorrt_are_refused(engines: EngineSet, tmp_path: Path) -> None:
    from moss_tts_node.codec.tensorrt import TensorRTCodec

    copy = Path(shutil.copytree(engines.directory, tmp_path / "engines"))
    record = json.loads((copy / METADATA_FILE).read_text())
    record["tensorrt_version"] = "7.0.0"
    (copy / METADATA_FILE).write_text(json.dumps(record))
    with pytest.raises(CodecError, match=r"built with TensorRT 7\.0\.0"):
        TensorRTCodec(copy)


@needs_gpu
def test_engines_for_16_codebooks_decode_as_pytorch_does(codec_tiny_dir: Path, tmp_path: Path) -> None:
    """Engines built with --quantizers 16 take the same 32-row input and decode only the first 16 codebooks
    (reference16.npz: PyTorch's decode with n_quantizers 16); a codec of another count refuses them."""
    from moss_tts_node.codec.tensorrt import TensorRTCodec

    built = build_engines(
        codec_tiny_dir / "decoder.onnx", tmp_path, 4.0, codec_tiny_dir / "encoder.onnx", n_quantizers=16
    )
    assert read_engine_set(tmp_path).n_quantizers == built.n_quantizers == 16
    reference = np.load(codec_tiny_dir / "reference16.npz")
    with TensorRTCodec(tmp_path, n_quantizers=16) as codec:
        audio = codec.decode(reference["codes16"][:, 0, :].T)
        encoded = codec.encode(np.load(codec_tiny_dir / "reference.npz")["waveform"])
    peak = np.abs(reference["audio_16q"]).max()
    np.testing.assert_allclose(audio, reference["audio_16q"], atol=0.02 * peak)  # TF32: about 1e-3 of the peak
    assert np.abs(audio - reference["audio_32q_with_upper"]).max() > 0.1 * peak
    assert encoded.shape == (20, 16)
    with pytest.raises(CodecError, match=r"built for 16 quantizers, this model has 32"):
        TensorRTCodec(tmp_path)


@needs_gpu
def test_synthesis_with_the_tensorrt_codec_matches_onnx(demo_config: Path, engines: EngineSet) -> None:
    from moss_tts_node.synthesizer import Synthesizer

    with Synthesizer.from_config_file(demo_config) as onnx_synth:
        want = onnx_synth.synthesize("Hello! I am a robot.", seed=1)
    overrides = {"audio.backend": "tensorrt", "model.engine_dir": str(engines.directory)}
    with Synthesizer.from_config_file(demo_config, overrides) as trt_synth:
        got = trt_synth.synthesize("Hello! I am a robot.", seed=1)
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_allclose(got.audio, want.audio, atol=1e-2)
