"""``convert`` for MOSS-TTS-Nano: upstream's Hugging Face checkpoint into a weights directory (docs/nano.md,
"Converting").

The checkpoint (``config.json`` with ``model_type`` ``moss_tts_nano``, ``model.safetensors``, SentencePiece's
``tokenizer.model``) becomes:

- ``MOSS_TTS_NANO_<TYPE>.gguf``: the global transformer (``transformer.*``) as a llama.cpp CodeShell model, and
  ``MOSS_TTS_NANO_<TYPE>.local.gguf`` beside it: the local one (``local_transformer.*``), the same way
  (``codeshell_gguf.py`` says why CodeShell and what is rearranged);
- ``embeddings/``: the text table (``transformer.wte``, also the text head: upstream ties them) and one table per
  codebook (``audio_embeddings.k``, also audio head k), float16, each codebook's with a zero row for the pad code
  (upstream leaves the pad out of the sum, which a zero row does);
- ``tokenizer/``: ``tokenizer.json`` converted from ``tokenizer.model`` (``sentencepiece_model.py``), and the
  model file itself;
- ``config.json``: upstream's, with the spec's keys and the identity record (``model/identity.py``);
- ``voices/``, where asked (``builtin_voices``): upstream's built-in voices, as the ONNX release's
  ``browser_poc_manifest.json`` lists them (a name and a clip's codes each), one ``<name>.npy`` of (T, 16) codes
  each, for ``voices.directories``.

Everything is checked before the first byte is written, as for the Delay models (``convert.py``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.family import MOSS_TTS_NANO
from moss_tts_node.model.identity import RECORD_KEY, ModelIdentity
from moss_tts_node.model.layout import (
    CONFIG_FILE,
    EMBEDDINGS_DIR,
    TEXT_EMBEDDING_FILE,
    TOKENIZER_DIR,
    TOKENIZER_FILE,
    audio_embedding_file,
    nano_gguf_name,
    nano_local_gguf_name,
)
from moss_tts_node.model.spec import NANO_MODEL_TYPE, ModelSpec
from moss_tts_node.tools.prepare.codeshell_gguf import (
    NanoTransformerShape,
    nano_tensor_shapes,
    write_nano_transformer_gguf,
)
from moss_tts_node.tools.prepare.config_reader import ConfigReader, read_json_object
from moss_tts_node.tools.prepare.conversion import (
    GGUF_METADATA_BYTES,
    GGUF_TYPES,
    ConversionError,
    ConversionProgress,
    check_disk_space,
    check_output_dir,
    check_row_multiples,
    check_tensor_shapes,
    gb,
    remove_leftovers,
    write_gguf,
)
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint
from moss_tts_node.tools.prepare.sentencepiece_model import tokenizer_from_sentencepiece

GLOBAL_PREFIX = "transformer."
LOCAL_PREFIX = "local_transformer."
TEXT_TABLE = "transformer.wte.weight"
SENTENCEPIECE_FILE = "tokenizer.model"
# Tensors upstream's loader skips (MossTTSNanoForCausalLM._keys_to_ignore_on_load_unexpected), and the tied
# heads that a save without tying writes: each must equal the table it is tied to.
IGNORED = ("local_transformer.wte.weight",)
VOICES_DIR = "voices"
MANIFEST_FILE = "browser_poc_manifest.json"  # the ONNX release's, which lists the built-in voices
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TEXT_HEAD = "text_lm_head.weight"


def audio_table(codebook: int) -> str:
    return f"audio_embeddings.{codebook}.weight"


def audio_head(codebook: int) -> str:
    return f"audio_lm_heads.{codebook}.weight"


@dataclass(frozen=True)
class NanoCheckpointConfig:
    """What Nano's ``config.json`` says: both transformers' shapes and the vocabulary facts."""

    raw: dict[str, Any]
    global_shape: NanoTransformerShape
    local_shape: NanoTransformerShape
    spec: ModelSpec


def read_nano_config(checkpoint_dir: Path) -> NanoCheckpointConfig:
    """Parse and check Nano's ``config.json`` (its transformer settings under ``gpt2_config``)."""
    path = Path(checkpoint_dir) / CONFIG_FILE
    raw = read_json_object(path, ConversionError, "point at the MOSS-TTS-Nano checkpoint directory")
    if raw.get("model_type") != NANO_MODEL_TYPE:
        raise ConversionError(f"{path}: model_type is {raw.get('model_type')!r}, not {NANO_MODEL_TYPE!r}")
    reader = ConfigReader(path, ConversionError)
    where = "gpt2_config"
    gpt2 = reader.mapping(raw, where, "")
    settings = {
        "activation_function": ("gelu_new", "a GELU other than gelu_new"),
        "position_embedding_type": ("rope", "positions other than rope"),
    }
    for key, (expected, what) in settings.items():
        if gpt2.get(key, expected) != expected:
            raise reader.fail(f"{where}.{key}", f"is {gpt2[key]!r}: asks for {what}, which the CodeShell GGUF lacks")
    hidden = reader.integer(gpt2, "n_embd", where)
    try:
        global_shape = NanoTransformerShape(
            hidden=hidden,
            layers=reader.integer(gpt2, "n_layer", where),
            heads=reader.integer(gpt2, "n_head", where),
            ffn=reader.integer(gpt2, "n_inner", where, 4 * hidden),
            layer_norm_eps=float(reader.number(gpt2, "layer_norm_epsilon", where, 1e-5)),
            rope_base=float(reader.number(gpt2, "rope_base", where, 10000.0)),
            context_length=reader.integer(gpt2, "n_positions", where, 4096),
        )
        local_layers = reader.integer(raw, "local_transformer_layers", "", 1)
        local_shape = dataclasses.replace(global_shape, layers=local_layers)
    except ValueError as exc:
        raise reader.fail(where, str(exc)) from exc
    try:
        spec = ModelSpec.load(Path(checkpoint_dir))
    except WeightsError as exc:
        raise ConversionError(str(exc)) from None
    return NanoCheckpointConfig(raw, global_shape, local_shape, spec)


