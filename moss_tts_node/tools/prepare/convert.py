"""``python -m moss_tts_node convert``: an original MossTTSDelay checkpoint into a weights directory.

Upstream (docs/model.md, "Upstream") makes MOSS-TTS-GGUF with PyTorch, transformers and llama.cpp's converter
script; this does the same with NumPy and ``gguf``, so that a fine-tuned model, or a quantization that is not published
(Q5_K_M, Q6_K, Q8_0), can be made on the robot's own toolchain. The output has exactly the published
layout (``MOSS_TTS_<TYPE>.gguf``, float16 ``embeddings/`` and ``lm_heads/``, ``tokenizer/``,
``config.json``), so a params file works with either source.

Memory: tensors are read one at a time, in row chunks, straight into the array that is written (see
``safetensors_io``), so the peak is about the largest tensor in its output dtype (the 155,648 x 4096 text
embedding: 1.3 GB as float16) plus the chunk buffers, never the whole checkpoint (docs/weights.md, "Converting a
checkpoint", has measured peaks). Quantizing goes through an F16 GGUF written to a hidden temporary file in the
output directory, which llama.cpp's own ``llama_model_quantize`` (through the C bridge) turns into the
final file; the temporary file is removed whatever happens, and one left by a killed run is removed by
the next.

Everything that can be checked is checked before the first byte is written: the config is MossTTSDelay's
(any Qwen3 size, every dimension read from it), every tensor is present with the shape the config implies,
the tokenizer knows the special tokens, the quantization fits the row sizes, the checkpoint is a model of the
family this package knows and its processing code's prompt template can be read, the output directory holds
no weights (unless ``--force``) and its disk has room for the estimated output.

Every model of the family converts alike (docs/family.md, "Converting"): MOSS-TTS 1.0 and v1.5, MOSS-TTSD,
-VoiceGenerator and -SoundEffect, with 32 or 16 codebooks. Which one it is (``identify.py``: from the checkpoint,
its model card, or ``--model``), its release where its card tells (so that ``generation.pause_markers: auto``
passes pause markers to a v1.5 model), the codebooks it needs and its prompt template (``prompt_template.py``) are
recorded in the output ``config.json`` (``model/identity.py``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from moss_tts_node.model.family import FAMILY, MOSS_TTS, MOSS_TTS_NANO
from moss_tts_node.model.identity import RECORD_KEY, ModelIdentity
from moss_tts_node.model.layout import (
    CONFIG_FILE,
    DEFAULT_QUANTIZATION,
    EMBEDDINGS_DIR,
    HEADS_DIR,
    NANO_DEFAULT_QUANTIZATION,
    TEXT_EMBEDDING_FILE,
    TEXT_HEAD_FILE,
    TOKENIZER_DIR,
    audio_embedding_file,
    audio_head_file,
    gguf_name,
)
from moss_tts_node.model.spec import NANO_MODEL_TYPE, ModelSpec
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
from moss_tts_node.tools.prepare.identify import IdentityError, identify
from moss_tts_node.tools.prepare.nano_convert import VOICES_DIR, convert_nano_checkpoint
from moss_tts_node.tools.prepare.prompt_template import TemplateError, read_prompt_template
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, qwen3_tensor_shapes, write_qwen3_gguf
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint

MODEL_TYPE = "moss_tts_delay"
_CHECKPOINT_HINT = (
    "point at the original checkpoint directory (the one holding config.json, the *.safetensors files and the "
    "tokenizer)"
)
TOKENIZER_FILES = (  # copied when present; tokenizer.json is what the runtime reads
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class CheckpointConfig:
    """What ``config.json`` of an original checkpoint says: the backbone shape and the vocabulary facts."""

    raw: dict[str, Any]
    shape: Qwen3Shape
    spec: ModelSpec


def read_checkpoint_config(checkpoint_dir: Path) -> CheckpointConfig:
    """Parse and check ``config.json``: a MOSS-TTS-Delay model with a plain Qwen3 backbone.

    The backbone sits under ``language_config`` (transformers 5), with rope theta under
    ``rope_parameters.rope_theta`` (older files: ``rope_theta``).
    """
    path = Path(checkpoint_dir) / CONFIG_FILE
    raw = read_json_object(path, ConversionError, _CHECKPOINT_HINT)
    if raw.get("model_type") != MODEL_TYPE:
        raise ConversionError(
            f"{path}: model_type is {raw.get('model_type')!r}, not {MODEL_TYPE!r}: this is not a MOSS-TTS-Delay "
            "checkpoint (MOSS-TTS-Local, MOSS-TTS-Realtime and plain Qwen3 checkpoints have other layouts)"
        )
    reader = ConfigReader(path, ConversionError)
    where = "language_config"
    language = reader.mapping(raw, where, "")
    if language.get("model_type", "qwen3") != "qwen3":
        raise reader.fail(f"{where}.model_type", f"is {language['model_type']!r}; only a qwen3 backbone converts")
    if language.get("attention_bias", False) or language.get("hidden_act", "silu") != "silu":
        raise reader.fail(where, "asks for attention biases or a non-SiLU FFN, which Qwen3 in llama.cpp lacks")
    hidden = reader.integer(language, "hidden_size", where)
    heads = reader.integer(language, "num_attention_heads", where)
    rope = language.get("rope_parameters")
    if isinstance(rope, dict):
        if rope.get("rope_type", "default") != "default":
            raise reader.fail(f"{where}.rope_parameters", f"asks for {rope['rope_type']!r} rope scaling; unsupported")
        theta = reader.number(rope, "rope_theta", f"{where}.rope_parameters")
    else:
        theta = reader.number(language, "rope_theta", where)
    try:
        shape = Qwen3Shape(
            hidden=hidden,
            layers=reader.integer(language, "num_hidden_layers", where),
            heads=heads,
            kv_heads=reader.integer(language, "num_key_value_heads", where),
            head_dim=reader.integer(language, "head_dim", where, hidden // heads),
            ffn=reader.integer(language, "intermediate_size", where),
            vocab=reader.integer(language, "vocab_size", where),
            rope_theta=float(theta),
            rms_eps=float(reader.number(language, "rms_norm_eps", where, 1e-6)),
            context_length=reader.integer(language, "max_position_embeddings", where, 40960),
        )
    except ValueError as exc:
        raise reader.fail(where, str(exc)) from exc
    return CheckpointConfig(raw=raw, shape=shape, spec=ModelSpec.load(Path(checkpoint_dir)))


def checkpoint_identity(checkpoint_dir: Path, config: CheckpointConfig, model: str | None = None) -> ModelIdentity:
    """Which model of the family the checkpoint is, and its prompt template (``identify``; ``model``: what
    ``--model`` says, or None); ConversionError saying what differs or what cannot be read."""
    try:
        template = read_prompt_template(checkpoint_dir)
        return identify(checkpoint_dir, config.shape, config.spec.n_vq, template, model)
    except (TemplateError, IdentityError) as error:
        raise ConversionError(f"{checkpoint_dir} cannot be converted: {error}") from None


def checkpoint_tensor_name(backbone_name: str) -> str:
    """Checkpoint name of a backbone tensor: ``language_model.*``, the text head is ``lm_heads.0``."""
    return "lm_heads.0.weight" if backbone_name == "lm_head.weight" else f"language_model.{backbone_name}"


def table_files(spec: ModelSpec) -> dict[str, str]:
    """Output .npy (relative path) -> checkpoint tensor, for the tables the NumPy side reads."""
    files = {
        f"{EMBEDDINGS_DIR}/{TEXT_EMBEDDING_FILE}": "language_model.embed_tokens.weight",
        f"{HEADS_DIR}/{TEXT_HEAD_FILE}": "lm_heads.0.weight",
    }
    for k in range(spec.n_vq):
        files[f"{EMBEDDINGS_DIR}/{audio_embedding_file(k)}"] = f"emb_ext.{k}.weight"
        files[f"{HEADS_DIR}/{audio_head_file(k)}"] = f"lm_heads.{k + 1}.weight"  # lm_heads.0 is the text head
    return files


def expected_tensor_shapes(config: CheckpointConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint with this config holds, with its shape."""
    shapes = {checkpoint_tensor_name(n): dims for n, dims in qwen3_tensor_shapes(config.shape).items()}
    audio = (config.spec.audio_rows, config.shape.hidden)
    # the text embedding and text head are backbone tensors, already listed; the rest are audio tables
    shapes.update({name: audio for name in table_files(config.spec).values() if name not in shapes})
    return shapes


