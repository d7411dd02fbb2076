"""``python -m moss_tts_node doctor [--config FILE]``: what is installed here, and whether it is usable.

Setting up a Jetson goes wrong in quiet ways: llama.cpp built without CUDA runs every layer on
the CPU, an onnxruntime without the CUDA provider falls back to the CPU, engines built by
another TensorRT refuse to load. The doctor prints one line per component, each marked ``ok``,
``--`` (not installed, not needed), ``warn`` (works, but not as configured) or ``FAIL``; with a
config it also checks that config's weights, codec and engines. It exits 1 if anything FAILs.
It loads no model, so it is quick and safe to run on a busy robot.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE, STREAM_DECODER_FILE
from moss_tts_node.codec.nano import is_nano_directory
from moss_tts_node.errors import MossTTSError
from moss_tts_node.model.layout import (
    EMBEDDINGS_DIR,
    HEADS_DIR,
    TEXT_EMBEDDING_FILE,
    TOKENIZER_DIR,
    TOKENIZER_FILE,
    attach_heads_command,
    audio_embedding_file,
    audio_head_file,
    nano_local_gguf_name,
)

if TYPE_CHECKING:
    from moss_tts_node.model.spec import ModelSpec

_JETSON_RELEASE = Path("/etc/nv_tegra_release")
_REQUIRED = ("numpy", "pyyaml", "tokenizers", "soundfile", "gguf", "threadpoolctl")
_DISTRIBUTIONS = {"pycuda": "pycuda", "cuda-python": "cuda-bindings", "llama.cpp": "llama_cpp_python"}


@dataclass(frozen=True)
class Check:
    status: str  # "ok", "--", "warn" or "FAIL"
    what: str
    detail: str


@dataclass(frozen=True)
class _Environment:
    """What the checks found that the config checks need."""

    gpu_offload: bool | None  # None: llama.cpp not loadable
    onnx_providers: tuple[str, ...]
    tensorrt_version: str | None
    gpu: Any  # cuda.GpuInfo, or None without a usable GPU


def diagnose(config_path: Path | None = None) -> list[Check]:
    """Every check, in print order."""
    checks: list[Check] = []
    environment = _check_environment(checks)
    if config_path is not None:
        _check_config(config_path, environment, checks)
    return checks


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _check_environment(checks: list[Check]) -> _Environment:
    python = f"{platform.python_version()} on {platform.machine()} ({sys.executable})"
    checks.append(Check("ok", "python", python))
    if _JETSON_RELEASE.is_file():
        release = _JETSON_RELEASE.read_text(errors="replace").splitlines()[0].lstrip("# ")
        checks.append(Check("ok", "jetson", f"{release} (L4T R36 = JetPack 6, R35 = JetPack 5)"))
    for name in _REQUIRED:
        version = _version(name)
        checks.append(
            Check("ok", name, version) if version else Check("FAIL", name, f"not installed: pip install {name}")
        )
    gpu_offload = _check_llama(checks)
    providers = _check_onnxruntime(checks)
    tensorrt_version = _check_tensorrt(checks)
    gpu = _check_gpu(checks)
    return _Environment(gpu_offload, providers, tensorrt_version, gpu)


def _check_llama(checks: list[Check]) -> bool | None:
    """The bridge library, and whether the llama.cpp it links was built with GPU offload."""
    from moss_tts_node.llama.bindings import llama_supports_gpu_offload, llama_system_info, load_bridge_library

    version = _version(_DISTRIBUTIONS["llama.cpp"])
    checks.append(Check("ok" if version else "--", "llama-cpp-python", version or "not installed"))
    try:
        library = load_bridge_library()
    except MossTTSError as error:
        checks.append(Check("FAIL", "llama.cpp bridge", str(error)))
        return None
    checks.append(Check("ok", "llama.cpp bridge", library._name))
    offload = llama_supports_gpu_offload()
    detail = (
        "yes"
        if offload
        else (
            'no: a CPU-only build (make venv LLAMA_CMAKE_ARGS="-DGGML_CUDA=on"; other installs: docs/install.md, '
            '"llama.cpp with CUDA (desktop GPU, Jetson)")'
        )
    )
    checks.append(Check("ok" if offload else "--", "llama.cpp GPU offload", detail))
    checks.append(Check("ok", "llama.cpp system", llama_system_info()))
    checks.append(_weight_layouts(repack=True))
    return offload


def _weight_layouts(repack: bool) -> Check:
    """Which of llama.cpp's CPU weight layouts this machine offers, and which a model loaded with ``repack`` uses."""
    from moss_tts_node.llama.placement import cpu_weight_placement

    placement = cpu_weight_placement(repack)
    offered = ", ".join(placement.offered) or "none"
    what = "llama.cpp CPU weights" if repack else "llama.repack"
    return Check("ok" if repack else "--", what, f"offered {offered}: {placement.reason()}")


