"""The codec run by TensorRT engines (``build-engines``): the Jetson backend behind ``AudioCodec``.

On a Jetson the ~1.6 B-parameter codec is too slow in ONNX Runtime; TensorRT runs it from
engines built on the board itself (see ``engines.py``). This backend:

- refuses engines built by another TensorRT version or for another GPU, saying so, before
  TensorRT would fail with a cryptic deserialization error;
- uses TensorRT's tensor-name API (``set_input_shape``, ``set_tensor_address``,
  ``execute_async_v3``), which TensorRT 8.6 (JetPack 6.0) and 10.x (JetPack 6.1+) share;
- allocates every device and pinned host buffer once, at the engine profile's largest shape,
  and reuses them: a call copies in, runs and copies out, with no allocation;
- takes input and output dtypes from the engine (TensorRT 8.6 turns the graphs' int64 into int32);
- passes ``n_quantizers`` from host memory when TensorRT reads it as a shape value.

Device memory comes from pycuda (the usual choice on Jetson: ``pip install pycuda`` builds
against JetPack's CUDA) or, when pycuda is absent, NVIDIA's cuda-python (binary wheels, needs
only the driver). Both work in the device's primary CUDA context, the one llama.cpp and
TensorRT use, so the process pays for one context, and any thread may call the codec.
"""

from __future__ import annotations

import math
import mmap
import threading
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.base import PUBLISHED_ATTENTION_SPAN_FRAMES, AudioCodec
from moss_tts_node.codec.cuda import CudaApi, cuda_api
from moss_tts_node.codec.engines import (
    DATA_INPUTS,
    check_compatible,
    import_tensorrt,
    read_engine_set,
    trt_logger,
)
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS, checked_quantizers
from moss_tts_node.errors import CodecError


