"""Random-weight MossTTSDelay models of the real shapes, built once and cached for ``bench``.

The real weights cannot be downloaded on every machine, and a speed measurement does not need them:
llama.cpp's time per step depends on the shapes and the quantization, not on the values. A bench model
has the published layout (``MOSS_TTS_Q4_K_M.gguf``, float16 ``embeddings/`` and ``lm_heads/``,
``tokenizer/``, ``config.json``) at the real width and depth, the real text vocabulary (155,648) and the
real special-token ids (151643..151662), plus the tiny demo codec (its cost is not the real codec's). Each bench
model is a model of the family (docs/family.md): MOSS-TTS at 8B and 1.7B (32 codebooks), and MOSS-VoiceGenerator's
shape, 1.7B with 16 codebooks, recorded as such (its recommended sampling applies).

Built under ``~/.cache/moss_tts_node/bench/<shape>/`` (``$XDG_CACHE_HOME`` is honoured): an F16 GGUF is
written from random values, quantized to Q4_K_M with llama.cpp's own quantizer (through the C bridge),
and deleted. docs/speed.md ("The step loop") says how long the shapes take to build and how much disk they need.

Like the demo model, the weights are nudged so that generation stays in the audio phase: every text
embedding shares one direction, and the text head reads it to favour ``gen_slot`` by a wide margin, so
a run makes exactly ``steps`` frames' worth of rows with every codebook sampled (the steady state of a long
utterance) rather than ending after a frame or two.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from moss_tts_node.config import write_params_file
from moss_tts_node.errors import MossTTSError
from moss_tts_node.model.family import MOSS_TTS, VOICE_GENERATOR, FamilyModel
from moss_tts_node.model.identity import RECORD_KEY, ModelIdentity
from moss_tts_node.model.layout import (
    CONFIG_FILE,
    DEFAULT_GGUF,
    EMBEDDINGS_DIR,
    HEADS_DIR,
    TEXT_EMBEDDING_FILE,
    TOKENIZER_DIR,
    audio_embedding_file,
    audio_head_file,
    gguf_name,
    heads_gguf_name,
)
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.tools.dev.demo_codec import write_demo_codec
from moss_tts_node.tools.dev.demo_weights import SPECIAL_TOKENS, train_tokenizer
from moss_tts_node.tools.prepare.conversion import quantize_gguf
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, qwen3_tensor_shapes, write_qwen3_gguf

TEXT_VOCAB = 155_648
GGUF_NAME = DEFAULT_GGUF
HEADS_GGUF_NAME = heads_gguf_name(GGUF_NAME)  # the same, with the audio heads in output.weight (attach-heads)
FORMAT_VERSION = 1  # bump when the files a bench model holds change

QWEN3_8B = Qwen3Shape(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=TEXT_VOCAB)
QWEN3_1_7B = Qwen3Shape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=TEXT_VOCAB)


@dataclass(frozen=True)
class BenchModel:
    """A bench model: a backbone shape, and the model of the family it stands for (its codebooks, its sampling)."""

    shape: Qwen3Shape
    model: FamilyModel = MOSS_TTS

    @property
    def n_vq(self) -> int:
        return self.model.codebooks[0]

    def stamp(self) -> dict[str, object]:
        """What the cached files were built for. MOSS-TTS's stamp is what it was before the family, so that the
        8B model (the slow one to build) stays cached."""
        stamp: dict[str, object] = {"format": FORMAT_VERSION, "shape": self.shape.__dict__}
        return stamp if self.model is MOSS_TTS else {**stamp, "model": self.model.key, "n_vq": self.n_vq}


BENCH_MODELS: dict[str, BenchModel] = {
    "8b": BenchModel(QWEN3_8B),
    "1.7b": BenchModel(QWEN3_1_7B),
    "voice-generator-1.7b": BenchModel(QWEN3_1_7B, VOICE_GENERATOR),
}

_SHARED_SCALE = 3.0  # per-element size of the shared text-embedding direction (the rest is ~0.3)
_TEXT_BIAS = {  # text-head logit along the shared direction, per unit of alignment
    "audio_assistant_gen_slot_token_id": 40.0,
    "audio_assistant_delay_slot_token_id": -40.0,
    "im_end_token_id": -40.0,
}
_PARAMS = {  # its config.yaml, beside the weights
    "model.weights_dir": ".",
    "model.backbone_gguf": GGUF_NAME,
    "model.codec_dir": "codec",
    "llama.n_ctx": 4096,
    "llama.n_threads": 2,
    "llama.n_gpu_layers": 0,
    "audio.onnx_provider": "cpu",
}

Log = Callable[[str], None]


def bench_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "moss_tts_node" / "bench"


def bench_model_dir(name: str) -> Path:
    return bench_cache_dir() / name


def ensure_bench_model(name: str, threads: int = 2, log: Log = print) -> Path:
    """The config.yaml of the cached bench model ``name`` (a key of BENCH_MODELS), built if missing."""
    if name not in BENCH_MODELS:
        raise MossTTSError(f"unknown bench model {name!r}; choose one of {', '.join(BENCH_MODELS)}")
    bench = BENCH_MODELS[name]
    directory = bench_model_dir(name)
    marker = directory / "bench_model.json"
    stamp = bench.stamp()
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == stamp:
        return directory / "config.yaml"
    build_bench_model(directory, bench, name, threads=threads, log=log)
    marker.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return directory / "config.yaml"


def build_bench_model(directory: Path, bench: BenchModel, name: str, threads: int = 2, log: Log = print) -> None:
    shape = bench.shape
    spec = ModelSpec(n_vq=bench.n_vq)
    f16_bytes = 2 * sum(int(np.prod(d)) for d in qwen3_tensor_shapes(shape).values())
    npy_bytes = 2 * shape.hidden * (shape.vocab + 2 * spec.n_vq * spec.audio_rows)
    need = f16_bytes + npy_bytes + f16_bytes // 3
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < need:
        raise MossTTSError(
            f"building the {name} bench model needs ~{need / 1e9:.0f} GB free in {directory}, "
            f"only {free / 1e9:.0f} GB are"
        )
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    direction = rng.choice([-1.0, 1.0], size=shape.hidden).astype(np.float32)

    log(f"[{name}] tokenizer, config, codec")
    write_padded_tokenizer(directory / TOKENIZER_DIR, spec)
    (directory / CONFIG_FILE).write_text(
        json.dumps(
            {
                "model_type": "moss_tts_delay",
                **spec.to_json(),
                RECORD_KEY: ModelIdentity(bench.model, evidence="a bench model").to_record(spec.n_vq),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    write_demo_codec(directory / "codec", seed=0)

    log(f"[{name}] float16 embeddings and audio heads")
    (directory / EMBEDDINGS_DIR).mkdir(exist_ok=True)
    (directory / HEADS_DIR).mkdir(exist_ok=True)
    table = np.lib.format.open_memmap(
        directory / EMBEDDINGS_DIR / TEXT_EMBEDDING_FILE, mode="w+", dtype=np.float16, shape=(shape.vocab, shape.hidden)
    )
    for start in range(0, shape.vocab, 8192):
        rows = min(8192, shape.vocab - start)
        table[start : start + rows] = 0.3 * _noise(rng, (rows, shape.hidden)) + _SHARED_SCALE * direction
    table.flush()
    del table
    for k in range(spec.n_vq):
        emb = 0.05 * _noise(rng, (spec.audio_rows, shape.hidden))
        head = _noise(rng, (spec.audio_rows, shape.hidden)) / np.sqrt(shape.hidden)
        np.save(directory / EMBEDDINGS_DIR / audio_embedding_file(k), emb.astype(np.float16))
        np.save(directory / HEADS_DIR / audio_head_file(k), head.astype(np.float16))

    f16_path = directory / f".{gguf_name('F16')}"
    log(f"[{name}] F16 GGUF ({f16_bytes / 1e9:.1f} GB)")
    t0 = time.perf_counter()
    write_qwen3_gguf(f16_path, shape, _random_backbone(shape, spec, direction), dtype="f16")
    log(f"[{name}]   written in {time.perf_counter() - t0:.0f} s")
    try:
        log(f"[{name}] quantizing to Q4_K_M with llama.cpp ({threads} threads)")
        t0 = time.perf_counter()
        partial = directory / f".{GGUF_NAME}.partial"  # a killed build leaves no GGUF that looks complete
        try:
            quantize_gguf(f16_path, partial, "Q4_K_M", threads)
            os.replace(partial, directory / GGUF_NAME)
        finally:
            partial.unlink(missing_ok=True)
        log(f"[{name}]   quantized in {time.perf_counter() - t0:.0f} s")
    finally:
        f16_path.unlink(missing_ok=True)
    header = f"Bench model ({name}): random weights of the real shape, noise not speech.\n"
    header += "Made by `python -m moss_tts_node bench`."
    write_params_file(directory / "config.yaml", _PARAMS, header)
    log(f"[{name}] built in {time.perf_counter() - started:.0f} s: {directory}")


def ensure_heads_gguf(name: str, log: Log = print) -> Path:
    """The bench model's GGUF with its audio heads appended to its output matrix (heads_backend gguf)."""
    from moss_tts_node.tools.prepare.attach_heads import append_audio_heads_to_gguf

    directory = bench_model_dir(name)
    target = directory / HEADS_GGUF_NAME
    source = directory / GGUF_NAME
    if not target.is_file() or target.stat().st_mtime < source.stat().st_mtime:
        log(f"[{name}] appending the audio heads to the GGUF's output matrix: {target.name}")
        t0 = time.perf_counter()
        append_audio_heads_to_gguf(source, directory / HEADS_DIR, target, ModelSpec.load(directory))
        log(f"[{name}]   written in {time.perf_counter() - t0:.0f} s")
    return target


