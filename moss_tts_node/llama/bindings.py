"""Every C function moss_tts_node calls in llama.cpp, declared once, with the C enums it passes.

Three libraries, all from the installed llama-cpp-python: the bridge (bridge/moss_bridge.c, built by
``llama/bridge.py``), libllama (the bridge links it, so the bridge's handle resolves its symbols too) and
libggml-base (row quantization for attach-heads). Nothing is loaded at import: the first call that needs a
library loads it, once per process.

The bridge's params struct and enums are mirrored here by hand, so the bridge carries an ABI version
(``moss_bridge_abi_version()``, ``MOSS_BRIDGE_ABI_VERSION`` in moss_bridge.h) that must equal
``MOSS_BRIDGE_ABI_VERSION`` below: a library built from other sources is refused at load, with the reason,
instead of being called with the wrong layout.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
from typing import Protocol

from moss_tts_node.errors import BridgeError
from moss_tts_node.llama.bridge import BRIDGE_LIB_ENV, bridge_library_path, llama_cpp_paths

# Bump it together with moss_bridge.h's whenever a struct, enum or signature below changes.
MOSS_BRIDGE_ABI_VERSION = 3


class Status(enum.IntEnum):
    """``enum moss_bridge_status``."""

    OK = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_MODEL_LOAD = 2
    ERR_CONTEXT_CREATE = 3
    ERR_CONTEXT_FULL = 4
    ERR_DECODE = 5
    ERR_NO_OUTPUT = 6
    ERR_ALLOC = 7
    ERR_QUANTIZE = 8


# The KV cache types of choices.KV_CACHE_TYPES as enum ggml_type values (ggml.h).
GGML_TYPES = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "iq4_nl": 20,
}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # choices.FLASH_ATTN_MODES as enum llama_flash_attn_type


class MossBridgeParams(ctypes.Structure):
    """``struct moss_bridge_params`` (same field order and types)."""

    _fields_ = (
        ("model_path", ctypes.c_char_p),
        ("n_ctx", ctypes.c_int32),
        ("n_batch", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("n_threads_batch", ctypes.c_int32),
        ("n_gpu_layers", ctypes.c_int32),
        ("type_k", ctypes.c_int32),
        ("type_v", ctypes.c_int32),
        ("flash_attn", ctypes.c_int32),
        ("extra_bufts", ctypes.c_int32),
    )


_Signatures = dict[str, tuple[type | None, list[type]]]
_HANDLE, _STATUS = ctypes.c_void_p, ctypes.c_int32
_FLOATS, _INT_OUT = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)

_BRIDGE: _Signatures = {
    "moss_bridge_abi_version": (ctypes.c_int32, []),
    "moss_bridge_default_params": (MossBridgeParams, []),
    "moss_bridge_create": (_STATUS, [ctypes.POINTER(MossBridgeParams), ctypes.POINTER(_HANDLE)]),
    "moss_bridge_free": (None, [_HANDLE]),
    "moss_bridge_n_embd": (_STATUS, [_HANDLE, _INT_OUT]),
    "moss_bridge_n_vocab": (_STATUS, [_HANDLE, _INT_OUT]),
    "moss_bridge_n_ctx": (_STATUS, [_HANDLE, _INT_OUT]),
    "moss_bridge_n_pos": (_STATUS, [_HANDLE, _INT_OUT]),
    "moss_bridge_prefill": (_STATUS, [_HANDLE, _FLOATS, ctypes.c_int32]),
    "moss_bridge_decode": (_STATUS, [_HANDLE, _FLOATS]),
    "moss_bridge_get_hidden": (_STATUS, [_HANDLE, _FLOATS]),
    "moss_bridge_get_text_logits": (_STATUS, [_HANDLE, _FLOATS]),
    "moss_bridge_clear": (_STATUS, [_HANDLE]),
    "moss_bridge_truncate": (_STATUS, [_HANDLE, ctypes.c_int32]),
    "moss_bridge_set_text_logits": (_STATUS, [_HANDLE, ctypes.c_int32]),
    "moss_bridge_status_string": (ctypes.c_char_p, [_STATUS]),
    "moss_bridge_last_error": (ctypes.c_char_p, [_HANDLE]),
    "moss_bridge_weight_buffers": (ctypes.c_char_p, [_HANDLE]),
    "moss_bridge_cpu_extra_buft_count": (ctypes.c_int32, []),
    "moss_bridge_cpu_extra_buft_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "moss_bridge_skip_cpu_extra_buft": (_STATUS, [ctypes.c_char_p]),
    "moss_bridge_set_verbose": (_STATUS, [ctypes.c_int32]),
    "moss_bridge_quantize": (_STATUS, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]),
}
_LLAMA: _Signatures = {
    "llama_supports_gpu_offload": (ctypes.c_bool, []),
    "llama_print_system_info": (ctypes.c_char_p, []),
}
_GGML_BASE: _Signatures = {
    # type, src (float32 rows), dst, start, nrows, n_per_row, imatrix -> bytes written
    "ggml_quantize_chunk": (
        ctypes.c_size_t,
        [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        ],
    ),
}


def _declare(lib: ctypes.CDLL, signatures: _Signatures, what: str) -> None:
    for name, (restype, argtypes) in signatures.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise BridgeError(f"{what} {lib._name} lacks {name}: it is out of date, rebuild it") from None
        function.restype = restype
        function.argtypes = argtypes


class _Versioned(Protocol):
    _name: str

    def moss_bridge_abi_version(self) -> int: ...


def check_abi_version(lib: _Versioned) -> None:
    """Refuse a bridge library whose ABI version is not this package's (BridgeError saying how to fix it)."""
    found = lib.moss_bridge_abi_version()
    if found != MOSS_BRIDGE_ABI_VERSION:
        raise BridgeError(
            f"the llama.cpp bridge {lib._name} has ABI version {found}, but this moss_tts_node needs "
            f"{MOSS_BRIDGE_ABI_VERSION}: it was built from other sources; rebuild it from this package's "
            f"bridge/ (or unset {BRIDGE_LIB_ENV} to let moss_tts_node build it)"
        )