def _deserialize(trt: Any, path: Path) -> Any:
    """The engine in ``path``, read through a memory map: an engine is GBs, and a bytes copy beside what
    TensorRT allocates would double the peak (on a Jetson, in the memory the GPU shares)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return trt.Runtime(trt_logger()).deserialize_cuda_engine(mapped)


class _EngineRunner:
    """One deserialized engine with its context, stream and buffers sized for the profile's largest shape."""

    def __init__(self, path: Path, graph: str, cuda: CudaApi) -> None:
        self.path = path
        self._cuda: CudaApi | None = cuda
        self._lock = threading.Lock()  # an execution context runs one inference at a time
        self._data = DATA_INPUTS[graph]
        self._engine: Any = None
        self._context: Any = None
        try:
            self._load(graph)
        except BaseException:
            self.release()
            raise

    def _load(self, graph: str) -> None:
        trt = import_tensorrt()
        cuda = self._cuda
        assert cuda is not None
        with cuda.active():
            engine = self._engine = _deserialize(trt, self.path)
            if engine is None:
                raise CodecError(f"TensorRT could not load {self.path} (its log above says why); rebuild the engines")
            context = self._context = engine.create_execution_context()
            names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
            inputs = sorted(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
            self._outputs = [n for n in names if n not in inputs]
            if inputs != [self._data] or len(self._outputs) < 2:
                raise CodecError(f"{self.path}: engine tensors {names} are not those of the codec's {graph}")
            self.max_shape = tuple(engine.get_tensor_profile_shape(self._data, 0)[2])
            self._stream = cuda.new_stream()
            context.set_input_shape(self._data, self.max_shape)
            self._buffers: dict[str, tuple[np.ndarray, int]] = {}
            for name in (self._data, *self._outputs):
                shape = tuple(context.get_tensor_shape(name))
                if min(shape, default=0) < 0:
                    raise CodecError(f"{self.path}: {name} has shape {shape} at the largest input; not the codec")
                host = cuda.pinned_array(math.prod(shape), np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
                address = cuda.device_buffer(host.nbytes)
                context.set_tensor_address(name, address)
                self._buffers[name] = (host, address)

    @property
    def max_frames(self) -> int:
        """Longest input in frames: the profile's maximum (encoder: samples / 1920)."""
        length = self.max_shape[2]
        return length if self._data == DATA_INPUTS["decoder"] else length // AudioCodec.samples_per_frame

    def run(self, data: np.ndarray) -> list[np.ndarray]:
        """Run on ``data`` (batch 1, within the profile); the outputs in engine order, copied out."""
        with self._lock:
            cuda, context = self._cuda, self._context
            if cuda is None:
                raise CodecError(f"{self.path}: this engine was released")
            with cuda.active():
                if not context.set_input_shape(self._data, data.shape):
                    raise CodecError(f"{self.path}: input shape {data.shape} is outside the engine's profile")
                host, address = self._buffers[self._data]
                staged = host[: data.size]
                staged[:] = data.reshape(-1)  # casts to the engine's dtype (int32 codes in TensorRT 8.6)
                cuda.to_device(address, staged, self._stream)
                if not context.execute_async_v3(self._stream):
                    raise CodecError(f"TensorRT failed to run {self.path} (its log above says why)")
                results = []
                for name in self._outputs:
                    shape = tuple(context.get_tensor_shape(name))
                    host, address = self._buffers[name]
                    result = host[: math.prod(shape)]
                    cuda.to_host(result, address, self._stream)
                    results.append(result.reshape(shape))
                cuda.synchronize(self._stream)
                return [result.copy() for result in results]

    def release(self) -> None:
        """Free the engine, its context and its buffers (once; later calls do nothing)."""
        with self._lock:
            if self._cuda is None:
                return
            with self._cuda.active():
                self._context = None  # the context before the engine it came from
                self._engine = None
            self._cuda.release()
            self._cuda = None


class TensorRTCodec(AudioCodec):
    """The codec run by the TensorRT engines in ``engine_dir`` (made by ``build-engines``).

    Opening checks ``engines.json`` against this machine's TensorRT and GPU and loads the
    decoder engine, so a wrong or stale engine fails at start-up. The encoder engine, needed
    only to clone voices from clips, loads on first use. ``encoder``/``decoder`` = False leave
    a graph out (``low_memory`` holds one at a time); opened without its decoder it loads the
    encoder at once, unless ``encoder_optional`` (beside a stream decoder). ``max_frames`` (from config) can lower
    the engines' own limit; longer audio is windowed either way, overlapping by a multiple of
    ``attention_span_frames`` (``read_attention_span``). ``cuda``: which CUDA binding
    (``auto``, ``pycuda``, ``cuda-python``). ``n_quantizers``: the model's codebooks, which must be those the
    engines were built for (``engines.json`` records it).
    """

    def __init__(
        self,
        engine_dir: Path,
        *,
        encoder: bool = True,
        decoder: bool = True,
        encoder_optional: bool = False,
        max_frames: int | None = None,
        attention_span_frames: int = PUBLISHED_ATTENTION_SPAN_FRAMES,
        cuda: str = "auto",
        n_quantizers: int = CODEC_QUANTIZERS,
    ) -> None:
        self._runners: dict[str, _EngineRunner] = {}  # set first: close() must work if __init__ fails
        self._lock = threading.Lock()
        self._closed = False
        self.max_frames = max_frames
        self.attention_span_frames = attention_span_frames
        self.n_quantizers = checked_quantizers(n_quantizers)
        trt = import_tensorrt()
        self._engines = read_engine_set(Path(engine_dir))
        self._cuda = cuda
        probe = cuda_api(cuda)
        try:
            check_compatible(self._engines, trt.__version__, probe.gpu(), self.n_quantizers)
        finally:
            probe.release()
        self._wanted = {"encoder": encoder, "decoder": decoder}
        if decoder:
            self._runner("decoder")
        elif encoder and not encoder_optional:
            self._runner("encoder")  # opened to encode only: fail now if there is no encoder engine

    @property
    def engine_dir(self) -> Path:
        return self._engines.directory

    def close(self) -> None:
        """Free the engines and their device memory."""
        with self._lock:
            self._closed = True
            runners, self._runners = self._runners, {}
        for runner in runners.values():
            runner.release()

    def _frame_limit(self, graph: str) -> int | None:
        limit = self._runner(graph).max_frames
        return limit if self.max_frames is None else min(limit, self.max_frames)

    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        runner = self._runner("encoder")
        codes, lengths = runner.run(waveform[None, None, :])[:2]
        return self._codes_from_graph(codes, lengths, waveform.shape[0] // self.samples_per_frame, runner.path)

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        runner = self._runner("decoder")
        audio, lengths = runner.run(self._graph_codes(codes))[:2]
        return self._samples_from_graph(audio, lengths, codes.shape[0], runner.path)

    def _runner(self, graph: str) -> _EngineRunner:
        """The engine of ``graph``, loaded on first use; CodecError if it was left out or never built."""
        with self._lock:
            if self._closed:
                raise CodecError("this codec was closed; create a new TensorRTCodec")
            runner = self._runners.get(graph)
            if runner is not None:
                return runner
            path = self._engines.path(graph)
            if not self._wanted[graph]:
                raise CodecError(f"this codec was opened without its {graph}; open one with {graph}=True")
            if path is None:
                raise CodecError(
                    f"{self.engine_dir} has no {graph} engine: build it with `build-engines --{graph} {graph}.onnx`"
                    + (", or use voices encoded with encode-voice" if graph == "encoder" else "")
                )
            runner = self._runners[graph] = _EngineRunner(path, graph, cuda_api(self._cuda))
            return runner
