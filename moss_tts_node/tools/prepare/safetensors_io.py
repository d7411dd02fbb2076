"""Read (and, for test models, write) Hugging Face safetensors checkpoints tensor by tensor, torch-free.

The format is simple: an 8-byte little-endian header length, a JSON header mapping each tensor name to
its ``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), then the raw
little-endian data. We parse it ourselves rather than through the ``safetensors`` package because its
NumPy mode cannot return bfloat16, the dtype MOSS-TTS-Delay is published in, and because reading a
tensor in chunks is what keeps an 8B conversion's memory at one tensor: NumPy has no bfloat16
either, so a chunk's 16-bit words are widened to float32 (a bfloat16 is the upper half of a float32)
and cast to the requested dtype into the output array.

A checkpoint is a directory holding ``model.safetensors``, or ``model.safetensors.index.json`` whose
``weight_map`` names the shard of each tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from moss_tts_node.errors import WeightsError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# safetensors dtype -> how its words are stored; BF16 is read as uint16 and widened.
_STORAGE = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit; a larger value means the file is not safetensors
_CHUNK_BYTES = 64 * 1024 * 1024  # raw bytes read per step: bounds the temporaries next to the output array


class SafetensorsError(WeightsError):
    """The checkpoint files are missing, truncated, or not safetensors; the message names the file."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, the absolute byte offset of its data, dtype and shape."""

    name: str
    dtype: str  # "BF16", "F16" or "F32"
    shape: tuple[int, ...]
    path: Path
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _STORAGE[self.dtype].itemsize