def expected_nano_tensors(config: NanoCheckpointConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor Nano's checkpoint holds (the ignored and tied ones aside), with its shape."""
    hidden, spec = config.global_shape.hidden, config.spec
    shapes = {GLOBAL_PREFIX + name: dims for name, dims in nano_tensor_shapes(config.global_shape).items()}
    shapes.update({LOCAL_PREFIX + name: dims for name, dims in nano_tensor_shapes(config.local_shape).items()})
    shapes[TEXT_TABLE] = (spec.text_vocab_size, hidden)
    shapes.update({audio_table(k): (spec.audio_vocab_size, hidden) for k in range(spec.n_vq)})
    return shapes


def tied_heads(spec: ModelSpec) -> dict[str, str]:
    """Head tensor -> the table upstream ties it to."""
    return {TEXT_HEAD: TEXT_TABLE, **{audio_head(k): audio_table(k) for k in range(spec.n_vq)}}


def check_nano_tensors(checkpoint: SafetensorsCheckpoint, config: NanoCheckpointConfig) -> None:
    expected = expected_nano_tensors(config)
    tied = tied_heads(config.spec)
    present = {name: dims for name, dims in checkpoint.shapes.items() if name not in IGNORED and name not in tied}
    check_tensor_shapes(checkpoint.directory, present, expected, "MOSS-TTS-Nano")
    for head, table in tied.items():
        if head in checkpoint.tensors and not np.array_equal(checkpoint.read(head), checkpoint.read(table)):
            raise ConversionError(
                f"{checkpoint.directory}: {head} differs from {table}, but MOSS-TTS-Nano ties them: this is not a "
                "checkpoint upstream's code would load as it is"
            )


def convert_nano_checkpoint(
    checkpoint_dir: Path | str,
    out_dir: Path | str,
    gguf_type: str = "Q8_0",
    *,
    force: bool = False,
    n_threads: int = 0,
    progress_stream: TextIO | None = None,
    builtin_voices: Path | None = None,
) -> Path:
    """Convert Nano's checkpoint into ``out_dir``; returns the global transformer's GGUF (the config's
    ``backbone_gguf``). ``builtin_voices``: the ONNX release's manifest (or its directory), whose voices are
    written to ``voices/``. See the module docstring."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if gguf_type not in GGUF_TYPES:
        raise ConversionError(f"unknown output type {gguf_type!r}: choose one of {', '.join(GGUF_TYPES)}")
    config = read_nano_config(checkpoint_dir)
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    check_nano_tensors(checkpoint, config)
    shape, spec = config.global_shape, config.spec
    check_row_multiples({"n_embd": shape.hidden, "n_inner": shape.ffn}, gguf_type)
    sentencepiece = checkpoint_dir / SENTENCEPIECE_FILE
    if not sentencepiece.is_file():
        raise ConversionError(
            f"no {SENTENCEPIECE_FILE} in {checkpoint_dir}: copy the model's tokenizer file next to it"
        )
    try:
        tokenizer = tokenizer_from_sentencepiece(sentencepiece)
    except WeightsError as exc:
        raise ConversionError(str(exc)) from None
    for field, token_id in spec.special_token_ids.items():
        if token_id >= spec.text_vocab_size or tokenizer.id_to_token(token_id) is None:
            raise ConversionError(
                f"{field} {token_id} (config.json) is not a token of {sentencepiece} with an embedding row "
                f"(vocab {spec.text_vocab_size}): the config and the tokenizer belong to different models"
            )
    voices = read_builtin_voices(builtin_voices, spec) if builtin_voices is not None else {}
    check_output_dir(out_dir, checkpoint_dir, force)
    remove_leftovers(out_dir)
    transformers = {GLOBAL_PREFIX: shape, LOCAL_PREFIX: config.local_shape}
    gguf_bytes = {prefix: _gguf_bytes(part, gguf_type) for prefix, part in transformers.items()}
    tables_bytes = 2 * shape.hidden * (spec.text_vocab_size + spec.n_vq * spec.audio_rows)
    quantized = GGUF_TYPES[gguf_type].ftype is not None
    peak = sum(gguf_bytes.values()) + tables_bytes + (_gguf_bytes(shape, "F16") if quantized else 0)
    check_disk_space(out_dir, peak, "the conversion (the output plus, when quantizing, an F16 intermediate)")

    progress = ConversionProgress(checkpoint.nbytes, progress_stream)
    progress.message(
        f"converting {checkpoint_dir} (MOSS-TTS-Nano, {gb(checkpoint.nbytes)}) into {out_dir} as {gguf_type}"
    )
    for sub in (EMBEDDINGS_DIR, TOKENIZER_DIR):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    gguf_path = out_dir / nano_gguf_name(gguf_type)
    paths = {GLOBAL_PREFIX: gguf_path, LOCAL_PREFIX: out_dir / nano_local_gguf_name(gguf_path.name)}
    for prefix, part in transformers.items():
        write_gguf(
            paths[prefix],
            gguf_type,
            lambda path, dtype, prefix=prefix, part=part: _write_transformer(checkpoint, prefix, part, path, dtype),
            gguf_bytes[prefix],
            progress,
            n_threads,
        )
        progress.advance(sum(info.nbytes for n, info in checkpoint.tensors.items() if n.startswith(prefix)), prefix)
    np.save(out_dir / EMBEDDINGS_DIR / TEXT_EMBEDDING_FILE, checkpoint.read(TEXT_TABLE, np.float16))
    for k in range(spec.n_vq):
        table = np.zeros((spec.audio_rows, shape.hidden), dtype=np.float16)  # the last row: the pad code
        table[: spec.audio_vocab_size] = checkpoint.read(audio_table(k), np.float16)
        np.save(out_dir / EMBEDDINGS_DIR / audio_embedding_file(k), table)
    tokenizer.save(str(out_dir / TOKENIZER_DIR / TOKENIZER_FILE))
    shutil.copyfile(sentencepiece, out_dir / TOKENIZER_DIR / SENTENCEPIECE_FILE)
    if voices:
        (out_dir / VOICES_DIR).mkdir(exist_ok=True)
        for name, codes in voices.items():
            np.save(out_dir / VOICES_DIR / f"{name}.npy", codes)
        progress.message(f"wrote {len(voices)} built-in voices to {out_dir / VOICES_DIR}: {', '.join(voices)}")
    identity = ModelIdentity(MOSS_TTS_NANO, evidence="its model_type")
    merged = {**config.raw, **spec.to_json(), RECORD_KEY: identity.to_record(spec.n_vq)}
    (out_dir / CONFIG_FILE).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    progress.message(f"done in {progress.elapsed():.1f} s: {gguf_path} ({gb(gguf_path.stat().st_size)})")
    return gguf_path


def read_builtin_voices(source: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """The built-in voices of the ONNX release's manifest (``source``: the file or its directory), by name, as
    (T, n_vq) int64 codes; ConversionError naming what is wrong with one."""
    path = Path(source) / MANIFEST_FILE if Path(source).is_dir() else Path(source)
    manifest = read_json_object(path, ConversionError, f"give the ONNX release's {MANIFEST_FILE} or its directory")
    entries = manifest.get("builtin_voices")
    if not isinstance(entries, list) or not entries:
        raise ConversionError(f"{path}: has no builtin_voices list: not MOSS-TTS-Nano-100M-ONNX's manifest")
    voices: dict[str, np.ndarray] = {}
    for number, entry in enumerate(entries):
        name = entry.get("voice") if isinstance(entry, dict) else None
        where = f"{path}: builtin_voices[{number}]"
        if not isinstance(name, str) or not _VOICE_NAME.fullmatch(name) or name in voices:
            raise ConversionError(
                f"{where}: voice {name!r} is not a name this converter writes as a file (letters, digits, '_', '-' "
                "and '.', 64 at most, no two alike)"
            )
        try:
            codes = np.asarray(entry.get("prompt_audio_codes"), dtype=np.int64)
        except (TypeError, ValueError):
            codes = np.empty(0)
        if codes.ndim != 2 or codes.shape[1] != spec.n_vq or not codes.size or codes.min() < 0:
            raise ConversionError(f"{where} ({name}): prompt_audio_codes must be frames of {spec.n_vq} codes")
        if codes.max() >= spec.audio_vocab_size:
            raise ConversionError(f"{where} ({name}): a code is not below {spec.audio_vocab_size}")
        voices[name] = codes
    return voices


def _gguf_bytes(shape: NanoTransformerShape, gguf_type: str) -> int:
    dims = nano_tensor_shapes(shape).values()
    matrices = sum(int(np.prod(d)) for d in dims if len(d) == 2)
    vectors = sum(int(np.prod(d)) for d in dims if len(d) == 1)
    return int(matrices * GGUF_TYPES[gguf_type].bits_per_weight / 8) + 4 * vectors + GGUF_METADATA_BYTES


def _write_transformer(
    checkpoint: SafetensorsCheckpoint, prefix: str, shape: NanoTransformerShape, path: Path, dtype: str
) -> None:
    matrix_dtype = np.float16 if dtype == "f16" else np.float32
    tensors = (
        (name, checkpoint.read(prefix + name, matrix_dtype if len(dims) == 2 else np.float32))
        for name, dims in nano_tensor_shapes(shape).items()
    )
    which = "local" if prefix == LOCAL_PREFIX else "global"
    write_nano_transformer_gguf(path, shape, tensors, dtype=dtype, name=f"MOSS-TTS-Nano {which} transformer")
