"""What every checkpoint conversion shares (``convert.py`` for the Delay models, ``nano_convert.py`` for Nano): the
GGUF output types, the checks of the output directory and its disk, llama.cpp's quantization through the bridge,
and the progress report.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from moss_tts_node.errors import BridgeError, MossTTSError
from moss_tts_node.model.layout import CONFIG_FILE, EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR
from moss_tts_node.tools.progress import Progress

_OUTPUT_MARKERS = (CONFIG_FILE, EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR)  # besides *.gguf
_DISK_MARGIN = 1.05  # the size estimates are within a few percent; leave room for file-system overhead
GGUF_METADATA_BYTES = 1 << 20


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


def check_tensor_shapes(
    directory: Path, present: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], layout: str
) -> None:
    """Refuse missing, unexpected and wrongly shaped tensors of the checkpoint in ``directory`` (``present``: its
    tensors' shapes; ``expected``: those of the ``layout`` this converter knows), naming a few of each."""
    problems = []
    missing = [n for n in expected if n not in present]
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing ({some(missing)}): the download or the save is incomplete")
    unexpected = [n for n in present if n not in expected]
    if unexpected:
        problems.append(
            f"{len(unexpected)} unexpected tensor(s) ({some(unexpected)}): not the {layout} layout this converter knows"
        )
    wrong = [
        f"{n} is {list(present[n])}, expected {list(dims)}"
        for n, dims in expected.items()
        if n in present and tuple(present[n]) != tuple(dims)
    ]
    if wrong:
        problems.append(
            f"{len(wrong)} tensor(s) of the wrong shape ({some(wrong)}): config.json and the weights disagree"
        )
    if problems:
        raise ConversionError(f"{directory} cannot be converted: " + "; ".join(problems))


def check_row_multiples(rows: dict[str, int], gguf_type: str) -> None:
    """llama.cpp quantizes rows in blocks; refuse a type whose block does not divide every row length (``rows``:
    the model's row lengths by name)."""
    block = GGUF_TYPES[gguf_type].row_multiple
    bad = [f"{name} {size}" for name, size in rows.items() if size % block]
    if bad:
        fitting = [t for t, g in GGUF_TYPES.items() if all(size % g.row_multiple == 0 for size in rows.values())]
        raise ConversionError(
            f"{gguf_type} needs every weight row to be a multiple of {block} values, but this model has "
            f"{', '.join(bad)}: choose {' or '.join(fitting)}"
        )


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
            f"{what} needs about {gb(needed * _DISK_MARGIN)} free in {existing}, but only {gb(free)} is free: "
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
        self.fraction(done, total, f"  {percent:5.1f} %  {gb(done)} / {gb(total)}  {self.elapsed():6.1f} s  {label}")


def remove_leftovers(out_dir: Path) -> None:
    """Hidden temporary files of a conversion that was killed (an F16 intermediate can be 16 GB)."""
    if out_dir.is_dir():
        for path in out_dir.glob(".*MOSS_TTS_*.gguf*"):
            path.unlink()


def some(items: list[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def write_gguf(
    path: Path,
    gguf_type: str,
    write_direct: Callable[[Path, str], None],
    quantized_bytes: int,
    progress: ConversionProgress,
    n_threads: int = 0,
) -> None:
    """Write the GGUF ``path`` as ``gguf_type``: ``write_direct(path, dtype)`` writes it unquantized (``f16`` or
    ``f32``); a quantized type goes through an F16 intermediate, a hidden file beside ``path`` that llama.cpp
    quantizes (``quantized_bytes``: its expected size, for the progress) and that is removed whatever happens."""
    if GGUF_TYPES[gguf_type].ftype is None:
        write_direct(path, gguf_type.lower())
        return
    direct = path.with_name(f".{path.name}.f16-for-{gguf_type}.tmp")
    partial = path.with_name(f".{path.name}.partial")
    try:
        write_direct(direct, "f16")
        progress.message(f"quantizing to {gguf_type} with llama.cpp (the longest step; --verbose shows each tensor)")
        with progress.watching(partial, quantized_bytes, path.name):
            quantize_gguf(direct, partial, gguf_type, n_threads)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
        direct.unlink(missing_ok=True)
