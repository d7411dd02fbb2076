"""Write the streaming decoder graph of a MOSS-Audio-Tokenizer checkpoint (``config.json`` + safetensors).

The graph follows the contract in ``moss_tts_node.codec.stream_decoder``: codes of the new frames and
the attention caches in; their audio out, the caches written in place (present = past) and each stage's
write slots. It is the codec's decode path
(RLFQ codebook lookup, the causal Transformer stages, the patch reshapes) written op by op with the
``onnx`` helpers, from the checkpoint's own tensors; no PyTorch. docs/stream-decoder.md describes the
state and how each attention mode relates to the codec's offline and streaming decodes.

``stream_decoder_checkpoint`` reads the checkpoint and ``stream_decoder_layers`` holds the building
blocks; this module puts the decode path together, declares the graph's inputs and outputs, writes the
file and is the ``build-stream-decoder`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.layout import STREAM_DECODER_FILE
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS, checked_quantizers
from moss_tts_node.codec.stream_decoder import (
    ATTENTION_KEY,
    ATTENTION_MODES,
    AUDIO_OUTPUT,
    CODES_INPUT,
    FORMAT_KEY,
    FORMAT_VERSION,
    FRAMES_INPUT,
    FRAMES_OUTPUT,
    POSITIONS_KEY,
    SPANS_KEY,
    WHOLE_DECODE_FRAMES_PER_CALL,
    key_cache_name,
    present_key_name,
    present_value_name,
    value_cache_name,
    write_slots_name,
)
from moss_tts_node.errors import WeightsError
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import (
    CodecSpec,
    CodecWeights,
    Patch,
    TransformerStage,
    read_codec_config,
)
from moss_tts_node.tools.prepare.stream_decoder_layers import (
    CONTRIB_DOMAIN,
    OnnxGraph,
    WeightPrecision,
    check_stage,
    quantizer_decode,
    stage_clock,
    transformer_stage,
    unpatch,
)

OPSET = 20  # Gelu is a standard op from 20 on
IR_VERSION = 9  # the oldest IR that carries opset 20, so older ONNX Runtimes load the graph too
# The graphs --precision names: every weight float32, or some weight MatMuls 8-bit (MatMulNBits), chosen
# from each group's cost in fidelity as measured on untrained weights: to be measured again on a trained
# codec (docs/stream-decoder.md, "Precision").
_ATTENTION_WEIGHTS = re.compile(r"decoder\.\d+\.transformer\.layers\.\d+\.self_attn\.(in_proj|out_proj)")
PRECISIONS: dict[str, WeightPrecision | None] = {
    "fp32": None,
    "w8-attention": WeightPrecision(lambda name: _ATTENTION_WEIGHTS.fullmatch(name) is not None),
    "w8": WeightPrecision(lambda name: True),
}
# Protobuf cannot hold a model over 2 GiB; above this the weights go to a side file.
_EXTERNAL_DATA_BYTES = 1_800_000_000


def build_stream_decoder(
    checkpoint_dir: Path | str,
    out_path: Path | str,
    *,
    precision: str = "fp32",
    attention: str = "window",
    quantizers: int = CODEC_QUANTIZERS,
) -> Path:
    """Write the stream decoder graph of the checkpoint in ``checkpoint_dir`` to ``out_path``; return it.

    ``precision``: a name of PRECISIONS (float32, or which weight MatMuls are 8-bit). ``attention``:
    "window" (each new position sees exactly what the offline decode shows it) or "ring" (reproduces the
    codec's own streaming). ``quantizers``: how many of the codec's codebooks the codes hold (the first
    ones; the 16-codebook models of the family decode 16). Weights go to ``<out_path>.data`` when the graph
    would pass protobuf's 2 GiB limit. Raises WeightsError for a missing, inconsistent or unsupported
    checkpoint.
    """
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    checked_quantizers(quantizers)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_graph(Path(checkpoint_dir), out_path, attention, PRECISIONS[precision], quantizers)
    return out_path


def write_graph(
    checkpoint_dir: Path,
    out_path: Path,
    attention: str,
    weights: WeightPrecision | None,
    quantizers: int = CODEC_QUANTIZERS,
) -> None:
    """Write the graph of the checkpoint in ``checkpoint_dir``, float32 but for the 8-bit weights that
    ``weights`` picks (``tools/dev/stream_decoder_precision.py`` measures any such choice)."""
    import onnx
    from onnx import helper

    spec = read_codec_config(checkpoint_dir / "config.json")
    stages = [module for module in spec.decoder if isinstance(module, TransformerStage)]
    for stage in stages:
        check_stage(stage)
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    weight_bytes = 4 * sum(  # the graph is float32 whatever the checkpoint stores
        int(np.prod(info.shape))
        for name, info in checkpoint.tensors.items()
        if name.startswith(("decoder.", "quantizer."))
    )
    external = weight_bytes > _EXTERNAL_DATA_BYTES
    data_name = f"{out_path.name}.data"
    data_path = out_path.with_name(data_name)
    try:
        with contextlib.ExitStack() as stack:
            data_file = stack.enter_context(data_path.open("wb")) if external else None
            graph = OnnxGraph(data_file, data_name, weights)
            inputs, outputs = _decode_path(graph, CodecWeights(checkpoint), spec, attention, quantizers)
    except BaseException:
        if external:
            data_path.unlink(missing_ok=True)  # gigabytes of weights for a graph that will not exist
        raise
    body = helper.make_graph(graph.nodes, "moss_stream_decoder", inputs, outputs, graph.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB_DOMAIN, 1)]
    model = helper.make_model(body, opset_imports=opsets, producer_name=__name__)
    model.ir_version = IR_VERSION
    positions = _positions_per_frame(spec)
    properties = {
        FORMAT_KEY: FORMAT_VERSION,
        ATTENTION_KEY: attention,
        SPANS_KEY: ",".join(str(stage.context) for stage in stages),
        POSITIONS_KEY: ",".join(map(str, positions)),
    }
    helper.set_model_props(model, properties)
    onnx.save_model(model, out_path)
    onnx.checker.check_model(str(out_path))  # by path, so that external data and > 2 GiB models are checked too


def _positions_per_frame(spec: CodecSpec) -> list[int]:
    """Each Transformer stage's positions per frame: the product of the patch sizes before it."""
    per_frame, positions = [], 1
    for module in spec.decoder:
        if isinstance(module, Patch):
            positions *= module.size
        else:
            per_frame.append(positions)
    return per_frame


def _frames_per_call(spec: CodecSpec, attention: str) -> int:
    """The most frames a call holds, which sizes the caches' rows after the ring.

    Window graphs: WHOLE_DECODE_FRAMES_PER_CALL (the runtime cuts longer decodes into calls of that many,
    which changes nothing in the output). Ring graphs: the codec's own limit, since a ring decode depends
    on how it is cut: a chunk longer than a stage's span overwrites keys it still needs, so the codec's
    streaming chunks may not exceed the attention duration.
    """
    if attention == "window":
        return WHOLE_DECODE_FRAMES_PER_CALL
    stages = [module for module in spec.decoder if isinstance(module, TransformerStage)]
    return min(stage.context // per_frame for stage, per_frame in zip(stages, _positions_per_frame(spec), strict=True))


def _decode_path(
    graph: OnnxGraph, weights: CodecWeights, spec: CodecSpec, attention: str, quantizers: int
) -> tuple[list[Any], list[Any]]:
    """Add the whole decode to ``graph``; return the graph's input and output declarations."""
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info(CODES_INPUT, TensorProto.INT64, (quantizers, 1, "frames")),
        helper.make_tensor_value_info(FRAMES_INPUT, TensorProto.INT64, ()),
    ]
    outputs = [
        helper.make_tensor_value_info(AUDIO_OUTPUT, TensorProto.FLOAT, (1, 1, "samples")),
        helper.make_tensor_value_info(FRAMES_OUTPUT, TensorProto.INT64, ()),
    ]
    frames = graph.op("Squeeze", graph.op("Shape", CODES_INPUT, start=2, end=3), graph.constant("axis", [0]))
    x, channels = quantizer_decode(graph, weights, spec, quantizers), spec.quantizer_output_dim
    call_frames = _frames_per_call(spec, attention)
    positions_per_frame = 1
    stage = 0
    for module in spec.decoder:
        if isinstance(module, Patch):
            channels //= module.size
            x = unpatch(graph, x, channels, module.size)
            positions_per_frame *= module.size
            continue
        rows = module.context + call_frames * positions_per_frame  # the ring, then a call's positions
        clock = stage_clock(graph, module, stage, frames, positions_per_frame, attention, rows)
        x = transformer_stage(graph, weights, module, stage, clock, x)
        channels = module.output_dim
        cache = (1, module.heads, rows, module.head_dim)
        for layer in range(module.layers):
            for name in (key_cache_name, value_cache_name):
                inputs.append(helper.make_tensor_value_info(name(stage, layer), TensorProto.FLOAT, cache))
            for name in (present_key_name, present_value_name):
                outputs.append(helper.make_tensor_value_info(name(stage, layer), TensorProto.FLOAT, cache))
        outputs.append(helper.make_tensor_value_info(write_slots_name(stage), TensorProto.INT64, (f"rows_{stage}",)))
        stage += 1
    graph.op("Reshape", x, graph.constant("audio_shape", [1, 1, -1]), out=AUDIO_OUTPUT)
    graph.op("Add", FRAMES_INPUT, frames, out=FRAMES_OUTPUT)
    return inputs, outputs


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``build-stream-decoder`` to the CLI (cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "build-stream-decoder",
        help="build the stateful streaming decoder graph from the codec checkpoint",
        description=(
            "Write the codec's streaming decoder (attention state kept between calls, so each chunk decodes "
            "only its new frames) from the MOSS-Audio-Tokenizer checkpoint: config.json + model.safetensors."
        ),
    )
    parser.add_argument("checkpoint", type=Path, help="codec checkpoint directory (config.json, model.safetensors)")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help=f"graph to write; put it in the config's model.codec_dir as {STREAM_DECODER_FILE} to have it used",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32: the offline decode (default); the others make some weights 8-bit: faster on a CPU, less "
        'exact (docs/stream-decoder.md, "Precision", has the figures)',
    )
    parser.add_argument(
        "--attention",
        choices=ATTENTION_MODES,
        default=ATTENTION_MODES[0],
        help="window: equals the offline decode (default); ring: reproduces the codec's own streaming",
    )
    parser.add_argument(
        "--quantizers",
        type=int,
        default=CODEC_QUANTIZERS,
        help=f"codebooks the codes hold, the first ones: {CODEC_QUANTIZERS} (default) or 16 for the 16-codebook models "
        "of the family",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        raise WeightsError(f"{args.out} exists; pass --force to overwrite it")
    path = build_stream_decoder(
        args.checkpoint, args.out, precision=args.precision, attention=args.attention, quantizers=args.quantizers
    )
    print(f"wrote {path} ({args.precision}, {args.attention} attention, {args.quantizers} quantizers)")
    return 0
