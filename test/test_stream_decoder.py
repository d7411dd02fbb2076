"""The stream decoder against the codec's own PyTorch outputs on codec-tiny (real architecture, tiny, random).

codec-tiny's reference.npz holds the offline decode of 48 frames and the codec's stateful streaming
decode in chunks of 1 and 5 frames; its attention span is 0.8 s (10 frames), so 48 frames wrap every
ring. The shared folder is found through MOSS_SHARED_DIR, by default ``shared`` beside the repository.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import codec_tiny_location

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.codec.stream_decoder import StreamDecoder, StreamDecoderCodec
from moss_tts_node.codec.streaming import StatefulStreamDecoding
from moss_tts_node.errors import CodecError, WeightsError
from moss_tts_node.tools.dev.codec_fidelity import snr_db
from moss_tts_node.tools.prepare.stream_decoder_build import build_stream_decoder

TINY = codec_tiny_location()
pytestmark = pytest.mark.usefixtures("codec_tiny_dir")  # skips without codec-tiny, fails in CI (conftest)

# Float32 rounding differs between PyTorch and ONNX Runtime kernels; the audio peaks at 1.1e-2.
ATOL = 1e-6
SPAN_FRAMES = 10  # codec-tiny attends over 0.8 s at 12.5 frames/s


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(TINY / "reference.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def codes(reference: dict[str, np.ndarray]) -> np.ndarray:
    """The 48 reference frames in this package's layout, (frames, codebooks)."""
    return np.ascontiguousarray(reference["codes"][:, 0, :].T)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("stream-decoder")
    return {
        "window": build_stream_decoder(TINY, out / "window.onnx"),
        "ring": build_stream_decoder(TINY, out / "ring.onnx", attention="ring"),
        "w8": build_stream_decoder(TINY, out / "w8.onnx", precision="w8"),
    }


def stream(decoder: StreamDecoder, codes: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([decoder.decode(codes[start : start + chunk]) for start in range(0, len(codes), chunk)])


@pytest.mark.parametrize("chunk", [1, 5])
def test_ring_attention_matches_the_codecs_own_streaming(graphs, reference, codes, chunk: int) -> None:
    audio = stream(StreamDecoder(graphs["ring"]), codes, chunk)
    np.testing.assert_allclose(audio, reference[f"audio_stream_C{chunk}"], rtol=0, atol=ATOL)
    # Like the codec's streaming, it equals the offline decode until the rings are full.
    before_full = SPAN_FRAMES * AudioCodec.samples_per_frame
    np.testing.assert_allclose(audio[:before_full], reference["audio_full"][:before_full], rtol=0, atol=ATOL)


@pytest.mark.parametrize("chunk", [1, 5, 48])
def test_window_attention_matches_the_offline_decode_at_any_chunk_size(graphs, reference, codes, chunk: int) -> None:
    audio = stream(StreamDecoder(graphs["window"]), codes, chunk)
    np.testing.assert_allclose(audio, reference["audio_full"], rtol=0, atol=ATOL)


def test_8bit_weights_stay_near_the_offline_decode_and_are_8bit(graphs, reference, codes) -> None:
    snr = snr_db(stream(StreamDecoder(graphs["w8"]), codes, 5), reference["audio_full"])
    assert 15 < snr < 60, f"w8 SNR {snr:.1f} dB"  # about 25 dB on this random model: not float32's 140
    graph = onnx.load(graphs["w8"])
    weights = [node for node in graph.graph.node if node.op_type == "MatMulNBits"]
    # 4 per layer (q, k and v in one, out, two FFN) in 4 stages of 2, each stage's in and out projection, the
    # quantizer's
    assert len(weights) == 4 * 2 * 4 + 4 * 2 + 1


def test_reset_makes_the_next_utterance_decode_exactly_like_the_first(graphs, codes) -> None:
    decoder = StreamDecoder(graphs["window"])
    first = stream(decoder, codes, 5)
    assert decoder.frames_done == len(codes)
    decoder.reset()
    assert decoder.frames_done == 0
    np.testing.assert_array_equal(stream(decoder, codes, 5), first)


def test_state_is_the_attention_caches_of_every_layer(graphs) -> None:
    # 4 stages of 2 layers, keys and values of 4 heads x 16 dims over rings of 10, 20, 40, 80 positions (1, 2, 4,
    # 8 a frame), each followed by the rows of a call's positions: 25 frames in a window graph, in a ring graph
    # the 10 its calls may hold.
    assert StreamDecoder(graphs["window"]).state_bytes == 2 * 2 * 4 * 16 * (10 + 20 + 40 + 80) * (1 + 25 / 10) * 4
    assert StreamDecoder(graphs["ring"]).state_bytes == 2 * 2 * 4 * 16 * (10 + 20 + 40 + 80) * 2 * 4


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros((32, 3), dtype=np.int64), r"shape \(frames, 32\)"),
        (np.zeros((0, 32), dtype=np.int64), "at least one frame"),
        (np.zeros((2, 32), dtype=np.float32), "integer codes"),
        (np.full((2, 32), 1024), "pad code 1024 must be removed"),
    ],
)
def test_bad_codes_are_refused_with_a_reason(graphs, bad: np.ndarray, message: str) -> None:
    decoder = StreamDecoder(graphs["window"])
    with pytest.raises(CodecError, match=message):
        decoder.decode(bad)
    assert decoder.frames_done == 0


