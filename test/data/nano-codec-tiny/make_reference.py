"""Make this directory: a tiny random MOSS-Audio-Tokenizer-Nano, its graphs in the published ONNX layout, and
PyTorch's outputs for the tests to hold ONNX Runtime to.

Run with a torch environment, given the directory of upstream's codec code (``modeling_moss_audio_tokenizer.py``
and ``configuration_moss_audio_tokenizer.py``, the Nano-capable version with ``number_channels``)::

    python test/data/nano-codec-tiny/make_reference.py /path/to/upstream/codec/code

Never imported by the tests: it needs torch, which the package does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 20261206
SAMPLE_RATE = 48000
SAMPLES_PER_FRAME = 3840
CHANNELS = 2
QUANTIZERS = 16
CODEBOOK_SIZE = 1024
OPSET = 17
# Seconds each Transformer attends back. Upstream's real codec attends for seconds; a third of a second
# (4 frames) keeps the stream graph's caches small and makes the fixture's 8 frames slide past every window.
CONTEXT_SECONDS = 0.32
# Frames of audio encoded, frames of codes decoded, and how the stream decode cuts the latter.
ENCODE_FRAMES = 4
DECODE_FRAMES = 8
STREAM_CHUNKS = (1, 2, 3, 2)

META_FILE = "codec_browser_onnx_meta.json"
FILES = {
    "encode": "moss_audio_tokenizer_encode.onnx",
    "decode_full": "moss_audio_tokenizer_decode_full.onnx",
    "decode_step": "moss_audio_tokenizer_decode_step.onnx",
}


def _transformer(input_dimension: int, output_dimension: int) -> dict[str, Any]:
    """One Transformer stage as upstream's config writes it, at a tiny width (1 layer, d_model 16, 2 heads)."""
    return {
        "module_type": "Transformer",
        "input_dimension": input_dimension,
        "output_dimension": output_dimension,
        "d_model": 16,
        "num_heads": 2,
        "num_layers": 1,
        "dim_feedforward": 32,
        "causal": True,
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "max_period": 10000,
        "gating": "none",
        "layer_scale": 0.01,
        "conv_layout": True,
    }


def _patch(size: int) -> dict[str, Any]:
    return {"module_type": "PatchedPretransform", "patch_size": size}


def tiny_config() -> dict[str, Any]:
    """The real Nano's layout (patch sizes 240, 2, 2, 2, 4 over the interleaved stereo signal, so 3840 samples a
    channel per frame; 16 quantizers of 1024) with every width between the patches shrunk."""
    code_dim = 64
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "model_type": "moss-audio-tokenizer",
        "sampling_rate": SAMPLE_RATE,
        "downsample_rate": SAMPLES_PER_FRAME,
        "number_channels": CHANNELS,
        "enable_channel_interleave": True,
        "attention_implementation": "sdpa",
        "compute_dtype": "fp32",
        "causal_transformer_context_duration": CONTEXT_SECONDS,
        "code_dim": code_dim,
        "encoder_kwargs": [
            _patch(240),
            _transformer(240, 16),
            _patch(2),
            _transformer(32, 16),
            _patch(2),
            _transformer(32, 16),
            _patch(2),
            _transformer(32, 16),
            _patch(4),
        ],
        "decoder_kwargs": [
            _patch(4),
            _transformer(16, 32),
            _patch(2),
            _transformer(16, 32),
            _patch(2),
            _transformer(16, 32),
            _patch(2),
            _transformer(16, 240),
            _patch(240),
        ],
        "quantizer_type": "rlfq",
        "quantizer_kwargs": {
            "quantizer_type": "rlfq",
            "input_dim": code_dim,
            "rvq_dim": 32,
            "output_dim": code_dim,
            "num_quantizers": QUANTIZERS,
            "codebook_size": CODEBOOK_SIZE,
            "codebook_dim": 4,
        },
    }


