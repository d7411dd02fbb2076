"""TensorRT engines of the codec: building them (``build-engines``) and the record kept beside them.

No engines are published: a TensorRT engine only loads in the TensorRT version that built it and
is tuned for one GPU, so each machine builds its own from the published ONNX files, once, with
the TensorRT Python API (no ``trtexec`` needed). Precision is TF32, never FP16: FP16 harms this
codec. The optimization profiles follow upstream's (docs/model.md, "Upstream"): encoder ``input_values`` from one frame
(1x1x1920) to ``max_seconds`` (opt 8 s), decoder ``audio_codes`` from 32x1x1 to 32x1x(12.5 x
max_seconds) (opt 100 frames); opt is clamped to max when ``max_seconds`` is small.

``n_quantizers`` (the model's codebooks: 32 for MOSS-TTS, 16 for the family's other models) is frozen into
the graph before TensorRT parses it: the graph slices by it, so TensorRT would read it as an int64 shape
tensor, which TensorRT 10.3 (JetPack 6.1/6.2) documents as int32-only; as a constant it folds away, and the
engines take one input each. So engines are built for one quantizer count (``build-engines --quantizers``),
recorded with them, and a codec opened for another count refuses them. The input shapes do not change with
it: the decoder engine still takes 32 rows of codes (those past the count are never read) and the encoder
engine still returns 32 (those past the count are zeros, and dropped).

``engines.json`` records what the engines were built with (TensorRT version, GPU, max seconds, quantizers)
so that a codec can refuse an engine built elsewhere with the reason, instead of TensorRT's
deserialization error or, worse, a silently slow engine.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from moss_tts_node.codec.base import ONNX_SOURCE
from moss_tts_node.codec.cuda import GpuInfo
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS, checked_quantizers
from moss_tts_node.errors import CodecError, WeightsError
from moss_tts_node.model.rates import MAX_CODEC_SECONDS, SAMPLES_PER_FRAME, frames_for_seconds

METADATA_FILE = "engines.json"
METADATA_FORMAT = 2  # 2: n_quantizers is frozen into the engines (format 1 engines took it as an input)
ENGINE_FILES = {"encoder": "encoder.engine", "decoder": "decoder.engine"}
DATA_INPUTS = {"encoder": "input_values", "decoder": "audio_codes"}
OPT_FRAMES = 100  # 8 s: the length most utterances' windows have
PRECISION = "tf32"


@dataclass(frozen=True)
class ProfileShapes:
    """One graph's optimization profile for its dynamic input."""

    input_name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def profile_shapes(graph: str, max_seconds: float) -> ProfileShapes:
    """The profile of ``graph`` ("encoder" or "decoder") for audio up to ``max_seconds``.

    Lengths are whole frames (the encoder takes multiples of 1920 samples), so the maximum is
    ``frames_for_seconds(max_seconds)`` frames, e.g. 500 frames / 960,000 samples for 40 s.
    """
    if max_seconds <= 0:
        raise CodecError(f"max seconds must be positive, got {max_seconds}")
    frames = frames_for_seconds(max_seconds)
    opt = min(OPT_FRAMES, frames)
    if graph == "encoder":
        return ProfileShapes(
            DATA_INPUTS[graph],
            (1, 1, SAMPLES_PER_FRAME),
            (1, 1, opt * SAMPLES_PER_FRAME),
            (1, 1, frames * SAMPLES_PER_FRAME),
        )
    if graph == "decoder":
        return ProfileShapes(
            DATA_INPUTS[graph], (CODEC_QUANTIZERS, 1, 1), (CODEC_QUANTIZERS, 1, opt), (CODEC_QUANTIZERS, 1, frames)
        )
    raise ValueError(f"unknown codec graph {graph!r}")


@dataclass(frozen=True)
class EngineSet:
    """The contents of ``engines.json``: the engines in ``directory`` and what built them."""

    directory: Path
    tensorrt_version: str
    gpu: GpuInfo
    max_seconds: float
    max_frames: int
    precision: str
    engines: dict[str, str]  # graph -> file name, only the graphs that were built
    built_at: str = ""
    n_quantizers: int = CODEC_QUANTIZERS  # frozen into the engines; records written before it held 32

    def path(self, graph: str) -> Path | None:
        """The engine file of ``graph``, or None if that graph was not built."""
        name = self.engines.get(graph)
        return None if name is None else self.directory / name

    def to_json(self) -> str:
        record = asdict(self)
        del record["directory"]
        return json.dumps({"format": METADATA_FORMAT, **record}, indent=2) + "\n"