def check_tokenizer(checkpoint_dir: Path, spec: ModelSpec, vocab: int) -> None:
    """The runtime looks special tokens up by id in tokenizer.json: each must exist and have an embedding."""
    from tokenizers import Tokenizer  # deferred: the CLI imports this module for --help

    path = Path(checkpoint_dir) / "tokenizer.json"
    if not path.is_file():
        raise ConversionError(f"no tokenizer.json in {checkpoint_dir}: copy the model's tokenizer files next to it")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed files
        raise ConversionError(f"{path}: not a readable tokenizer.json ({exc})") from exc
    for field, token_id in spec.special_token_ids.items():
        if token_id >= vocab or tokenizer.id_to_token(token_id) is None:
            raise ConversionError(
                f"{field} {token_id} (config.json) is not a token of {path} with an embedding row "
                f"(vocab {vocab}): the config and the tokenizer belong to different models"
            )


def estimate_gguf_bytes(shape: Qwen3Shape, gguf_type: str) -> int:
    """Size of the backbone GGUF: matrices at the type's bits per weight, norm vectors in F32."""
    dims = qwen3_tensor_shapes(shape).values()
    matrices = sum(int(np.prod(d)) for d in dims if len(d) == 2)
    vectors = sum(int(np.prod(d)) for d in dims if len(d) == 1)
    return int(matrices * GGUF_TYPES[gguf_type].bits_per_weight / 8) + 4 * vectors + GGUF_METADATA_BYTES