def bfloat16_to_float32(words: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 words (uint16) to float32 exactly: shift them into the upper half of 32 bits."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 words (uint16), nearest-even as PyTorch does; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


class SafetensorsCheckpoint:
    """The tensors of a checkpoint directory, indexed from the file headers; data is read on demand."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        index_path = self.directory / INDEX_NAME
        if index_path.is_file():
            weight_map = _read_weight_map(index_path)
            shards = sorted(set(weight_map.values()))
        elif (self.directory / SINGLE_NAME).is_file():
            weight_map, shards = {}, [SINGLE_NAME]
        else:
            raise SafetensorsError(
                f"{self.directory}: no {SINGLE_NAME} or {INDEX_NAME}; point at the checkpoint directory "
                "that holds the model's safetensors files"
            )
        self.tensors: dict[str, TensorInfo] = {}
        for shard in shards:
            path = self.directory / shard
            if not path.is_file():
                raise SafetensorsError(f"{index_path} names the shard {shard}, which is missing: download it again")
            for info in _read_header(path):
                if info.name in self.tensors:
                    raise SafetensorsError(
                        f"tensor {info.name} is stored twice ({self.tensors[info.name].path.name}, "
                        f"{path.name}); the checkpoint is inconsistent"
                    )
                self.tensors[info.name] = info
        for name, shard in weight_map.items():
            if name not in self.tensors or self.tensors[name].path.name != shard:
                raise SafetensorsError(f"{index_path} says {name} is in {shard}, but that shard does not hold it")

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's shape, by name."""
        return {name: tuple(info.shape) for name, info in self.tensors.items()}

    @property
    def nbytes(self) -> int:
        """Total size of the tensor data."""
        return sum(info.nbytes for info in self.tensors.values())

    def read(self, name: str, dtype: np.dtype | type = np.float32) -> np.ndarray:
        """The tensor as a new ``dtype`` array, converted chunk by chunk straight into it.

        Raises ``SafetensorsError`` when the values do not fit ``dtype`` (float16 overflow) or are not
        finite: a weight that is inf or NaN would poison every output silently.
        """
        info = self.tensors[name]
        out = np.empty(info.shape, dtype=dtype)
        flat = out.reshape(-1)
        limit = float(np.finfo(out.dtype).max)
        for start, chunk in self._chunks(info):
            low, high = float(chunk.min()), float(chunk.max())
            if not (np.isfinite(low) and np.isfinite(high)):
                raise SafetensorsError(f"tensor {name} holds inf or NaN values; the checkpoint is damaged")
            if max(-low, high) > limit:
                raise SafetensorsError(
                    f"tensor {name} holds values up to {max(-low, high):.3g}, beyond {out.dtype} (max {limit:.3g})"
                )
            flat[start : start + chunk.size] = chunk
        return out

    def _chunks(self, info: TensorInfo) -> Iterator[tuple[int, np.ndarray]]:
        """(first element index, float32 values) pieces of at most ``_CHUNK_BYTES`` raw bytes."""
        storage = _STORAGE[info.dtype]
        total = info.nbytes // storage.itemsize
        step = max(1, _CHUNK_BYTES // storage.itemsize)
        with info.path.open("rb") as f:
            f.seek(info.offset)
            for start in range(0, total, step):
                words = _read_exact(f, storage, min(step, total - start), info)
                yield start, bfloat16_to_float32(words) if info.dtype == "BF16" else words.astype(np.float32)


def _read_exact(f: BinaryIO, storage: np.dtype, count: int, info: TensorInfo) -> np.ndarray:
    words = np.fromfile(f, dtype=storage, count=count)
    if words.size != count:
        raise SafetensorsError(f"{info.path}: ends inside tensor {info.name}; the file is truncated, download it again")
    return words


def _read_weight_map(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{index_path}: not a readable JSON index ({exc})") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise SafetensorsError(f"{index_path}: no 'weight_map' of tensor names to shard files")
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:
            raise SafetensorsError(f"{index_path}: shard {shard!r} is not a file name in the checkpoint directory")
    return weight_map


def _read_header(path: Path) -> list[TensorInfo]:
    """Parse and check one file's header: known dtypes, sizes that match shapes, data inside the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(_MAX_HEADER, size - 8):
            raise SafetensorsError(f"{path}: not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsError(f"{path}: not a safetensors file (unreadable JSON header: {exc})") from exc
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: not a safetensors file (the header is not a JSON object)")
    data_start = 8 + length
    infos = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise SafetensorsError(f"{path}: malformed header entry for {name}") from exc
        if dtype not in _STORAGE:
            raise SafetensorsError(
                f"{path}: tensor {name} is {dtype}; only BF16, F16 and F32 checkpoints can be converted"
            )
        info = TensorInfo(name=name, dtype=dtype, shape=shape, path=path, offset=data_start + begin)
        if end - begin != info.nbytes or begin < 0 or data_start + end > size:
            raise SafetensorsError(
                f"{path}: tensor {name} ({dtype}{list(shape)}) does not fit its data range {begin}..{end} "
                f"of a {size}-byte file; the file is damaged or truncated"
            )
        infos.append(info)
    return infos


def write_safetensors(path: Path | str, tensors: Mapping[str, np.ndarray], dtype: str) -> None:
    """Write float arrays to one safetensors file, stored as ``dtype`` (BF16, F16 or F32).

    For test and demo checkpoints: tensors are written in the given order, the header padded to a
    multiple of 8 bytes with spaces, as the reference implementation does.
    """
    if dtype not in _STORAGE:
        raise ValueError(f"dtype must be one of {', '.join(_STORAGE)}, got {dtype!r}")
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, array in tensors.items():
        nbytes = array.size * _STORAGE[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for array in tensors.values():
            if dtype == "BF16":
                float32_to_bfloat16(array).astype("<u2").tofile(f)
            else:
                np.ascontiguousarray(array, dtype=_STORAGE[dtype]).tofile(f)
    os.replace(partial, path)


def write_sharded_checkpoint(
    directory: Path | str, tensors: Mapping[str, np.ndarray], dtype: str, shards: int = 1
) -> list[Path]:
    """Write ``tensors`` as ``model.safetensors``, or as ``shards`` files plus the index, as HF names them.

    Tensors are split in order into shards of about equal size. Returns the files written.
    """
    directory = Path(directory)
    if shards == 1:
        write_safetensors(directory / SINGLE_NAME, tensors, dtype)
        return [directory / SINGLE_NAME]
    names = list(tensors)
    if not 1 <= shards <= len(names):
        raise ValueError(f"shards must be between 1 and {len(names)} (the number of tensors), got {shards}")
    groups = _split_evenly(names, [tensors[n].size for n in names], shards)
    weight_map: dict[str, str] = {}
    paths = []
    for i, group in enumerate(groups, start=1):
        shard = f"model-{i:05d}-of-{shards:05d}.safetensors"
        write_safetensors(directory / shard, {n: tensors[n] for n in group}, dtype)
        weight_map.update(dict.fromkeys(group, shard))
        paths.append(directory / shard)
    total = sum(tensors[n].size for n in names) * _STORAGE[dtype].itemsize
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*paths, directory / INDEX_NAME]


def _split_evenly(names: Sequence[str], sizes: Sequence[int], parts: int) -> list[list[str]]:
    """``parts`` consecutive non-empty groups, each closed once the running size passes its share."""
    total, done = sum(sizes), 0
    groups: list[list[str]] = [[]]
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        groups_left = parts - len(groups)
        share_reached = done >= total * len(groups) / parts
        if groups[-1] and groups_left > 0 and (share_reached or len(names) - i == groups_left):
            groups.append([])
        groups[-1].append(name)
        done += size
    return groups
