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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from moss_tts_node.errors import BridgeError, MossTTSError
from moss_tts_node.model.family import DELAY_FAMILY, MOSS_TTS
from moss_tts_node.model.identity import RECORD_KEY, ModelIdentity
from moss_tts_node.model.layout import (
    CONFIG_FILE,
    EMBEDDINGS_DIR,
    HEADS_DIR,
    TEXT_EMBEDDING_FILE,
    TEXT_HEAD_FILE,
    TOKENIZER_DIR,
    audio_embedding_file,
    audio_head_file,
    gguf_name,
)
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.tools.prepare.config_reader import ConfigReader, read_json_object
from moss_tts_node.tools.prepare.identify import IdentityError, identify
from moss_tts_node.tools.prepare.prompt_template import TemplateError, read_prompt_template
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, qwen3_tensor_shapes, write_qwen3_gguf
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint
from moss_tts_node.tools.progress import Progress

MODEL_TYPE = "moss_tts_delay"
TOKENIZER_FILES = (  # copied when present; tokenizer.json is what the runtime reads
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
_OUTPUT_MARKERS = (CONFIG_FILE, EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR)  # besides *.gguf
_DISK_MARGIN = 1.05  # the size estimates are within a few percent; leave room for file-system overhead
_GGUF_METADATA_BYTES = 1 << 20


@dataclass(frozen=True)
class GgufType:
    """A backbone output type: its ``enum llama_ftype`` (None: written directly, no quantization)."""

    ftype: int | None
    bits_per_weight: float  # of the 2-D tensors; for the disk estimate
    row_multiple: int  # llama.cpp's block size: every row length must be a multiple of it


# ftype values from llama.h (enum llama_ftype). Bits per weight of the 2-D tensors as measured on a model
# of the real shape (K-quant mixes put some tensors in Q6_K); Q6_K and Q8_0 are exact.
GGUF_TYPES: dict[str, GgufType] = {
    "Q4_K_M": GgufType(15, 4.91, 256),
    "Q5_K_M": GgufType(17, 5.71, 256),
    "Q6_K": GgufType(18, 6.5625, 256),
    "Q8_0": GgufType(7, 8.5, 32),
    "F16": GgufType(None, 16.0, 1),
    "F32": GgufType(None, 32.0, 1),
}


class ConversionError(MossTTSError):
    """The checkpoint cannot be converted, or not into that directory; the message says what to do."""


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
    path = Path(checkpoint_dir) / "config.json"
    raw = read_json_object(
        path,
        ConversionError,
        "point at the original MOSS-TTS-Delay checkpoint directory (the one holding config.json, the "
        "*.safetensors files and tokenizer.json)",
    )
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


def check_tensors(checkpoint: SafetensorsCheckpoint, config: CheckpointConfig) -> None:
    """Refuse missing, unexpected and wrongly shaped tensors, naming a few of each."""
    expected = expected_tensor_shapes(config)
    present = checkpoint.tensors
    problems = []
    missing = [n for n in expected if n not in present]
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing ({_some(missing)}): the download or the save is incomplete")
    unexpected = [n for n in present if n not in expected]
    if unexpected:
        problems.append(
            f"{len(unexpected)} unexpected tensor(s) ({_some(unexpected)}): not the MOSS-TTS-Delay layout "
            "this converter knows"
        )
    wrong = [
        f"{n} is {list(present[n].shape)}, expected {list(dims)}"
        for n, dims in expected.items()
        if n in present and present[n].shape != dims
    ]
    if wrong:
        problems.append(
            f"{len(wrong)} tensor(s) of the wrong shape ({_some(wrong)}): config.json and the weights disagree"
        )
    if problems:
        raise ConversionError(f"{checkpoint.directory} cannot be converted: " + "; ".join(problems))


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


def check_quantization(shape: Qwen3Shape, gguf_type: str) -> None:
    """llama.cpp quantizes rows in blocks; refuse a type whose block does not divide every row length."""
    rows = {
        "hidden_size": shape.hidden,
        "heads x head_dim": shape.heads * shape.head_dim,
        "intermediate_size": shape.ffn,
    }
    block = GGUF_TYPES[gguf_type].row_multiple
    bad = [f"{name} {size}" for name, size in rows.items() if size % block]
    if bad:
        fitting = [t for t, g in GGUF_TYPES.items() if all(size % g.row_multiple == 0 for size in rows.values())]
        raise ConversionError(
            f"{gguf_type} needs every weight row to be a multiple of {block} values, but this model has "
            f"{', '.join(bad)}: choose {' or '.join(fitting)}"
        )


def estimate_gguf_bytes(shape: Qwen3Shape, gguf_type: str) -> int:
    """Size of the backbone GGUF: matrices at the type's bits per weight, norm vectors in F32."""
    dims = qwen3_tensor_shapes(shape).values()
    matrices = sum(int(np.prod(d)) for d in dims if len(d) == 2)
    vectors = sum(int(np.prod(d)) for d in dims if len(d) == 1)
    return int(matrices * GGUF_TYPES[gguf_type].bits_per_weight / 8) + 4 * vectors + _GGUF_METADATA_BYTES


def estimate_output_bytes(config: CheckpointConfig, gguf_type: str, tokenizer_bytes: int) -> tuple[int, int]:
    """(final size, peak size during the conversion) of the output, in bytes.

    The peak adds the F16 intermediate GGUF that exists next to the quantized one until it is removed.
    """
    shape, spec = config.shape, config.spec
    tables = 2 * (2 * shape.vocab * shape.hidden + 2 * spec.n_vq * spec.audio_rows * shape.hidden)
    final = estimate_gguf_bytes(shape, gguf_type) + tables + tokenizer_bytes
    intermediate = estimate_gguf_bytes(shape, "F16") if GGUF_TYPES[gguf_type].ftype is not None else 0
    return final, final + intermediate


def check_output_dir(out_dir: Path, checkpoint_dir: Path, force: bool) -> None:
    """Never convert into the checkpoint itself; never overwrite weights unless asked to."""
    if out_dir.resolve() == Path(checkpoint_dir).resolve():
        raise ConversionError(f"{out_dir} is the checkpoint directory itself: choose another output directory")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConversionError(f"{out_dir} exists and is not a directory")
    if force or not out_dir.is_dir():
        return
    found = sorted(p.name for p in out_dir.iterdir() if p.name in _OUTPUT_MARKERS or p.suffix == ".gguf")
    if found:
        raise ConversionError(
            f"{out_dir} already holds MOSS-TTS weights ({', '.join(found)}): choose an empty directory, "
            "or pass --force to overwrite them"
        )


def check_disk_space(out_dir: Path, needed: int, what: str) -> None:
    """Compare the estimated peak ``needed`` bytes (of ``what``, for the message) with the free space of the
    file system the output goes to."""
    existing = out_dir
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if needed * _DISK_MARGIN > free:
        raise ConversionError(
            f"{what} needs about {_gb(needed * _DISK_MARGIN)} free in {existing}, but only {_gb(free)} is free: "
            "free some space or choose an output directory on another disk"
        )


def quantize_gguf(source: Path, target: Path, gguf_type: str, n_threads: int = 0) -> None:
    """Quantize an F32/F16 GGUF with llama.cpp's own ``llama_model_quantize`` (as ``llama-quantize`` does)."""
    # deferred: compiles the bridge on first use
    from moss_tts_node.llama.bindings import Status, load_bridge_library, status_error

    ftype = GGUF_TYPES[gguf_type].ftype
    if ftype is None:
        raise ValueError(f"{gguf_type} is not a quantized type")
    lib = load_bridge_library()
    status = lib.moss_bridge_quantize(str(source).encode(), str(target).encode(), ftype, n_threads)
    if status != Status.OK:
        raise BridgeError(status_error(lib, status, None))


class ConversionProgress(Progress):
    """A conversion's progress: bytes read from the checkpoint (``advance``), and the growth of a file that
    llama.cpp writes while quantizing (``watching``), which is the only sign of life a C call gives. Off a
    terminal (logs) a line per tenth."""

    def __init__(self, total_bytes: int, stream: TextIO | None) -> None:
        super().__init__(stream, log_tenths=True)
        self.total, self.read = total_bytes, 0

    def advance(self, nbytes: int, label: str) -> None:
        self.read += nbytes
        self._bytes(self.read, self.total, label)

    @contextmanager
    def watching(self, path: Path, expected_bytes: int, label: str) -> Iterator[None]:
        """Report ``path``'s size against ``expected_bytes`` every second while the body runs."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(1.0):
                size = path.stat().st_size if path.exists() else 0
                self._bytes(min(size, int(expected_bytes * 0.999)), expected_bytes, label)  # an estimate: never 100 %

        thread = threading.Thread(target=watch, name="convert-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _bytes(self, done: int, total: int, label: str) -> None:
        percent = 100.0 * done / max(total, 1)
        self.fraction(done, total, f"  {percent:5.1f} %  {_gb(done)} / {_gb(total)}  {self.elapsed():6.1f} s  {label}")


def convert_checkpoint(
    checkpoint_dir: Path | str,
    out_dir: Path | str,
    gguf_type: str = "Q4_K_M",
    *,
    force: bool = False,
    n_threads: int = 0,
    progress_stream: TextIO | None = None,
    model: str | None = None,
) -> Path:
    """Convert the checkpoint into ``out_dir``; returns the GGUF's path. ``model``: which model of the family it
    is (a key of ``model.family.FAMILY``), where the checkpoint cannot tell. See the module docstring."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if gguf_type not in GGUF_TYPES:
        raise ConversionError(f"unknown output type {gguf_type!r}: choose one of {', '.join(GGUF_TYPES)}")
    config = read_checkpoint_config(checkpoint_dir)
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    check_tensors(checkpoint, config)
    check_tokenizer(checkpoint_dir, config.spec, config.shape.vocab)
    check_quantization(config.shape, gguf_type)
    identity = checkpoint_identity(checkpoint_dir, config, model)
    check_output_dir(out_dir, checkpoint_dir, force)
    _remove_leftovers(out_dir)
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
        f"converting {checkpoint_dir} ({len(checkpoint.tensors)} tensors, {_gb(checkpoint.nbytes)}) into {out_dir} "
        f"as {gguf_type} (about {_gb(final_bytes)})"
    )
    progress.message(_identity_note(identity, config.spec.n_vq))
    for sub in (EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    gguf_path = out_dir / gguf_name(gguf_type)
    quantized = GGUF_TYPES[gguf_type].ftype is not None
    direct_path = out_dir / f".{gguf_name('F16')}.for-{gguf_type}.tmp" if quantized else gguf_path
    try:
        _write_backbone(checkpoint, config.shape, direct_path, "f16" if quantized else gguf_type.lower(), progress)
        for relative, name in tables.items():
            np.save(out_dir / relative, checkpoint.read(name, np.float16))
            progress.advance(checkpoint.tensors[name].nbytes, relative)
        if quantized:
            partial = gguf_path.with_name(f".{gguf_path.name}.partial")
            progress.message(
                f"quantizing to {gguf_type} with llama.cpp (the longest step; --verbose shows each tensor)"
            )
            try:
                with progress.watching(partial, estimate_gguf_bytes(config.shape, gguf_type), gguf_path.name):
                    quantize_gguf(direct_path, partial, gguf_type, n_threads)
                partial.replace(gguf_path)
            finally:
                partial.unlink(missing_ok=True)
    finally:
        if quantized:
            direct_path.unlink(missing_ok=True)
    for path in tokenizer_files:
        shutil.copyfile(path, out_dir / TOKENIZER_DIR / path.name)
    # the ModelSpec keys explicit, defaults included; the identity beside them
    merged = {**config.raw, **config.spec.to_json(), RECORD_KEY: identity.to_record(config.spec.n_vq)}
    (out_dir / CONFIG_FILE).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    progress.message(f"done in {progress.elapsed():.1f} s: {gguf_path} ({_gb(gguf_path.stat().st_size)})")
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


def _remove_leftovers(out_dir: Path) -> None:
    """Hidden temporary files of a conversion that was killed (an F16 intermediate can be 16 GB)."""
    if out_dir.is_dir():
        for path in out_dir.glob(".*MOSS_TTS_*.gguf*"):
            path.unlink()


def _some(items: list[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


# ---- command line -----------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``convert`` subcommand (see cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "convert",
        help="turn an original MOSS-TTS-Delay checkpoint into a weights directory (GGUF + .npy)",
        description="Convert a Hugging Face MOSS-TTS-Delay checkpoint (config.json, *.safetensors, "
        "tokenizer.json) into the MOSS-TTS-GGUF layout, optionally quantized. Torch-free.",
    )
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT_DIR", help="the original checkpoint directory")
    parser.add_argument("output", type=Path, metavar="OUT_DIR", help="the weights directory to write")
    parser.add_argument(
        "--quantize", choices=list(GGUF_TYPES), default="Q4_K_M", help="backbone type (default: Q4_K_M, as published)"
    )
    parser.add_argument(
        "--model",
        choices=list(DELAY_FAMILY),
        help="which model of the family the checkpoint is, where it cannot tell (docs/family.md): needed for "
        "MOSS-TTSD without its processing code, and for MOSS-SoundEffect",
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
    )
    print(
        f"wrote {args.output}; in your params file set model.weights_dir: {args.output.resolve()} "
        f"and model.backbone_gguf: {gguf_path.name}"
    )
    return 0
