"""A tiny random stand-in for MOSS-Audio-Tokenizer, written as real ONNX files.

The real codec (1.6 B parameters, several GB) cannot be shipped with tests or fetched
on every machine, yet the codec backends, the streaming decoder and the ROS node must be
exercised end to end. ``write_demo_codec`` writes ``encoder.onnx`` and ``decoder.onnx``
with exactly the published input/output names, dtypes and dynamic (batch, time) axes,
and the one property streaming depends on: the decoder is causal.

The weights are random: the encoder's codes carry no meaning and the decoder produces
**noise, not speech**. Use it to test plumbing, shapes, timing and causality only.

Encoder: frames of 1920 samples -> fixed random projection to 32 values -> tanh ->
uniform quantization to 0..1023, one value per codebook. Deterministic: equal audio
gives equal codes. ``n_quantizers`` keeps the first n codebooks, as a residual quantizer
would.

Decoder: per-codebook embedding lookup, summed over the first ``n_quantizers``
codebooks -> causal 1-D convolution over frames (left padding only, so frame t sees
frames t-2..t) -> tanh -> projection to 1920 samples per frame -> tanh, keeping the
output in [-1, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE
from moss_tts_node.codec.quantizer import CODEBOOK_SIZE, CODEC_QUANTIZERS
from moss_tts_node.model.rates import SAMPLES_PER_FRAME

OPSET = 17
IR_VERSION = 8  # the oldest IR that carries opset 17: readable by older runtimes and TensorRT

_EMBED_DIM = 8  # decoder embedding width; keeps decoder.onnx near 1.3 MB
_HIDDEN = 32  # causal conv channels
_CONV_FRAMES = 3  # conv kernel width in frames (the decoder's receptive field)
_ENCODER_GAIN = 10.0  # spreads the projected values over most of the code range


def write_demo_codec(out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``decoder.onnx`` into ``out_dir``; return (encoder, decoder).

    The same seed always yields byte-identical files.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    encoder_path, decoder_path = out_dir / ENCODER_FILE, out_dir / DECODER_FILE
    _save(_encoder_model(rng), encoder_path)
    _save(_decoder_model(rng), decoder_path)
    return encoder_path, decoder_path


def _save(model: onnx.ModelProto, path: Path) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def _const(name: str, value: np.ndarray | int | float, dtype: type = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="moss_tts_node.tools.dev.demo_codec"
    )
    model.ir_version = IR_VERSION
    return model


def _lengths(
    shape_input: str, batch_axis: int, op: str, output: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes and constants for ``output`` (B,) = (time dim of ``shape_input``) op 1920.

    Both graphs keep time on axis 2; ``op`` is Div for the encoder (samples -> frames)
    and Mul for the decoder (frames -> samples).
    """
    nodes = [
        helper.make_node("Shape", [shape_input], ["in_shape"]),
        helper.make_node("Gather", ["in_shape", "time_axis"], ["time_len"], axis=0),
        helper.make_node(op, ["time_len", "frame_size"], ["length"]),
        helper.make_node("Slice", ["in_shape", "batch_start", "batch_end"], ["batch_dims"]),
        helper.make_node("Expand", ["length", "batch_dims"], [output]),
    ]
    consts = [
        _const("time_axis", 2),
        _const("frame_size", SAMPLES_PER_FRAME),
        _const("batch_start", [batch_axis]),
        _const("batch_end", [batch_axis + 1]),
    ]
    return nodes, consts