def read_engine_set(directory: Path) -> EngineSet:
    """Read ``directory/engines.json``; WeightsError naming the fix if it or an engine is missing."""
    directory = Path(directory)
    path = directory / METADATA_FILE
    if not path.is_file():
        raise WeightsError(
            f"no TensorRT codec engines in {directory} ({METADATA_FILE} not found); build them on this machine with "
            f"`python -m moss_tts_node build-engines --encoder encoder.onnx --decoder decoder.onnx --out {directory}`"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.pop("format") != METADATA_FORMAT:
            raise ValueError(f"unknown format, expected {METADATA_FORMAT}")
        engines = EngineSet(directory=directory, **{**record, "gpu": GpuInfo(**record["gpu"])})
    except (ValueError, KeyError, TypeError) as error:
        raise WeightsError(f"{path} is not an engine record written by build-engines ({error}); rebuild") from error
    for graph in engines.engines:
        engine_path = engines.path(graph)
        if engine_path is None or not engine_path.is_file():
            raise WeightsError(f"{path} lists the {graph} engine but {engine_path} is missing; rebuild the engines")
    return engines


def check_compatible(
    engines: EngineSet, tensorrt_version: str, gpu: GpuInfo, n_quantizers: int = CODEC_QUANTIZERS
) -> None:
    """Refuse (CodecError, with the reason and the fix) engines built by another TensorRT, for another GPU, or for
    another quantizer count than the model's ``n_quantizers``."""
    rebuild = f"rebuild them here with `python -m moss_tts_node build-engines ... --out {engines.directory}`"
    if engines.n_quantizers != n_quantizers:
        raise CodecError(
            f"the codec engines in {engines.directory} were built for {engines.n_quantizers} quantizers, this model "
            f"has {n_quantizers} codebooks: an engine decodes the count it was built for; rebuild them with "
            f"`python -m moss_tts_node build-engines ... --quantizers {n_quantizers} --out <another directory>`"
        )
    if engines.tensorrt_version != tensorrt_version:
        raise CodecError(
            f"the codec engines in {engines.directory} were built with TensorRT {engines.tensorrt_version}, "
            f"this machine has TensorRT {tensorrt_version}: an engine only loads in the version that built it; "
            + rebuild
        )
    if (engines.gpu.name, engines.gpu.compute_capability) != (gpu.name, gpu.compute_capability):
        raise CodecError(
            f"the codec engines in {engines.directory} were built for {engines.gpu.name} (compute capability "
            f"{engines.gpu.compute_capability}), this machine has {gpu.name} ({gpu.compute_capability}); " + rebuild
        )


def import_tensorrt() -> ModuleType:
    """The ``tensorrt`` module, or CodecError saying how to get it."""
    try:
        import tensorrt
    except (ImportError, OSError) as error:  # OSError: the module is there but libnvinfer is not
        raise CodecError(
            f"TensorRT is not usable from this Python ({error}). On a Jetson it comes with JetPack "
            "(`sudo apt install python3-libnvinfer`, use the system Python or a venv with "
            "--system-site-packages); on a desktop GPU `pip install tensorrt-cu12`. Or set audio.backend to onnx."
        ) from error
    return tensorrt


@functools.cache
def trt_logger() -> Any:
    """The process's one TensorRT logger (TensorRT expects a single logger), warnings and errors only."""
    trt = import_tensorrt()
    return trt.Logger(trt.Logger.WARNING)


def build_engines(
    decoder_onnx: Path,
    out_dir: Path,
    max_seconds: float = MAX_CODEC_SECONDS,
    encoder_onnx: Path | None = None,
    n_quantizers: int = CODEC_QUANTIZERS,
) -> EngineSet:
    """Build the decoder (and encoder) engines for a model of ``n_quantizers`` codebooks into ``out_dir`` and
    write ``engines.json`` last.

    Each engine is written under a temporary name and renamed, and the record replaces any old
    one only once every engine is built, so an interrupted build never leaves a record that
    describes engines it does not match.
    """
    from moss_tts_node.codec.cuda import cuda_api  # needs a CUDA Python binding: import when building

    sources = {graph: Path(path) for graph, path in (("encoder", encoder_onnx), ("decoder", decoder_onnx)) if path}
    shapes = {graph: profile_shapes(graph, max_seconds) for graph in sources}  # checks max_seconds
    checked_quantizers(n_quantizers)
    for graph, onnx_path in sources.items():
        if not onnx_path.is_file():
            raise WeightsError(f"{graph} ONNX file not found: {onnx_path} (from {ONNX_SOURCE})")
    trt = import_tensorrt()
    cuda = cuda_api()
    try:
        gpu = cuda.gpu()
    finally:
        cuda.release()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built: dict[str, str] = {}
    for graph, onnx_path in sources.items():
        started = time.perf_counter()
        plan = _build_plan(trt, onnx_path, shapes[graph], n_quantizers)
        _write_atomically(out_dir / ENGINE_FILES[graph], plan)
        del plan  # GBs of host memory (shared with the GPU on a Jetson) before the next graph builds
        print(f"built {graph} engine {out_dir / ENGINE_FILES[graph]} in {time.perf_counter() - started:.0f} s")
        built[graph] = ENGINE_FILES[graph]
    engines = EngineSet(
        directory=out_dir,
        tensorrt_version=trt.__version__,
        gpu=gpu,
        max_seconds=float(max_seconds),
        max_frames=frames_for_seconds(max_seconds),
        precision=PRECISION,
        engines=built,
        built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        n_quantizers=n_quantizers,
    )
    _write_atomically(out_dir / METADATA_FILE, engines.to_json().encode())
    return engines


def _network_flags(trt: ModuleType) -> int:
    """Explicit batch: a flag TensorRT 8.x needs, 10.x deprecates (always on) and later versions drop."""
    if int(trt.__version__.split(".")[0]) >= 10:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)