def _check_onnxruntime(checks: list[Check]) -> tuple[str, ...]:
    try:
        import onnxruntime
    except ImportError as error:
        checks.append(Check("--", "onnxruntime", f"not installed ({error}); needed for audio.backend onnx"))
        return ()
    providers = tuple(onnxruntime.get_available_providers())
    checks.append(Check("ok", "onnxruntime", f"{onnxruntime.__version__}, providers {', '.join(providers)}"))
    return providers


def _check_tensorrt(checks: list[Check]) -> str | None:
    from moss_tts_node.codec.engines import import_tensorrt

    try:
        version = str(import_tensorrt().__version__)
    except MossTTSError as error:
        checks.append(Check("--", "tensorrt", str(error).split(". ")[0]))
        return None
    checks.append(Check("ok", "tensorrt", version))
    return version


def _check_gpu(checks: list[Check]) -> Any:
    """The CUDA bindings installed, and device 0 as one of them sees it."""
    from moss_tts_node.codec.cuda import cuda_api

    for name in ("pycuda", "cuda-python"):
        version = _version(_DISTRIBUTIONS[name])  # cuda-python's runtime API ships as cuda-bindings
        checks.append(Check("ok" if version else "--", name, version or "not installed"))
    try:
        api = cuda_api()
    except MossTTSError as error:
        checks.append(Check("--", "cuda device", str(error)))
        return None
    try:
        gpu = api.gpu()
    finally:
        api.release()
    memory = f", {gpu.memory_bytes / 2**30:.1f} GiB" if gpu.memory_bytes else ""
    detail = f"{gpu.name}, compute capability {gpu.compute_capability}{memory} (via {api.name})"
    checks.append(Check("ok", "cuda device", detail))
    return gpu


def _check_config(path: Path, environment: _Environment, checks: list[Check]) -> None:
    from moss_tts_node.config import backbone_path, load_config
    from moss_tts_node.model.spec import ModelSpec

    try:
        config = load_config(path)
    except MossTTSError as error:
        checks.append(Check("FAIL", "config", str(error)))
        return
    checks.append(Check("ok", "config", str(path)))
    weights = Path(config.model.weights_dir)
    try:  # read once, for every check that needs it
        spec: ModelSpec | MossTTSError = ModelSpec.load(weights)
    except MossTTSError as error:
        spec = error
    n_vq = _check_weights(weights, backbone_path(config), spec, checks)
    if not isinstance(spec, MossTTSError):
        _check_model(config, spec, checks)
    _check_heads(config, environment, spec, checks)
    if not config.llama.repack and environment.gpu_offload is not None:
        checks.append(_weight_layouts(repack=False))
    if config.llama.n_gpu_layers != 0 and environment.gpu_offload is False:
        checks.append(
            Check("warn", "llama.n_gpu_layers", f"{config.llama.n_gpu_layers}, but llama.cpp has no GPU: CPU only")
        )
    codec_dir = Path(config.model.codec_dir)
    if config.model.codec_dir and is_nano_directory(codec_dir):
        checks.extend(_nano_codec(config, codec_dir))
        return
    _check_stream_decoder(config, checks)
    if config.audio.backend == "tensorrt":
        _check_engines(Path(config.model.engine_dir), environment, n_vq, checks)
        return
    encoder = codec_dir / ENCODER_FILE
    detail = f"{codec_dir}: {DECODER_FILE}" + (f", {ENCODER_FILE}" if encoder.is_file() else f" (no {ENCODER_FILE})")
    checks.append(Check("ok", "codec (onnx)", detail))
    if config.audio.onnx_provider == "cuda" and "CUDAExecutionProvider" not in environment.onnx_providers:
        checks.append(Check("FAIL", "audio.onnx_provider", "cuda, but this onnxruntime has no CUDA provider"))