def test_waveform(rng: np.random.Generator) -> np.ndarray:
    """(n, 2) float32: a different chord and noise in each channel, so a swap of the channels shows."""
    t = np.arange(ENCODE_FRAMES * SAMPLES_PER_FRAME) / SAMPLE_RATE
    left = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1375 * t)
    right = 0.25 * np.sin(2 * np.pi * 330 * t + 0.5) + 0.15 * np.sign(np.sin(2 * np.pi * 97 * t))
    noise = 0.02 * rng.standard_normal((t.size, 2))
    return (np.stack([left, right], axis=1) + noise).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream", type=Path, help="directory holding upstream's modeling_moss_audio_tokenizer.py")
    args = parser.parse_args()
    sys.path.insert(0, str(args.upstream.resolve()))

    import torch
    from configuration_moss_audio_tokenizer import MossAudioTokenizerConfig
    from modeling_moss_audio_tokenizer import MossAudioTokenizerModel
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    config = MossAudioTokenizerConfig(**tiny_config())
    model = MossAudioTokenizerModel(config).eval()  # initialized as upstream's post_init initializes a new model

    # The checkpoint, in upstream's names (the model's own state dict: weight norm as parametrizations.*).
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(HERE / "model.safetensors"), metadata={"format": "pt"})
    (HERE / "config.json").write_text(json.dumps(tiny_config(), indent=2) + "\n", encoding="utf-8")

    rng = np.random.default_rng(SEED)
    waveform = test_waveform(rng)
    decode_codes = rng.integers(0, CODEBOOK_SIZE, size=(DECODE_FRAMES, QUANTIZERS), dtype=np.int64)
    with torch.no_grad():
        encoded = model._encode_frame(torch.from_numpy(waveform.T.copy())[None])
        codes = encoded.audio_codes[:, 0, :].T.numpy().astype(np.int64)
        torch_codes = torch.from_numpy(decode_codes.T.copy())[:, None, :]
        decoded = model._decode_frame(torch_codes).audio[0].T.numpy()
        # Upstream's own streaming decode: the model's streaming state carried from chunk to chunk.
        pieces = []
        with model.streaming(batch_size=1):
            start = 0
            for size in STREAM_CHUNKS:
                pieces.append(model._decode_frame(torch_codes[:, :, start : start + size]).audio[0].T.numpy())
                start += size
        streamed = np.concatenate(pieces)

    specs = export(model, torch)
    np.savez_compressed(
        HERE / "reference.npz",
        waveform=waveform,
        codes=codes,
        decode_codes=decode_codes,
        decoded=decoded.astype(np.float32),
        stream_chunks=np.array(STREAM_CHUNKS, dtype=np.int64),
        streamed=streamed.astype(np.float32),
    )
    write_meta(*specs)
    print(f"codes {codes.shape}, decoded {decoded.shape}, stream vs whole {np.abs(streamed - decoded).max():.3g}")


def _decoder_attention(model: Any) -> tuple[list[Any], list[Any]]:
    """The decoder's Transformers and their attention modules, in execution order: the order of the state lists."""
    from modeling_moss_audio_tokenizer import MossAudioTokenizerMultiheadAttention, MossAudioTokenizerTransformer

    modules = [m for stage in model.decoder for m in stage.modules()]
    transformers = [m for m in modules if isinstance(m, MossAudioTokenizerTransformer)]
    return transformers, [m for m in modules if isinstance(m, MossAudioTokenizerMultiheadAttention)]