def _encoder_model(rng: np.random.Generator) -> onnx.ModelProto:
    """input_values (B,1,T) float32, n_quantizers () -> codes (n_q,B,T/1920), lengths (B,)."""
    projection = rng.standard_normal((SAMPLES_PER_FRAME, CODEC_QUANTIZERS)) / np.sqrt(SAMPLES_PER_FRAME)
    length_nodes, length_consts = _lengths("input_values", 0, "Div", "audio_codes_lengths")
    nodes = [
        helper.make_node("Reshape", ["input_values", "frame_shape"], ["frames"]),  # (B, F, 1920)
        helper.make_node("MatMul", ["frames", "projection"], ["projected"]),  # (B, F, 32)
        helper.make_node("Mul", ["projected", "gain"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["squashed"]),  # (-1, 1)
        helper.make_node("Add", ["squashed", "one"], ["shifted"]),  # (0, 2)
        helper.make_node("Mul", ["shifted", "half_codebook"], ["levels"]),  # (0, CODEBOOK_SIZE)
        helper.make_node("Floor", ["levels"], ["floored"]),
        helper.make_node("Clip", ["floored", "code_min", "code_max"], ["clipped"]),
        helper.make_node("Cast", ["clipped"], ["codes_bft"], to=TensorProto.INT64),
        helper.make_node("Transpose", ["codes_bft"], ["all_codes"], perm=[2, 0, 1]),  # (32, B, F)
        helper.make_node("Unsqueeze", ["n_quantizers", "axis0"], ["n_q_1d"]),
        helper.make_node("Slice", ["all_codes", "axis0", "n_q_1d", "axis0"], ["audio_codes"]),
        *length_nodes,
    ]
    consts = [
        _const("frame_shape", [0, -1, SAMPLES_PER_FRAME]),
        _const("projection", projection, np.float32),
        _const("gain", _ENCODER_GAIN, np.float32),
        _const("one", 1.0, np.float32),
        _const("half_codebook", CODEBOOK_SIZE / 2, np.float32),
        _const("code_min", 0.0, np.float32),
        _const("code_max", CODEBOOK_SIZE - 1.0, np.float32),
        _const("axis0", [0]),
        *length_consts,
    ]
    graph = helper.make_graph(
        nodes,
        "moss_demo_encoder",
        [
            helper.make_tensor_value_info("input_values", TensorProto.FLOAT, ["batch", 1, "samples"]),
            helper.make_tensor_value_info("n_quantizers", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("audio_codes", TensorProto.INT64, ["n_q", "batch", "frames"]),
            helper.make_tensor_value_info("audio_codes_lengths", TensorProto.INT64, ["batch"]),
        ],
        initializer=consts,
    )
    return _model(graph)


def _decoder_model(rng: np.random.Generator) -> onnx.ModelProto:
    """audio_codes (32,B,F) int64, n_quantizers () -> audio (B,1,1920*F), lengths (B,)."""
    embeddings = rng.standard_normal((CODEC_QUANTIZERS * CODEBOOK_SIZE, _EMBED_DIM)) / np.sqrt(CODEC_QUANTIZERS)
    conv = rng.standard_normal((_HIDDEN, _EMBED_DIM, _CONV_FRAMES)) / np.sqrt(_EMBED_DIM * _CONV_FRAMES)
    projection = rng.standard_normal((_HIDDEN, SAMPLES_PER_FRAME)) / np.sqrt(_HIDDEN)
    length_nodes, length_consts = _lengths("audio_codes", 1, "Mul", "audio_lengths")
    nodes = [
        # Codebook k's rows live at k * CODEBOOK_SIZE onwards, in one flat table.
        helper.make_node("Add", ["audio_codes", "codebook_offsets"], ["rows"]),
        helper.make_node("Gather", ["embeddings", "rows"], ["embedded"], axis=0),  # (32, B, F, D)
        helper.make_node("Less", ["codebook_ids", "n_quantizers"], ["used"]),
        helper.make_node("Cast", ["used"], ["used_f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["used_f", "mask_shape"], ["mask"]),
        helper.make_node("Mul", ["embedded", "mask"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axis0"], ["summed"], keepdims=0),  # (B, F, D)
        helper.make_node("Transpose", ["summed"], ["channels_first"], perm=[0, 2, 1]),  # (B, D, F)
        # pads=[left, right] on the frame axis: left only, so frame t never sees t+1.
        helper.make_node("Conv", ["channels_first", "conv_weight"], ["conv"], pads=[_CONV_FRAMES - 1, 0]),
        helper.make_node("Tanh", ["conv"], ["hidden"]),
        helper.make_node("Transpose", ["hidden"], ["frames_first"], perm=[0, 2, 1]),  # (B, F, H)
        helper.make_node("MatMul", ["frames_first", "projection"], ["projected"]),  # (B, F, 1920)
        helper.make_node("Tanh", ["projected"], ["bounded"]),
        helper.make_node("Reshape", ["bounded", "audio_shape"], ["audio"]),  # (B, 1, F*1920)
        *length_nodes,
    ]
    consts = [
        _const("codebook_offsets", (np.arange(CODEC_QUANTIZERS) * CODEBOOK_SIZE).reshape(-1, 1, 1)),
        _const("embeddings", embeddings, np.float32),
        _const("codebook_ids", np.arange(CODEC_QUANTIZERS)),
        _const("mask_shape", [CODEC_QUANTIZERS, 1, 1, 1]),
        _const("axis0", [0]),
        _const("conv_weight", conv, np.float32),
        _const("projection", projection, np.float32),
        _const("audio_shape", [0, 1, -1]),
        *length_consts,
    ]
    graph = helper.make_graph(
        nodes,
        "moss_demo_decoder",
        [
            helper.make_tensor_value_info("audio_codes", TensorProto.INT64, [CODEC_QUANTIZERS, "batch", "frames"]),
            helper.make_tensor_value_info("n_quantizers", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1, "samples"]),
            helper.make_tensor_value_info("audio_lengths", TensorProto.INT64, ["batch"]),
        ],
        initializer=consts,
    )
    return _model(graph)
