"""``python -m moss_tts_node attach-heads``: a backbone GGUF that carries the audio heads (one per codebook).

``heads_backend: gguf`` runs the audio heads inside llama.cpp's graph, which is where they belong when the
layers run on a GPU (``auto`` picks it there): the heads then cost one GPU matrix product instead of a
0.27 GB read by the CPU every step. The published MOSS-TTS-GGUF files keep the heads as ``.npy`` beside the
GGUF, so this command appends them to the GGUF's output matrix, once, after the download or ``convert``.
The heads are quantized to the output matrix's own type, by ggml's own quantizer.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.errors import WeightsError
from moss_tts_node.llama.gguf import GGUF_AUDIO_HEADS_KEY, GGUF_TEXT_VOCAB_KEY, GgufHeadsInfo
from moss_tts_node.model.heads import read_heads
from moss_tts_node.model.layout import HEADS_DIR, heads_gguf_name
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.tools.prepare.conversion import check_disk_space


def attach_heads(
    weights_dir: Path, gguf_name: str | None = None, output_name: str | None = None, force: bool = False
) -> Path:
    """Write ``weights_dir/<output_name>``: the GGUF ``gguf_name`` with ``lm_heads/`` appended; return its path.

    Everything is checked first: the heads are there, the source is a plain backbone GGUF, the target does
    not exist (unless ``force``) and the disk has room for it.
    """
    weights_dir = Path(weights_dir)
    if not (weights_dir / HEADS_DIR).is_dir():
        raise WeightsError(
            f"{weights_dir / HEADS_DIR} not found: WEIGHTS_DIR must be a MOSS-TTS-GGUF weights directory "
            "(the download, or the output of convert)"
        )
    source = weights_dir / gguf_name if gguf_name else _only_plain_gguf(weights_dir)
    if not source.is_file():
        raise WeightsError(f"{source} not found; --gguf names a .gguf file in {weights_dir}")
    if GgufHeadsInfo(source).audio_heads is not None:
        raise WeightsError(f"{source} already carries the audio heads: set model.backbone_gguf to it as it is")
    target = weights_dir / (output_name or heads_gguf_name(source.name))
    if target.resolve() == source.resolve():
        raise WeightsError(f"--output {target.name} is the source GGUF itself: choose another name")
    if target.exists() and not force:
        raise WeightsError(f"{target} exists: pass --force to overwrite it, or --output another name")
    spec = ModelSpec.load(weights_dir)
    needed = source.stat().st_size + sum(f.stat().st_size for f in (weights_dir / HEADS_DIR).glob("*.npy"))
    check_disk_space(weights_dir, needed, target.name)
    append_audio_heads_to_gguf(source, weights_dir / HEADS_DIR, target, spec)
    return target


def _only_plain_gguf(weights_dir: Path) -> Path:
    candidates = sorted(p for p in weights_dir.glob("*.gguf") if GgufHeadsInfo(p).audio_heads is None)
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "none"
        raise WeightsError(
            f"{weights_dir} holds {len(candidates)} GGUF files without the audio heads ({found}): "
            "name the one to use with --gguf"
        )
    return candidates[0]


def append_audio_heads_to_gguf(source: Path, heads_dir: Path, target: Path, spec: ModelSpec | None = None) -> None:
    """Copy the backbone GGUF ``source`` to ``target`` with the n_vq audio heads appended to its output matrix.

    The heads are quantized to the output matrix's own type with ggml's quantizer; the token embedding
    table gets as many zero rows (llama.cpp wants both at the vocabulary size), which are never read (the
    loop feeds embeddings). ``moss_tts.audio_heads`` / ``moss_tts.text_vocab`` mark the file for ``auto``.
    Written to a temporary name and renamed.
    """
    import gguf

    spec = spec or ModelSpec()
    reader = gguf.GGUFReader(str(source))
    if GGUF_AUDIO_HEADS_KEY in reader.fields:
        raise WeightsError(f"{source} already carries the audio heads")
    arch = str(reader.fields["general.architecture"].contents())
    tensors = {t.name: t for t in reader.tensors}
    if "output.weight" not in tensors:
        raise WeightsError(f"{source} has no output.weight (tied embeddings): the heads have nothing to join")
    hidden = int(tensors["output.weight"].shape[0])
    text_vocab = int(tensors["output.weight"].shape[1])
    extra = spec.n_vq * spec.audio_rows

    writer = gguf.GGUFWriter(None, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        if key == f"{arch}.vocab_size":
            value = text_vocab + extra
        elif key == "tokenizer.ggml.tokens":
            value = list(value) + [f"<|moss_audio_{i // spec.audio_rows}_{i % spec.audio_rows}|>" for i in range(extra)]
        elif key == "tokenizer.ggml.token_type":
            value = list(value) + [int(gguf.TokenType.UNUSED)] * extra
        elif key == "tokenizer.ggml.scores":
            value = list(value) + [0.0] * extra
        writer.add_key_value(key, value, field.types[0], sub_type=sub_type)
    writer.add_uint32(GGUF_AUDIO_HEADS_KEY, spec.n_vq)
    writer.add_uint32(GGUF_TEXT_VOCAB_KEY, text_vocab)

    for tensor in reader.tensors:
        qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
        data = np.asarray(tensor.data)
        if tensor.name in ("output.weight", "token_embd.weight"):
            if tensor.name == "output.weight":
                heads = np.concatenate(list(read_heads(heads_dir, spec, hidden))).astype(np.float32)
            else:
                heads = np.zeros((extra, hidden), dtype=np.float32)
            data = np.concatenate([data, _quantize_rows(heads, qtype)])
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)

    target = Path(target)
    partial = target.with_name(f".{target.name}.partial")
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def _quantize_rows(rows: np.ndarray, qtype: Any) -> np.ndarray:
    """float32 (n, H) rows in GGML type ``qtype``, as GGUFReader hands such rows out (F32/F16 typed, the
    quantized types as (n, bytes per row) uint8),
    quantized by ggml itself (through llama-cpp-python's libggml-base), so the rows are bit-identical to
    what llama.cpp's quantizer would write."""
    import gguf

    from moss_tts_node.llama.bindings import load_ggml_base_library

    if qtype == gguf.GGMLQuantizationType.F32:  # GGUFReader hands these out typed, not as bytes
        return rows.astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return rows.astype(np.float16)
    ggml = load_ggml_base_library()
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n, hidden = rows.shape
    src = np.ascontiguousarray(rows, dtype=np.float32)
    out = np.empty((n, hidden // block * type_size), dtype=np.uint8)
    written = ggml.ggml_quantize_chunk(int(qtype), src.ctypes.data, out.ctypes.data, 0, n, hidden, None)
    if written != out.nbytes:
        raise WeightsError(f"ggml quantized {written} bytes, expected {out.nbytes}")
    return out


# ---- command line -----------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``attach-heads`` to the CLI (cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "attach-heads",
        help="append the audio heads to the backbone GGUF (heads_backend gguf: the heads on the GPU)",
        description="Write a copy of a weights directory's backbone GGUF whose output matrix carries the "
        "audio heads of lm_heads/, quantized like it, so that llama.cpp computes them (on the GPU when the "
        "layers are there).",
    )
    parser.add_argument("weights_dir", type=Path, metavar="WEIGHTS_DIR", help="MOSS-TTS-GGUF weights directory")
    parser.add_argument("--gguf", help="the backbone GGUF in WEIGHTS_DIR (default: the only one)")
    parser.add_argument("--output", help="name of the file to write (default: <gguf name>_audio_heads.gguf)")
    parser.add_argument("--force", action="store_true", help="overwrite the output file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = attach_heads(args.weights_dir, args.gguf, args.output, force=args.force)
    print(
        f"wrote {target} ({target.stat().st_size / 1e9:.2f} GB); in your params file set model.backbone_gguf: "
        f"{target.name} (heads_backend auto uses its heads when llama.cpp offloads layers to a GPU; gguf always)"
    )
    return 0