def test_ring_attention_refuses_chunks_longer_than_its_span(graphs, codes) -> None:
    decoder = StreamDecoder(graphs["ring"])
    assert decoder.max_frames == SPAN_FRAMES
    with pytest.raises(CodecError, match=r"at most 10 frames per call.*attention='window'"):
        decoder.decode(codes[: SPAN_FRAMES + 1])


def test_other_graphs_are_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(CodecError, match=r"not a stream decoder graph.*build-stream-decoder"):
        StreamDecoder(TINY / "decoder.onnx")
    with pytest.raises(CodecError, match="not found"):
        StreamDecoder(tmp_path / "missing.onnx")


def tiny_copy(tmp_path: Path, edit) -> Path:
    """codec-tiny's checkpoint with its config.json changed by ``edit(config)``."""
    config = json.loads((TINY / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(TINY / "model.safetensors", tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["decoder_kwargs"][1].update(module_type="Conv"), r"decoder_kwargs\[1\]\.module_type = 'Conv'"),
        (
            lambda c: c["decoder_kwargs"][0].update(positional_embedding="sin"),
            r"decoder_kwargs\[0\]\.positional_embedding = 'sin' is not supported",
        ),
        (lambda c: c["decoder_kwargs"][2].update(weights_per_step=4), r"decoder_kwargs\[2\]\.weights_per_step"),
        (lambda c: c["quantizer_kwargs"].update(quantizer_type="rvq"), r"quantizer_type = 'rvq' is not supported"),
        (lambda c: c.pop("causal_transformer_context_duration"), "causal_transformer_context_duration is missing"),
        (lambda c: c["decoder_kwargs"][0].update(num_layers=3), "tensor decoder.0.transformer.layers.2.* is missing"),
        (lambda c: c["decoder_kwargs"][0].update(dim_feedforward=96), r"linear1\.weight has shape \[128, 64\]"),
    ],
)
def test_unsupported_or_inconsistent_checkpoints_are_refused_naming_the_key(tmp_path: Path, edit, message) -> None:
    with pytest.raises(WeightsError, match=message):
        build_stream_decoder(tiny_copy(tmp_path, edit), tmp_path / "out.onnx")


def test_a_missing_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"config\.json not found"):
        build_stream_decoder(tmp_path, tmp_path / "out.onnx")