def _nano_codec(config: Any, codec_dir: Path) -> list[Check]:
    """MOSS-Audio-Tokenizer-Nano's published graphs (its meta file names them), streamed by its decode-step graph."""
    from moss_tts_node.codec.nano import read_nano_meta

    if config.audio.backend != "onnx":
        detail = (
            f"{codec_dir} is MOSS-Audio-Tokenizer-Nano, which runs on the onnx backend only: set audio.backend onnx"
        )
        return [Check("FAIL", f"codec ({config.audio.backend})", detail)]
    try:
        meta = read_nano_meta(codec_dir)
    except MossTTSError as error:
        return [Check("FAIL", "codec (onnx)", str(error))]
    graphs = ", ".join(f"{role} {path.name}" for role, path in meta.graphs.items())
    stream = f"its decode-step graph (streams decode only their new frames, {len(meta.state)} state tensors)"
    return [
        Check("ok", "stream decoder", "not used" if config.model.low_memory else stream),
        Check("ok", "codec (onnx)", f"{codec_dir}: MOSS-Audio-Tokenizer-Nano, {graphs}"),
    ]


def _check_stream_decoder(config: Any, checks: list[Check]) -> None:
    """Which decode streams use: the stream decoder graph ``audio.stream_decoder`` selects, or the windowed scheme."""
    from moss_tts_node.config import stream_decoder_path

    windowed = f"streams re-decode audio.left_context_frames ({config.audio.left_context_frames}) frames per chunk"
    path = stream_decoder_path(config)
    if path is not None:
        detail = (
            f"{path}: streams decode only their new frames, and whole utterances decode on it too, so "
            "decoder.onnx is not loaded (ONNX Runtime, CPU; the graph is checked at load)"
        )
        checks.append(Check("ok", "stream decoder", detail))
    elif config.model.low_memory:
        checks.append(Check("--", "stream decoder", "not used: model.low_memory does not stream"))
    elif config.audio.stream_decoder == "off":
        checks.append(Check("--", "stream decoder", f"audio.stream_decoder off: {windowed}"))
    else:
        build = (
            f"build {STREAM_DECODER_FILE} there with build-stream-decoder "
            '(docs/stream-decoder.md, "Building a stream decoder")'
        )
        where = config.model.codec_dir or "model.codec_dir (not set)"
        checks.append(Check("--", "stream decoder", f"none in {where}: {windowed}; {build}"))


def _check_weights(weights: Path, gguf: Path, spec: ModelSpec | MossTTSError, checks: list[Check]) -> int | None:
    """The weight files the synthesizer reads, by name (nothing is loaded); the model's codebooks, or None when
    its config.json cannot be read (``spec`` is why)."""
    if isinstance(spec, MossTTSError):
        checks.append(Check("FAIL", "weights", str(spec)))
        return None
    n_vq = spec.n_vq
    ggufs = {"backbone gguf": gguf}
    if spec.is_nano:
        ggufs["local gguf"] = gguf.with_name(nano_local_gguf_name(gguf.name))
    for what, path in ggufs.items():
        size = f"{path.stat().st_size / 1e6:,.0f} MB" if path.is_file() else "missing"
        checks.append(Check("ok" if path.is_file() else "FAIL", what, f"{path} ({size})"))
    groups = {
        "tokenizer": [Path(TOKENIZER_DIR, TOKENIZER_FILE)],
        "embeddings": [
            Path(EMBEDDINGS_DIR, name) for name in (TEXT_EMBEDDING_FILE, *map(audio_embedding_file, range(n_vq)))
        ],
    }
    for what, names in groups.items():
        found = sum((weights / name).is_file() for name in names)
        checks.append(Check("ok" if found == len(names) else "FAIL", what, f"{found}/{len(names)} files in {weights}"))
    return n_vq


def _check_model(config: Any, spec: ModelSpec, checks: list[Check]) -> None:
    """Which model the weights are (the record convert wrote), its prompt template, and the sampling in effect:
    the model's recommendation where the config leaves a key at -1 (docs/family.md, "Sampling")."""
    from moss_tts_node.config import OPTIONS, resolved_sampling
    from moss_tts_node.text.nano_prompt import NANO_PROMPT_SOURCE

    identity = spec.identity
    told = f" ({identity.evidence})" if identity.evidence else " (no record of convert's: the published MOSS-TTS-GGUF?)"
    scene = ", with a Scene field" if identity.template.has_scene else ""
    prompt = NANO_PROMPT_SOURCE if spec.is_nano else f"prompt template of {identity.template.source}{scene}"
    detail = f"{identity.name}, {spec.n_vq} codebooks{told}; {prompt}"
    checks.append(Check("ok" if identity.model is not None else "warn", "model", detail))
    in_effect = resolved_sampling(identity.sampling, config.sampling)
    values = []
    for key, option in OPTIONS.items():
        if key.startswith("sampling.") and option.unset is not None:
            name = key.removeprefix("sampling.")
            mine = getattr(config.sampling, name) != option.unset
            values.append(f"{name} {getattr(in_effect, name)}{' (config)' if mine else ''}")
    checks.append(Check("ok", "sampling", f"{', '.join(values)} (unmarked: as {identity.name} recommends)"))


