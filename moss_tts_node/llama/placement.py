"""Where llama.cpp keeps a model's weight matrices on the CPU, chosen from what this llama.cpp offers on this CPU.

llama.cpp's CPU backend can hold weights in "extra" buffer types, each a layout with kernels of its own, and puts
each matrix in the first one that takes it (bridge/moss_bridge.h, "the CPU's extra buffer types"): ``CPU_REPACK``
interleaves quantized rows for the CPU's SIMD width (the fastest steps on x86-64 and Arm alike), ``AMX`` uses Intel's
matrix tiles, where the library was built with AMX and the CPU has it. With this llama.cpp, AMX's matrix kernel
segfaults on quantized weights at the first decode on some Xeons (llama.cpp issue 20824, closed unfixed), so it is
skipped wherever it is offered and its matrices go to ``CPU_REPACK``: the layout a library built without AMX uses,
as ``make`` builds it (docs/install.md, "Intel CPUs with AMX"). ``llama.repack`` false keeps the GGUF's own
layout for every matrix (llama-cli's ``--no-repack``): quicker to load and to prefill, slower per step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from moss_tts_node.llama.bindings import cpu_extra_buffer_types, skip_cpu_extra_buffer_type

# Extra buffer types whose kernels crash with this llama.cpp on some machines that offer them, and why.
UNSAFE_BUFFER_TYPES = {
    "AMX": "its matrix kernel segfaults on quantized weights on some Xeons (llama.cpp issue 20824)",
}


@dataclass(frozen=True)
class WeightPlacement:
    """Which of llama.cpp's CPU weight layouts a model loaded here may use, and why."""

    offered: tuple[str, ...]  # the extra buffer types this llama.cpp has on this CPU, in its order of preference
    repack: bool  # llama.repack

    @property
    def skipped(self) -> tuple[str, ...]:
        """The offered types that no model may use: hidden from llama.cpp's loader whatever ``repack`` says."""
        return tuple(name for name in self.offered if name in UNSAFE_BUFFER_TYPES)

    @property
    def used(self) -> tuple[str, ...]:
        """The types llama.cpp may put weights in, besides plain CPU memory."""
        return tuple(name for name in self.offered if name not in self.skipped) if self.repack else ()

    def reason(self) -> str:
        """Why the weights sit where they do, in a clause ("llama.cpp's CPU_REPACK layout ...; AMX skipped: ...")."""
        if self.used:
            layout = f"llama.cpp's {', '.join(self.used)} layout where it takes a matrix, the GGUF's elsewhere"
        elif not self.repack:
            layout = "the GGUF's own layout: llama.repack is false"
        else:
            layout = "the GGUF's own layout: this llama.cpp offers no other on this CPU"
        skipped = [f"{name} skipped: {UNSAFE_BUFFER_TYPES[name]}" for name in self.skipped]
        return "; ".join([layout, *skipped])


@functools.cache
def _offered_with_unsafe_skipped() -> tuple[str, ...]:
    """The extra buffer types this llama.cpp offers, read once per process, the unsafe ones then hidden from its
    loader for the rest of the process (every loader: the bridge, and llama-cpp-python's bindings in bench)."""
    offered = cpu_extra_buffer_types()
    for name in WeightPlacement(offered, repack=True).skipped:
        skip_cpu_extra_buffer_type(name)
    return offered


def cpu_weight_placement(repack: bool) -> WeightPlacement:
    """The placement of the models this process loads with ``llama.repack`` = ``repack``; call it before any load."""
    return WeightPlacement(_offered_with_unsafe_skipped(), repack)
