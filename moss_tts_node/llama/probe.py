"""Questions asked of the installed libllama itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


def llama_supports_gpu_offload() -> bool:
    """Whether the installed llama.cpp was built with a GPU backend (asked of libllama itself)."""
    import ctypes

    from moss_tts_node.llama.bridge import llama_cpp_paths

    _, libdir = llama_cpp_paths()
    lib = ctypes.CDLL(str(libdir / "libllama.so"))
    lib.llama_supports_gpu_offload.restype = ctypes.c_bool
    return bool(lib.llama_supports_gpu_offload())