def estimate_output_bytes(config: CheckpointConfig, gguf_type: str, tokenizer_bytes: int) -> tuple[int, int]:
    """(final size, peak size during the conversion) of the output, in bytes.

    The peak adds the F16 intermediate GGUF that exists next to the quantized one until it is removed.
    """
    shape, spec = config.shape, config.spec
    tables = 2 * (2 * shape.vocab * shape.hidden + 2 * spec.n_vq * spec.audio_rows * shape.hidden)
    final = estimate_gguf_bytes(shape, gguf_type) + tables + tokenizer_bytes
    intermediate = estimate_gguf_bytes(shape, "F16") if GGUF_TYPES[gguf_type].ftype is not None else 0
    return final, final + intermediate


def convert_checkpoint(
    checkpoint_dir: Path | str,
    out_dir: Path | str,
    gguf_type: str | None = None,
    *,
    force: bool = False,
    n_threads: int = 0,
    progress_stream: TextIO | None = None,
    model: str | None = None,
    builtin_voices: Path | None = None,
) -> Path:
    """Convert the checkpoint into ``out_dir``; returns the GGUF's path. ``gguf_type``: None for the model's
    default (``DEFAULT_QUANTIZATION``, as published; Nano's ``NANO_DEFAULT_QUANTIZATION``). ``model``: which model
    of the family it is (a key of ``model.family.FAMILY``), where the checkpoint cannot tell. A MOSS-TTS-Nano
    checkpoint goes to ``nano_convert`` (``builtin_voices``: Nano's only). See the module docstring."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    model_type = read_json_object(checkpoint_dir / CONFIG_FILE, ConversionError, _CHECKPOINT_HINT).get("model_type")
    is_nano = model_type == NANO_MODEL_TYPE
    if model is not None and (model == MOSS_TTS_NANO.key) != is_nano:
        raise ConversionError(
            f"--model {model} does not match {checkpoint_dir / CONFIG_FILE}, whose model_type is {model_type!r}: "
            "leave --model out (model_type tells MOSS-TTS-Nano from the Delay models)"
        )
    if is_nano:
        return convert_nano_checkpoint(
            checkpoint_dir,
            out_dir,
            gguf_type or NANO_DEFAULT_QUANTIZATION,
            force=force,
            n_threads=n_threads,
            progress_stream=progress_stream,
            builtin_voices=builtin_voices,
        )
    if builtin_voices is not None:
        raise ConversionError(
            f"--voices takes MOSS-TTS-Nano's built-in voices, but {checkpoint_dir} is a Delay model "
            f"(model_type {model_type!r}): leave --voices out"
        )
    gguf_type = gguf_type or DEFAULT_QUANTIZATION
    if gguf_type not in GGUF_TYPES:
        raise ConversionError(f"unknown output type {gguf_type!r}: choose one of {', '.join(GGUF_TYPES)}")
    config = read_checkpoint_config(checkpoint_dir)
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    check_tensor_shapes(checkpoint.directory, checkpoint.shapes, expected_tensor_shapes(config), "MOSS-TTS-Delay")
    check_tokenizer(checkpoint_dir, config.spec, config.shape.vocab)
    shape = config.shape
    check_row_multiples(
        {"hidden_size": shape.hidden, "heads x head_dim": shape.heads * shape.head_dim, "intermediate_size": shape.ffn},
        gguf_type,
    )
    identity = checkpoint_identity(checkpoint_dir, config, model)
    check_output_dir(out_dir, checkpoint_dir, force)
    remove_leftovers(out_dir)
    tokenizer_files = [checkpoint_dir / n for n in TOKENIZER_FILES if (checkpoint_dir / n).is_file()]
    final_bytes, peak_bytes = estimate_output_bytes(config, gguf_type, sum(p.stat().st_size for p in tokenizer_files))
    check_disk_space(out_dir, peak_bytes, "the conversion (the output plus, when quantizing, an F16 intermediate)")

    tables = table_files(config.spec)
    backbone_bytes = sum(
        checkpoint.tensors[checkpoint_tensor_name(n)].nbytes for n in qwen3_tensor_shapes(config.shape)
    )
    progress = ConversionProgress(
        backbone_bytes + sum(checkpoint.tensors[n].nbytes for n in tables.values()), progress_stream
    )
    progress.message(
        f"converting {checkpoint_dir} ({len(checkpoint.tensors)} tensors, {gb(checkpoint.nbytes)}) into {out_dir} "
        f"as {gguf_type} (about {gb(final_bytes)})"
    )
    progress.message(_identity_note(identity, config.spec.n_vq))
    for sub in (EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    gguf_path = out_dir / gguf_name(gguf_type)
    write_gguf(
        gguf_path,
        gguf_type,
        lambda path, dtype: _write_backbone(checkpoint, config.shape, path, dtype, progress),
        estimate_gguf_bytes(config.shape, gguf_type),
        progress,
        n_threads,
    )
    for relative, name in tables.items():
        np.save(out_dir / relative, checkpoint.read(name, np.float16))
        progress.advance(checkpoint.tensors[name].nbytes, relative)
    for path in tokenizer_files:
        shutil.copyfile(path, out_dir / TOKENIZER_DIR / path.name)
    # the ModelSpec keys explicit, defaults included; the identity beside them
    merged = {**config.raw, **config.spec.to_json(), RECORD_KEY: identity.to_record(config.spec.n_vq)}
    (out_dir / CONFIG_FILE).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    progress.message(f"done in {progress.elapsed():.1f} s: {gguf_path} ({gb(gguf_path.stat().st_size)})")
    return gguf_path


def _write_backbone(
    checkpoint: SafetensorsCheckpoint, shape: Qwen3Shape, path: Path, dtype: str, progress: ConversionProgress
) -> None:
    """Stream the backbone into a GGUF, one tensor in memory at a time, in the file's own order."""
    matrix_dtype = np.float16 if dtype == "f16" else np.float32

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for name, dims in qwen3_tensor_shapes(shape).items():
            source = checkpoint_tensor_name(name)
            yield name, checkpoint.read(source, matrix_dtype if len(dims) == 2 else np.float32)
            progress.advance(checkpoint.tensors[source].nbytes, source)

    write_qwen3_gguf(path, shape, tensors(), dtype=dtype, name="MOSS-TTS-Delay backbone")


