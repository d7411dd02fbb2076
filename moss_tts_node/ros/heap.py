"""The node's memory given back: one malloc heap for the process, trimmed when the model is freed.

Importing this module gives the process one glibc heap (``mallopt(M_ARENA_MAX, 1)``, unless ``MALLOC_ARENA_MAX``
says otherwise), which takes effect only for the threads that do not exist yet: main.py imports it before
anything else, because importing rclpy already starts threads with heaps of their own. With glibc's
per-thread heaps, what the model allocated on the threads that load it and speak with it stays spread
over heaps that ``malloc_trim`` gives back only in part: measured over configure / cleanup cycles (docs/ros.md,
"Lifecycle"), the memory left after cleanup wandered by up to 30 MiB and crept with a heap per thread, and
stayed flat with one. One synthesis runs at a time, so threads hardly ever wait for the one heap (the same
speed was measured). Elsewhere than glibc this module does nothing.
"""

from __future__ import annotations

import ctypes
import gc
import os
from pathlib import Path

M_ARENA_MAX = -8  # glibc's mallopt parameter number
_LIBC = ctypes.CDLL(None)


def release_freed_memory() -> None:
    """Collect what the freed model left unreferenced, then have glibc give the free pages of its heap back to
    the system (``malloc_trim``): without that, the process keeps much of what the model's NumPy tables and
    ONNX Runtime arenas used."""
    gc.collect()
    malloc_trim = getattr(_LIBC, "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)


def resident_mib() -> float | None:
    """This process's resident memory in MiB (Linux's /proc), or None where there is no /proc."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if kib is None else int(kib) / 1024


def _one_heap() -> None:
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(M_ARENA_MAX, 1)


_one_heap()