def frozen_quantizers_model(onnx_path: Path, n_quantizers: int = CODEC_QUANTIZERS) -> bytes:
    """The serialized ONNX graph with its ``n_quantizers`` input replaced by that constant.

    Only the graph is read: weights kept in external data files stay where they are, and the parser
    finds them from the original path (``parse(model, path)``).
    """
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError, ValueError... for a file that is not ONNX
        raise CodecError(f"{onnx_path} is not a readable ONNX file ({error}); download it again") from error
    graph = model.graph
    names = [tensor.name for tensor in graph.input]
    if "n_quantizers" not in names or len(names) != 2:
        raise CodecError(f"{onnx_path}: graph inputs are {names}, expected the codec's data input and n_quantizers")
    kept = [tensor for tensor in graph.input if tensor.name != "n_quantizers"]
    del graph.input[:]
    graph.input.extend(kept)
    graph.initializer.append(numpy_helper.from_array(np.array(n_quantizers, dtype=np.int64), "n_quantizers"))
    return model.SerializeToString()


def _build_plan(trt: ModuleType, onnx_path: Path, shapes: ProfileShapes, n_quantizers: int) -> Any:
    """Parse one ONNX graph and build a serialized TF32 engine with ``shapes`` as its profile.

    Returns TensorRT's IHostMemory (a buffer: written to the file as it is, never copied).
    """
    logger = trt_logger()
    try:
        builder = trt.Builder(logger)
    except TypeError as error:  # pybind11's "factory function returned nullptr": no usable GPU
        raise CodecError(f"TensorRT could not start a builder ({error}): is the GPU usable?") from error
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(frozen_quantizers_model(onnx_path, n_quantizers), str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise CodecError(f"TensorRT could not parse {onnx_path}: {errors}")
    inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    if inputs != [shapes.input_name]:
        raise CodecError(f"{onnx_path}: graph inputs are {inputs}, expected {[shapes.input_name]}: not the codec's")
    config = builder.create_builder_config()
    if hasattr(trt.BuilderFlag, "TF32"):  # on by default; set so the intent survives a changed default
        config.set_flag(trt.BuilderFlag.TF32)
    profile = builder.create_optimization_profile()
    profile.set_shape(shapes.input_name, shapes.min, shapes.opt, shapes.max)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise CodecError(f"TensorRT failed to build an engine from {onnx_path}; its log above says why")
    return plan


def _write_atomically(path: Path, data: Any) -> None:
    """Write ``data`` (bytes, or a buffer such as TensorRT's IHostMemory) to a temporary file beside ``path``,
    then rename it over ``path``."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp_name, path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)


# -- the build-engines command ---------------------------------------------------------------