def _identity_note(identity: ModelIdentity, n_vq: int) -> str:
    """What the conversion found out about the model, and what the runtime will do with it."""
    template = identity.template
    reads = f"prompt template of {template.source}" + (", with a Scene field" if template.has_scene else "")
    note = f"{identity.name}, {n_vq} codebooks ({identity.evidence}); {reads}"
    markers = identity.trained_on_pause_markers
    if identity.model is MOSS_TTS:
        meaning = {
            True: "passes [pause X.Ys] to the model",
            False: "renders [pause X.Ys] as silence",
            None: "renders [pause X.Ys] as silence (no model card whose front matter lists the languages tells the "
            "release); set it to model for a v1.5 checkpoint",
        }[markers]
        note += f"; generation.pause_markers auto {meaning}"
    return note


# ---- command line -----------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``convert`` subcommand (see cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "convert",
        help="turn an original MOSS-TTS-Delay or MOSS-TTS-Nano checkpoint into a weights directory (GGUF + .npy)",
        description="Convert a Hugging Face checkpoint (config.json, *.safetensors, the tokenizer) into a weights "
        "directory: a MOSS-TTS-Delay model into the MOSS-TTS-GGUF layout, MOSS-TTS-Nano into two GGUFs (its global "
        "and local transformers) and its tables (docs/nano.md). Optionally quantized. Torch-free.",
    )
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT_DIR", help="the original checkpoint directory")
    parser.add_argument("output", type=Path, metavar="OUT_DIR", help="the weights directory to write")
    parser.add_argument(
        "--quantize",
        choices=list(GGUF_TYPES),
        help=f"GGUF type of the transformers (default: {DEFAULT_QUANTIZATION} for the Delay models, as published; "
        f"{NANO_DEFAULT_QUANTIZATION} for MOSS-TTS-Nano)",
    )
    parser.add_argument(
        "--model",
        choices=list(FAMILY),
        help="which model of the family the checkpoint is, where it cannot tell (docs/family.md): needed for "
        "MOSS-TTSD without its processing code, and for MOSS-SoundEffect",
    )
    parser.add_argument(
        "--voices",
        type=Path,
        metavar="MANIFEST",
        help="MOSS-TTS-Nano: write upstream's built-in voices from the ONNX release's browser_poc_manifest.json "
        "(the file or its directory) to OUT_DIR/voices, for voices.directories",
    )
    parser.add_argument("--force", action="store_true", help="overwrite weights already in OUT_DIR")
    parser.add_argument("--threads", type=int, default=0, help="quantization threads (default: all cores)")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's log, one line per quantized tensor")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.verbose:
        from moss_tts_node.llama.backbone import set_llama_verbose

        set_llama_verbose(True)
    gguf_path = convert_checkpoint(
        args.checkpoint,
        args.output,
        args.quantize,
        force=args.force,
        n_threads=args.threads,
        progress_stream=sys.stderr,
        model=args.model,
        builtin_voices=args.voices,
    )
    voices = f" and voices.directories: [{(args.output / VOICES_DIR).resolve()}]" if args.voices else ""
    print(
        f"wrote {args.output}; in your params file set model.weights_dir: {args.output.resolve()}, "
        f"model.backbone_gguf: {gguf_path.name}{voices}"
    )
    return 0