def test_the_build_command_writes_a_graph_that_equals_the_offline_decode(
    tmp_path: Path, codes: np.ndarray, reference: dict[str, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    from moss_tts_node.tools.cli.main import main

    out = tmp_path / "decoder_stream.onnx"
    assert main(["build-stream-decoder", str(TINY), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    np.testing.assert_allclose(stream(StreamDecoder(out), codes, 5), reference["audio_full"], atol=ATOL)
    assert main(["build-stream-decoder", str(TINY), "--out", str(out)]) == 2  # no silent overwrite
    assert "--force" in capsys.readouterr().err


def test_the_streams_decoding_splits_chunks_a_ring_graph_cannot_take_at_once(graphs, codes) -> None:
    decoding = StatefulStreamDecoding(StreamDecoder(graphs["ring"]))
    first = 2 * SPAN_FRAMES + 5  # more than one call's worth, as a long pending chunk at a segment's end can be
    audio = np.concatenate([decoding.decode(codes[:first], 0), decoding.decode(codes[: first + 3], first)])
    calls = StreamDecoder(graphs["ring"])  # the calls it must make: at most 10 frames, in order
    bounds = [0, SPAN_FRAMES, 2 * SPAN_FRAMES, first, first + 3]
    expected = np.concatenate([calls.decode(codes[a:b]) for a, b in itertools.pairwise(bounds)])
    np.testing.assert_array_equal(audio, expected)
    decoding.reset()
    assert decoding.decoder.frames_done == 0


def test_a_chunk_that_does_not_follow_the_decoders_state_is_refused(graphs, codes) -> None:
    decoding = StatefulStreamDecoding(StreamDecoder(graphs["window"]))
    decoding.decode(codes[:3], 0)
    with pytest.raises(CodecError, match="holds 3 frames of state, not the 5"):
        decoding.decode(codes[:6], 5)  # another stream's chunk: its frames 3 and 4 never reached this decoder


def test_whole_utterances_decode_on_the_stream_decoder_exactly_in_bounded_calls(graphs, reference, codes) -> None:
    decoder = StreamDecoder(graphs["window"])
    codec = StreamDecoderCodec(decoder, OnnxCodec(None, TINY / "encoder.onnx", provider="cpu"), frames_per_call=7)
    assert codec.max_frames is None  # any length in one pass, no windows: 48 frames here take 7 calls
    np.testing.assert_allclose(codec.decode(codes), reference["audio_full"], rtol=0, atol=ATOL)
    assert decoder.frames_done == 0  # the state is left empty for the next decode or stream
    np.testing.assert_array_equal(codec.encode(reference["waveform"]), reference["codes_encoded"][:, 0, :].T)
    stream(decoder, codes[:3], 3)  # a stream is under way on the same graph: a decode now would corrupt it
    with pytest.raises(CodecError, match="holds 3 frames of state, not the 0 of this decode"):
        codec.decode(codes)
    assert decoder.frames_done == 3  # refused before it touched the stream's state: the stream goes on


def test_the_random_codec_is_initialized_as_the_codecs_library_does(tmp_path: Path) -> None:
    """docs/stream-decoder.md "Test weights": std 0.02 weights and codebooks, norms 1/0, the config's layer
    scale, weight-normed convolutions with g = |v| (so the weight is v) and zero biases."""
    from moss_tts_node.tools.dev.random_codec import write_random_codec
    from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint

    checkpoint = SafetensorsCheckpoint(write_random_codec(TINY / "config.json", tmp_path / "random"))
    tensors = {name: checkpoint.read(name) for name in checkpoint.tensors}
    layer = "decoder.0.transformer.layers.1"
    for name in (
        f"{layer}.linear1.weight",
        f"{layer}.self_attn.in_projs.0.weight",
        "quantizer.quantizers.3.codebook.weight",
    ):
        assert abs(float(tensors[name].std()) - 0.02) < 0.002, name
    scale = json.loads((TINY / "config.json").read_text())["decoder_kwargs"][0]["layer_scale"]
    np.testing.assert_array_equal(tensors[f"{layer}.layer_scale_2.scale"], np.float32(scale))
    np.testing.assert_array_equal(tensors[f"{layer}.norm1.weight"], 1.0)
    np.testing.assert_array_equal(tensors[f"{layer}.norm1.bias"], 0.0)
    conv = "quantizer.output_proj"
    v, g = tensors[f"{conv}.parametrizations.weight.original1"], tensors[f"{conv}.parametrizations.weight.original0"]
    np.testing.assert_allclose(g[:, 0, 0], np.linalg.norm(v[:, :, 0], axis=1), rtol=1e-6)
    assert np.abs(v).max() <= 1 / np.sqrt(v.shape[1]) and np.abs(v).max() > 0.9 / np.sqrt(v.shape[1])
    np.testing.assert_array_equal(tensors[f"{conv}.bias"], 0.0)
    published = SafetensorsCheckpoint(TINY).tensors  # the decode path's tensors in the published layout
    assert all(published[name].shape == array.shape for name, array in tensors.items())
    audio = StreamDecoder(build_stream_decoder(tmp_path / "random", tmp_path / "random.onnx")).decode(
        np.zeros((2, 32), int)
    )
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() > 0


def test_a_graph_for_16_quantizers_decodes_the_codecs_first_16_levels_streaming_as_offline(tmp_path: Path) -> None:
    """The 16-codebook models of the family decode the codec's first 16 levels: PyTorch's decode with
    n_quantizers 16 (reference16.npz), whatever the chunking; the refusals name both counts."""
    from moss_tts_node.tools.cli.main import main

    with np.load(TINY / "reference16.npz") as data:
        reference = dict(data)
    codes = np.ascontiguousarray(reference["codes16"][:, 0, :].T)  # (50, 16)
    graph = tmp_path / "decoder_stream16.onnx"
    assert main(["build-stream-decoder", str(TINY), "--out", str(graph), "--quantizers", "16"]) == 0
    decoder = StreamDecoder(graph, quantizers=16)
    assert decoder.n_quantizers == 16
    for chunk in (1, 5, 50):
        decoder.reset()
        np.testing.assert_allclose(stream(decoder, codes, chunk), reference["audio_16q"], rtol=0, atol=ATOL)
    with pytest.raises(CodecError, match=r"shape \(frames, 16\), got \(2, 32\)"):
        decoder.decode(np.zeros((2, 32), dtype=np.int64))
    with pytest.raises(
        CodecError, match=r"decodes codes of 16 quantizers, but this model's codes have 32.*--quantizers 32"
    ):
        StreamDecoder(graph, quantizers=32)
    full = build_stream_decoder(TINY, tmp_path / "decoder_stream32.onnx")
    with pytest.raises(
        CodecError, match=r"decodes codes of 32 quantizers, but this model's codes have 16.*--quantizers 16"
    ):
        StreamDecoder(full, quantizers=16)
    # All 32 levels decode otherwise: the upper 16 are no small change here, so the 16 are not 32 in disguise.
    upper = np.concatenate([reference["codes16"], reference["codes_upper"]])[:, 0, :].T
    np.testing.assert_allclose(stream(StreamDecoder(full), upper, 5), reference["audio_32q_with_upper"], atol=ATOL)