def _check_heads(config: Any, environment: _Environment, spec: ModelSpec | MossTTSError, checks: list[Check]) -> None:
    """Where the audio heads (one per codebook) will run (what ``auto`` resolves to) and whether their weights are
    there; ``spec`` is the model's, or why its config.json cannot be read."""
    from moss_tts_node.config import backbone_path
    from moss_tts_node.llama.gguf import GgufHeadsInfo
    from moss_tts_node.model.heads import resolve_heads_backend

    weights, gguf = Path(config.model.weights_dir), backbone_path(config)
    try:
        carried = GgufHeadsInfo(gguf).audio_heads is not None
    except MossTTSError as error:
        checks.append(Check("FAIL", "audio heads", str(error)))
        return
    if isinstance(spec, MossTTSError):
        checks.append(Check("FAIL", "audio heads", str(spec)))
        return
    if spec.is_nano:
        checks.append(_nano_heads(config.audio.heads_backend, weights))
        return
    n_vq = spec.n_vq
    on_gpu = config.llama.n_gpu_layers != 0 and bool(environment.gpu_offload)
    backend = resolve_heads_backend(config.audio.heads_backend, carried, on_gpu)
    attach = attach_heads_command(weights, gguf.name)
    if backend == "gguf":
        if carried:
            where = "on the GPU" if on_gpu else "on the CPU"
            checks.append(Check("ok", "audio heads", f"gguf: in {gguf.name}'s output matrix, {where}"))
        else:
            checks.append(
                Check("FAIL", "audio heads", f"heads_backend gguf, but {gguf.name} does not carry them: {attach}")
            )
        return
    found = sum((weights / HEADS_DIR / audio_head_file(k)).is_file() for k in range(n_vq))
    if found < n_vq:
        checks.append(Check("FAIL", "audio heads", f"{backend}: {found}/{n_vq} files in {weights / HEADS_DIR}"))
    elif on_gpu:
        checks.append(Check("warn", "audio heads", f"{backend}, on the CPU while the layers run on the GPU: {attach}"))
    else:
        checks.append(Check("ok", "audio heads", f"{backend}: {n_vq} files in {weights / HEADS_DIR}"))


def _nano_heads(backend: str, weights: Path) -> Check:
    """MOSS-TTS-Nano's heads are its audio tables (checked with the embeddings): only the backend is to check."""
    from moss_tts_node.model.nano import nano_heads_backend

    try:
        resolved = nano_heads_backend(backend)
    except MossTTSError as error:
        return Check("FAIL", "audio heads", str(error))
    kind = "8-bit, ONNX Runtime" if resolved == "onnx" else "exact float32, NumPy"
    return Check("ok", "audio heads", f"{resolved} ({kind}): the audio tables in {weights / EMBEDDINGS_DIR}, tied")


def _check_engines(engine_dir: Path, environment: _Environment, n_vq: int | None, checks: list[Check]) -> None:
    from moss_tts_node.codec.engines import check_compatible, read_engine_set

    try:
        engines = read_engine_set(engine_dir)
    except MossTTSError as error:
        checks.append(Check("FAIL", "codec engines", str(error)))
        return
    built = f"{', '.join(engines.engines)} for {engines.gpu.name}, TensorRT {engines.tensorrt_version}"
    limits = f"up to {engines.max_seconds:g} s, {engines.n_quantizers} quantizers, {engines.precision}"
    detail = f"{engine_dir}: {built}, {limits}"
    if environment.tensorrt_version is None or environment.gpu is None:
        checks.append(Check("FAIL", "codec engines", f"{detail}; but TensorRT or the GPU is not usable here"))
        return
    try:
        check_compatible(engines, environment.tensorrt_version, environment.gpu, n_vq or engines.n_quantizers)
    except MossTTSError as error:
        checks.append(Check("FAIL", "codec engines", str(error)))
        return
    checks.append(Check("ok", "codec engines", detail))


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``doctor`` to the CLI (cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "doctor",
        help="show what is installed and usable (llama.cpp GPU, onnxruntime, TensorRT, CUDA, weights)",
        description="Check this machine's setup; with --config, also that config's weights, codec and engines.",
    )
    parser.add_argument("--config", type=Path, help="params file to check as well")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    checks = diagnose(args.config)
    width = max(len(check.what) for check in checks)
    for check in checks:
        print(f"[{check.status:>4}] {check.what:<{width}}  {check.detail}")
    failed = [check.what for check in checks if check.status == "FAIL"]
    if failed:
        print(f"doctor: {len(failed)} problem(s): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
