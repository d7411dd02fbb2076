"""The few CUDA calls the TensorRT codec and the engine builder need, through pycuda or cuda-python.

Both bindings work in the device's primary CUDA context (the one llama.cpp and TensorRT use), so the
process pays for one context.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from moss_tts_node.errors import CodecError

CUDA_APIS = ("pycuda", "cuda-python")


@dataclass(frozen=True)
class GpuInfo:
    """What identifies a GPU to TensorRT: engines are tuned for one device model."""

    name: str
    compute_capability: str  # "8.7" (Jetson Orin), "9.0" (H100/H200)
    memory_bytes: int = 0  # informative only; not compared


class CudaApi(ABC):
    """The few CUDA calls the codec needs. Each instance owns what it allocates; ``release`` frees it."""

    name: str

    @abstractmethod
    def gpu(self) -> GpuInfo:
        """Name and compute capability of device 0."""

    @abstractmethod
    @contextmanager
    def active(self) -> Iterator[None]:
        """Make the primary context current on the calling thread for the duration."""

    @abstractmethod
    def new_stream(self) -> int:
        """A new CUDA stream's handle."""

    @abstractmethod
    def device_buffer(self, nbytes: int) -> int:
        """Device memory of ``nbytes``; its address."""

    @abstractmethod
    def pinned_array(self, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        """Page-locked host memory as a (count,) array, so copies can run asynchronously."""

    @abstractmethod
    def to_device(self, address: int, host: np.ndarray, stream: int) -> None:
        """Queue a copy of ``host`` (pinned, contiguous) to device ``address`` on ``stream``."""

    @abstractmethod
    def to_host(self, host: np.ndarray, address: int, stream: int) -> None:
        """Queue a copy from device ``address`` into ``host`` (pinned, contiguous) on ``stream``."""

    @abstractmethod
    def synchronize(self, stream: int) -> None:
        """Wait until everything queued on ``stream`` is done."""

    @abstractmethod
    def release(self) -> None:
        """Free every buffer and stream this instance made. Call it on the thread that made the instance:
        pycuda lets go of the primary context only there (elsewhere it leaks one reference to it)."""


class _PyCuda(CudaApi):
    name = "pycuda"

    def __init__(self) -> None:
        import pycuda.driver as cuda

        self._cuda = cuda
        try:
            cuda.init()
            if cuda.Device.count() == 0:
                raise CodecError("no CUDA GPU found (pycuda sees 0 devices)")
            self._device = cuda.Device(0)
            self._context = self._device.retain_primary_context()
        except cuda.Error as error:
            raise CodecError(f"CUDA is not usable: {error}") from error
        self._owned: list[Any] = []
        self._streams: dict[int, Any] = {}

    def gpu(self) -> GpuInfo:
        major, minor = self._device.compute_capability()
        return GpuInfo(self._device.name(), f"{major}.{minor}", int(self._device.total_memory()))

    @contextmanager
    def active(self) -> Iterator[None]:
        self._context.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def new_stream(self) -> int:
        stream = self._cuda.Stream()
        self._streams[stream.handle] = stream
        return int(stream.handle)

    def device_buffer(self, nbytes: int) -> int:
        allocation = self._cuda.mem_alloc(max(nbytes, 1))
        self._owned.append(allocation)
        return int(allocation)

    def pinned_array(self, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        array = self._cuda.pagelocked_empty(max(count, 1), dtype)
        self._owned.append(array.base)
        return array

    def to_device(self, address: int, host: np.ndarray, stream: int) -> None:
        self._cuda.memcpy_htod_async(address, host, self._streams[stream])

    def to_host(self, host: np.ndarray, address: int, stream: int) -> None:
        self._cuda.memcpy_dtoh_async(host, address, self._streams[stream])

    def synchronize(self, stream: int) -> None:
        self._streams[stream].synchronize()

    def release(self) -> None:
        with self.active():
            for memory in self._owned:
                memory.free()
            self._owned.clear()
            self._streams.clear()
        self._context.detach()


class _CudaPython(CudaApi):
    name = "cuda-python"

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        except ImportError:
            from cuda import cudart  # older cuda-python

        self._rt = cudart
        try:
            count = self._call(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
        except RuntimeError as error:  # cuda-python 12.x without a driver: "Failed to dlopen libcuda.so.1"
            raise CodecError(f"CUDA is not usable: {error}") from error
        except CodecError as error:
            if "InsufficientDriver" in str(error):
                raise CodecError(
                    f"{error}: no NVIDIA driver, or one older than this cuda-python's CUDA; with a CUDA 12 "
                    "driver (JetPack 6) run `pip install 'cuda-python>=12,<13'`"
                ) from error
            raise
        if count == 0:
            raise CodecError("no CUDA GPU found (the CUDA runtime sees 0 devices)")
        self._device: list[int] = []
        self._host: list[int] = []
        self._streams: dict[int, Any] = {}

    def _call(self, result: tuple[Any, ...], what: str) -> Any:
        """Unpack a cuda-python (error, value...) tuple, raising CodecError on failure."""
        error, *values = result
        if error != self._rt.cudaError_t.cudaSuccess:
            name = self._rt.cudaGetErrorName(error)[1]
            raise CodecError(f"CUDA {what} failed: {name.decode() if isinstance(name, bytes) else name}")
        return values[0] if len(values) == 1 else None

    def gpu(self) -> GpuInfo:
        props = self._call(self._rt.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
        return GpuInfo(name.rstrip("\x00"), f"{props.major}.{props.minor}", int(props.totalGlobalMem))

    @contextmanager
    def active(self) -> Iterator[None]:
        yield  # the runtime API binds the primary context on every thread by itself

    def new_stream(self) -> int:
        stream = self._call(self._rt.cudaStreamCreate(), "cudaStreamCreate")
        self._streams[int(stream)] = stream
        return int(stream)

    def device_buffer(self, nbytes: int) -> int:
        address = int(self._call(self._rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self._device.append(address)
        return address

    def pinned_array(self, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        nbytes = max(count, 1) * dtype.itemsize
        address = int(self._call(self._rt.cudaMallocHost(nbytes), "cudaMallocHost"))
        self._host.append(address)
        raw = (ctypes.c_uint8 * nbytes).from_address(address)
        return np.frombuffer(raw, dtype=dtype)

    def to_device(self, address: int, host: np.ndarray, stream: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call(
            self._rt.cudaMemcpyAsync(address, host.ctypes.data, host.nbytes, kind, self._streams[stream]), "copy"
        )

    def to_host(self, host: np.ndarray, address: int, stream: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call(
            self._rt.cudaMemcpyAsync(host.ctypes.data, address, host.nbytes, kind, self._streams[stream]), "copy"
        )

    def synchronize(self, stream: int) -> None:
        self._call(self._rt.cudaStreamSynchronize(self._streams[stream]), "cudaStreamSynchronize")

    def release(self) -> None:
        for address in self._device:
            self._rt.cudaFree(address)
        for address in self._host:
            self._rt.cudaFreeHost(address)
        for stream in self._streams.values():
            self._rt.cudaStreamDestroy(stream)
        self._device.clear()
        self._host.clear()
        self._streams.clear()


_APIS: dict[str, type[CudaApi]] = {"pycuda": _PyCuda, "cuda-python": _CudaPython}


def cuda_api(which: str = "auto") -> CudaApi:
    """A CUDA binding: ``pycuda``, ``cuda-python``, or ``auto`` (pycuda if installed, else cuda-python).

    Raises CodecError when the binding is missing or no GPU is usable.
    """
    if which not in ("auto", *CUDA_APIS):
        raise ValueError(f"unknown CUDA binding {which!r}; use auto, {', '.join(CUDA_APIS)}")
    missing = []
    for name in CUDA_APIS if which == "auto" else (which,):
        try:
            return _APIS[name]()  # imports its module first
        except ImportError as error:
            missing.append(f"{name} ({error})")
    raise CodecError(
        f"no CUDA Python binding for TensorRT's buffers: {'; '.join(missing)}. Install pycuda "
        "(`pip install pycuda`; it builds against the CUDA toolkit, part of JetPack) or cuda-python of the "
        "driver's CUDA major version (JetPack 6: `pip install 'cuda-python>=12,<13'`)"
    )
