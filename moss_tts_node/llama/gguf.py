"""Reading a GGUF's header and a few rows of its text head, without llama.cpp."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moss_tts_node.errors import WeightsError

if TYPE_CHECKING:
    pass


GGUF_AUDIO_HEADS_KEY = "moss_tts.audio_heads"  # number of audio heads appended to output.weight


GGUF_TEXT_VOCAB_KEY = "moss_tts.text_vocab"  # rows of output.weight before them


class GgufHeadsInfo:
    """What the backbone GGUF says about the heads: whether it carries the audio heads, and its text rows.

    Reads the GGUF header itself (``gguf.GGUFReader`` takes ~7 s over a 155k-token tokenizer list, this
    ~0.1 s) and the few text-head rows asked for, nothing else.
    """

    def __init__(self, gguf_path: Path) -> None:
        self.path = Path(gguf_path)
        try:
            self.fields, self.tensors, self._data_start = scan_gguf(self.path)
        except (ValueError, OSError, struct.error) as exc:
            raise WeightsError(f"{gguf_path}: not a readable GGUF file ({exc})") from exc
        self.audio_heads = _int_or_none(self.fields.get(GGUF_AUDIO_HEADS_KEY))  # None: a plain (published) GGUF
        self.text_vocab = _int_or_none(self.fields.get(GGUF_TEXT_VOCAB_KEY))

    def text_head_rows(self, ids: Sequence[int]) -> np.ndarray | None:
        """The text head's rows ``ids`` as float32 (len(ids), H), dequantized from the GGUF's output matrix
        (the token embeddings when it is tied), so that the logits computed here match llama.cpp's; ``None``
        when the quantization type cannot be dequantized in NumPy."""
        import gguf

        info = self.tensors.get("output.weight", self.tensors.get("token_embd.weight"))
        if info is None:
            return None
        dims, type_id, offset = info
        qtype = gguf.GGMLQuantizationType(type_id)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = dims[0] // block * type_size
        rows = np.empty((len(ids), row_bytes), dtype=np.uint8)
        with self.path.open("rb") as f:
            for i, token in enumerate(ids):
                f.seek(self._data_start + offset + int(token) * row_bytes)
                rows[i] = np.frombuffer(f.read(row_bytes), dtype=np.uint8)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            return np.ascontiguousarray(rows.view(np.float32 if type_size == 4 else np.float16), dtype=np.float32)
        try:
            return np.ascontiguousarray(gguf.quants.dequantize(rows, qtype), dtype=np.float32)
        except NotImplementedError:
            return None


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def scan_gguf(path: Path) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], int, int]], int]:
    """(scalar and string metadata, tensor name -> (dims, ggml type, offset), start of the data section).

    Arrays (the tokenizer's) are skipped, not decoded; a GGUF v2/v3 little-endian file is expected.
    """
    import mmap

    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError("no GGUF magic")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        pos = 24

        def string() -> str:
            nonlocal pos
            (length,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + length
            return bytes(buf[pos - length : pos]).decode("utf-8", errors="replace")

        def value(kind: int) -> Any:
            nonlocal pos
            if kind == 8:
                return string()
            if kind == 9:
                (element, count) = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if element == 8:
                    for _ in range(count):
                        (length,) = struct.unpack_from("<Q", buf, pos)
                        pos += 8 + length
                elif element in _GGUF_SCALARS:
                    pos += count * struct.calcsize(_GGUF_SCALARS[element])
                else:
                    for _ in range(count):
                        value(element)
                return None
            fmt = "<" + _GGUF_SCALARS[kind]
            (result,) = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return result

        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            fields[key] = value(kind)
        tensors: dict[str, tuple[tuple[int, ...], int, int]] = {}
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            type_id, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            tensors[name] = (tuple(int(d) for d in dims), int(type_id), int(offset))
        alignment = int(fields.get("general.alignment") or 32)
        return fields, tensors, -(-pos // alignment) * alignment