def export(model: Any, torch: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str], list[str]]:
    """Write the three graphs; returns the stream state's specs (the meta's two lists) and the step graph's
    input and output names."""
    from modeling_moss_audio_tokenizer import MHAState, TransformerState

    class Encode(torch.nn.Module):
        """(1, C, T) float32 and its length -> (1, F, nq) int32 codes and F. The end is zero-padded to whole
        frames inside the graph, as upstream's encoder pads it."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, waveform: Any, input_lengths: Any) -> tuple[Any, Any]:
            missing = (SAMPLES_PER_FRAME - waveform.shape[-1] % SAMPLES_PER_FRAME) % SAMPLES_PER_FRAME
            pad = torch.zeros(waveform.shape[0], waveform.shape[1], missing, dtype=waveform.dtype)
            out = self.model._encode_frame(torch.cat([waveform, pad], dim=-1), input_lengths.long())
            return out.audio_codes.permute(1, 2, 0).int(), out.audio_codes_lengths.int()

    class DecodeFull(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, audio_codes: Any, audio_code_lengths: Any) -> tuple[Any, Any]:
            out = self.model._decode_frame(audio_codes.permute(2, 0, 1).long(), audio_code_lengths.long())
            return out.audio, out.audio_lengths.int()

    transformers, attentions = _decoder_attention(model)

    class DecodeStep(torch.nn.Module):
        """DecodeFull on the streaming state the inputs carry: each Transformer's offset, and each attention's
        offset, cached keys and values (the last ``context`` positions) and their positions (-1: empty)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, audio_codes: Any, audio_code_lengths: Any, *state: Any) -> tuple[Any, ...]:
            offsets, caches = state[: len(transformers)], state[len(transformers) :]
            for module, offset in zip(transformers, offsets, strict=True):
                module._streaming_state = TransformerState(1, torch.device("cpu"), offsets=offset.long().clone())
            for i, module in enumerate(attentions):
                offset, keys, values, positions = caches[4 * i : 4 * i + 4]
                module._streaming_state = MHAState(
                    1,
                    torch.device("cpu"),
                    cached_keys=keys.clone(),
                    cached_values=values.clone(),
                    cached_positions=positions.long().clone(),
                    offset=offset.long().clone(),
                )
            try:
                out = self.model._decode_frame(audio_codes.permute(2, 0, 1).long(), audio_code_lengths.long())
                result = [out.audio, out.audio_lengths.int()]
                result += [m._streaming_state.offsets.int() for m in transformers]
                for m in attentions:
                    s = m._streaming_state
                    result += [s.offset.int(), s.cached_keys, s.cached_values, s.cached_positions.int()]
            finally:
                for module in (*transformers, *attentions):
                    module._streaming_state = None
            return tuple(result)

    codes = torch.randint(0, CODEBOOK_SIZE, (1, 3, QUANTIZERS), dtype=torch.int32)
    lengths = torch.tensor([3], dtype=torch.int32)
    waveform = torch.zeros(1, CHANNELS, 3 * SAMPLES_PER_FRAME)
    export_graph(
        torch,
        Encode(),
        (waveform, torch.tensor([waveform.shape[-1]], dtype=torch.int32)),
        "encode",
        ["waveform", "input_lengths"],
        ["audio_codes", "audio_code_lengths"],
        {"waveform": {2: "samples"}, "audio_codes": {1: "frames"}},
    )
    export_graph(
        torch,
        DecodeFull(),
        (codes, lengths),
        "decode_full",
        ["audio_codes", "audio_code_lengths"],
        ["audio", "audio_lengths"],
        {"audio_codes": {1: "frames"}, "audio": {2: "samples"}},
    )

    offset_specs = [
        {
            "index": i,
            "input_name": f"transformer_offset_{i}",
            "output_name": f"transformer_offset_out_{i}",
            "shape": [1],
            "dtype": "int32",
        }
        for i in range(len(transformers))
    ]
    cache_specs = []
    for i, m in enumerate(attentions):
        head_dim = m.embed_dim // m.num_heads
        cache_specs.append(
            {
                "index": i,
                "context": m.context,
                "num_heads": m.num_heads,
                "head_dim": head_dim,
                "offset_input_name": f"attn_offset_{i}",
                "offset_output_name": f"attn_offset_out_{i}",
                "cached_keys_input_name": f"attn_cached_keys_{i}",
                "cached_keys_output_name": f"attn_cached_keys_out_{i}",
                "cached_values_input_name": f"attn_cached_values_{i}",
                "cached_values_output_name": f"attn_cached_values_out_{i}",
                "cached_positions_input_name": f"attn_cached_positions_{i}",
                "cached_positions_output_name": f"attn_cached_positions_out_{i}",
                "offset_shape": [1],
                "cache_shape": [1, m.num_heads, m.context, head_dim],
                "positions_shape": [1, m.context],
                "cache_dtype": "float32",
            }
        )
    state = [torch.zeros(1, dtype=torch.int32) for _ in offset_specs]
    in_names, out_names = ["audio_codes", "audio_code_lengths"], ["audio", "audio_lengths"]
    in_names += [s["input_name"] for s in offset_specs]
    out_names += [s["output_name"] for s in offset_specs]
    for s in cache_specs:
        state += [
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(*s["cache_shape"]),
            torch.zeros(*s["cache_shape"]),
            torch.full(s["positions_shape"], -1, dtype=torch.int32),
        ]
        for kind in ("offset", "cached_keys", "cached_values", "cached_positions"):
            in_names.append(s[f"{kind}_input_name"])
            out_names.append(s[f"{kind}_output_name"])
    export_graph(
        torch,
        DecodeStep(),
        (codes, lengths, *state),
        "decode_step",
        in_names,
        out_names,
        {"audio_codes": {1: "frames"}, "audio": {2: "samples"}},
    )
    return offset_specs, cache_specs, in_names, out_names


def export_graph(
    torch: Any,
    module: Any,
    inputs: tuple[Any, ...],
    role: str,
    in_names: list[str],
    out_names: list[str],
    dynamic: dict[str, dict[int, str]],
) -> None:
    torch.onnx.export(
        module,
        inputs,
        str(HERE / FILES[role]),
        input_names=in_names,
        output_names=out_names,
        dynamic_axes=dynamic,
        opset_version=OPSET,
        dynamo=False,
    )


def write_meta(
    offset_specs: list[dict[str, Any]], cache_specs: list[dict[str, Any]], step_in: list[str], step_out: list[str]
) -> None:
    """The meta file in the published schema: the fields upstream's runtimes read, named as published."""
    meta = {
        "format": "moss_audio_tokenizer_browser_onnx",
        "files": dict(FILES),
        "codec_config": {
            "sample_rate": SAMPLE_RATE,
            "channels": CHANNELS,
            "downsample_rate": SAMPLES_PER_FRAME,
            "num_quantizers": QUANTIZERS,
            "codebook_size": CODEBOOK_SIZE,
        },
        "onnx": {
            "opset": OPSET,
            "encode_input_names": ["waveform", "input_lengths"],
            "encode_output_names": ["audio_codes", "audio_code_lengths"],
            "decode_input_names": ["audio_codes", "audio_code_lengths"],
            "decode_output_names": ["audio", "audio_lengths"],
            "decode_step_input_names": step_in,
            "decode_step_output_names": step_out,
        },
        "streaming_decode": {"batch_size": 1, "transformer_offsets": offset_specs, "attention_caches": cache_specs},
    }
    (HERE / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