def write_padded_tokenizer(directory: Path, spec: ModelSpec) -> Tokenizer:
    """The demo's byte-level BPE, padded with unreachable fillers so MOSS's special ids are the real ones.

    Like Qwen's own: the BPE vocabulary runs up to ``pad_token_id`` (151643), the added special tokens
    follow in id order (gaps filled with ``<|reserved_N|>``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    base = json.loads(train_tokenizer().to_str())
    names = {getattr(spec, field): text for text, field in SPECIAL_TOKENS.items()}
    first, last = min(names), max(names)
    vocab = base["model"]["vocab"]
    if sorted(vocab.values()) != list(range(len(vocab))) or len(vocab) > first:
        raise MossTTSError("the demo BPE vocabulary does not fit under the special-token ids")
    vocab.update({f"<unused_{i}>": i for i in range(len(vocab), first)})
    base["model"]["vocab"] = vocab
    base["added_tokens"] = [
        {
            "id": i,
            "content": names.get(i, f"<|reserved_{i}|>"),
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in range(first, last + 1)
    ]
    tokenizer = Tokenizer.from_str(json.dumps(base))
    tokenizer.save(str(directory / "tokenizer.json"))
    for i, text in names.items():
        if tokenizer.token_to_id(text) != i:
            raise MossTTSError(f"padded tokenizer: {text} got id {tokenizer.token_to_id(text)}, expected {i}")
    return tokenizer


def _noise(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Cheap float32 noise of unit variance: uniform bytes (much cheaper than normal draws at 8B scale)."""
    raw = np.frombuffer(rng.bytes(int(np.prod(shape))), dtype=np.int8).reshape(shape)
    return raw.astype(np.float32) * np.float32(1.0 / 73.9)


def _random_backbone(shape: Qwen3Shape, spec: ModelSpec, direction: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """Backbone tensors in file order, one at a time (as float16 where the GGUF stores float16)."""
    rng = np.random.default_rng(1)
    residual_scale = 1.0 / np.sqrt(2.0 * shape.layers)
    for name, dims in qwen3_tensor_shapes(shape).items():
        if len(dims) == 1:
            yield name, (1.0 + 0.1 * _noise(rng, dims)).astype(np.float32)
            continue
        out = np.empty(dims, dtype=np.float16)
        scale = 1.0 if name == "embed_tokens.weight" else 1.0 / np.sqrt(dims[1])
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            scale *= residual_scale
        for start in range(0, dims[0], 4096):
            rows = min(4096, dims[0] - start)
            out[start : start + rows] = scale * _noise(rng, (rows, dims[1]))
        if name == "lm_head.weight":
            for field, logit in _TEXT_BIAS.items():
                out[getattr(spec, field)] = logit * direction / shape.hidden
        yield name, out