@functools.cache
def load_bridge_library() -> ctypes.CDLL:
    """The bridge, with its functions and libllama's declared and its ABI version checked (once)."""
    path = bridge_library_path()
    # llama.cpp's CPU threads are OpenMP threads (libgomp, loaded with the bridge), which by default spin
    # ~300k rounds after each decode and take a core from the audio heads that run next (measured: heads
    # 2.0 -> 3.5 ms a step). 10k rounds still bridge the waits between a decode's ops (0 would not: its
    # barriers would sleep, 29 -> 44 ms a decode). Read by libgomp when it loads; a user's value wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise BridgeError(f"cannot load the llama.cpp bridge {path}: {error}") from error
    try:
        lib.moss_bridge_abi_version.restype = ctypes.c_int32
    except AttributeError:
        raise BridgeError(
            f"the llama.cpp bridge {path} has no ABI version (moss_bridge_abi_version): it predates this "
            f"moss_tts_node; rebuild it from this package's bridge/ (or unset {BRIDGE_LIB_ENV})"
        ) from None
    check_abi_version(lib)
    _declare(lib, _BRIDGE, "the bridge library")
    _declare(lib, _LLAMA, "the libllama linked by the bridge")
    return lib


@functools.cache
def load_ggml_base_library() -> ctypes.CDLL:
    """llama-cpp-python's libggml-base, with the functions used here declared (once)."""
    _, libdir = llama_cpp_paths()
    path = libdir / "libggml-base.so"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise BridgeError(f"cannot load {path}: {error}") from error
    _declare(lib, _GGML_BASE, "libggml-base")
    return lib


def status_error(lib: ctypes.CDLL, status: int, handle: ctypes.c_void_p | None) -> str:
    """'MOSS_BRIDGE_ERR_...: detail' for a failed call (``handle`` None: a create or quantize call)."""
    detail = lib.moss_bridge_last_error(handle).decode(errors="replace")
    return f"{lib.moss_bridge_status_string(status).decode()}: {detail}"


def llama_supports_gpu_offload() -> bool:
    """Whether the installed llama.cpp was built with a GPU backend (asked of libllama itself)."""
    return bool(load_bridge_library().llama_supports_gpu_offload())


def llama_system_info() -> str:
    """llama.cpp's own one-line summary of the CPU features and backends it was built with."""
    return load_bridge_library().llama_print_system_info().decode(errors="replace").strip(" |")


def cpu_extra_buffer_types() -> tuple[str, ...]:
    """The CPU's extra buffer types llama.cpp's loader considers now, in its order of preference ("CPU_REPACK")."""
    lib = load_bridge_library()
    return tuple(lib.moss_bridge_cpu_extra_buft_name(i).decode() for i in range(lib.moss_bridge_cpu_extra_buft_count()))


def skip_cpu_extra_buffer_type(name: str) -> None:
    """Hide one of them from every model loaded after this in the process (moss_bridge_skip_cpu_extra_buft)."""
    if load_bridge_library().moss_bridge_skip_cpu_extra_buft(name.encode()) != Status.OK:
        raise BridgeError(f"llama.cpp has no CPU buffer type {name!r} to skip (it offers {cpu_extra_buffer_types()})")
