"""The Qwen3 backbone of MOSS-TTS-Delay, run by llama.cpp through the C bridge.

MOSS-TTS feeds the backbone summed embeddings (text + one per audio codebook), not token ids, and reads the
final-normed hidden state (for its audio heads) and the text logits. ``Backbone`` owns one llama.cpp
model and context; see bridge/moss_bridge.h for what each call does on the C side.

Prompt-prefix reuse: ``prefill_prompt`` remembers the prompt rows (token ids, not embeddings) it left in
the KV cache. A later prompt that begins with the same rows keeps their positions and prefills only the
rest, as llama.cpp's server does for text prompts: a robot's requests in one voice share the reference
clip and the instruction fields, which come before the text. Rows generated after a prompt are never
reused (the cache beyond the remembered prompt is removed before the next one is prefilled).

Reuse is bit for bit what an empty cache gives. A row's keys and values depend, by rounding, on the batch
llama.cpp computed it in (the CPU's flash attention and matrix kernels choose their code by the batch's rows:
docs/speed.md, "Prompt-prefix reuse"), so a prompt is prefilled in segments cut where the caller says its
shared rows end (``shared_rows``: the rows before the text), each in a bridge call of its own, and only
whole segments that both prompts cut alike are kept: those rows were computed exactly as the new prompt's own
prefill computes them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from moss_tts_node.errors import BridgeError, WeightsError
from moss_tts_node.llama.bindings import FLASH_ATTN, GGML_TYPES, Status, load_bridge_library, status_error
from moss_tts_node.llama.placement import cpu_weight_placement

_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class BackboneParams:
    """How to load the backbone: the GGUF and the config's ``llama.*`` keys, by the same names. Their defaults live
    in the config (``LlamaConfig``), which checks the user-facing values once; the bridge refuses the rest
    (ERR_INVALID_ARGUMENT, ERR_CONTEXT_CREATE) with the reason."""

    gguf_path: Path
    n_ctx: int
    n_batch: int
    n_threads: int  # 0 = all online cores
    n_threads_batch: int  # for a prefill's batches; 0 = n_threads
    n_gpu_layers: int  # -1 all layers on the GPU, 0 CPU only
    kv_cache_type_k: str  # a key of bindings.GGML_TYPES
    kv_cache_type_v: str
    flash_attn: str  # a key of bindings.FLASH_ATTN
    repack: bool  # llama.cpp's faster CPU layouts for quantized weights (llama/placement.py)


def set_llama_verbose(verbose: bool) -> None:
    """Forward llama.cpp's whole log to stderr (process-wide); by default only its errors are kept."""
    load_bridge_library().moss_bridge_set_verbose(int(verbose))


class Backbone:
    """One llama.cpp model + context fed with embedding rows. Not thread-safe: one caller at a time."""

    def __init__(self, params: BackboneParams) -> None:
        self._handle: ctypes.c_void_p | None = None  # set first: __del__ must work if __init__ fails
        path = Path(params.gguf_path)
        _check_gguf_file(path)
        self._lib = load_bridge_library()
        placement = cpu_weight_placement(params.repack)
        c_params = self._lib.moss_bridge_default_params()
        c_params.model_path = str(path).encode()
        c_params.n_ctx = params.n_ctx
        c_params.n_batch = params.n_batch
        c_params.n_threads = params.n_threads
        c_params.n_threads_batch = params.n_threads_batch
        c_params.n_gpu_layers = params.n_gpu_layers
        c_params.type_k = GGML_TYPES[params.kv_cache_type_k]
        c_params.type_v = GGML_TYPES[params.kv_cache_type_v]
        c_params.flash_attn = FLASH_ATTN[params.flash_attn]
        c_params.extra_bufts = int(params.repack)
        handle = ctypes.c_void_p()
        status = self._lib.moss_bridge_create(ctypes.byref(c_params), ctypes.byref(handle))
        if status != Status.OK:
            if status == Status.ERR_MODEL_LOAD:
                detail = self._lib.moss_bridge_last_error(None).decode(errors="replace")
                raise WeightsError(f"cannot load the backbone GGUF {path}: {detail}")
            raise BridgeError(status_error(self._lib, status, None))
        self._handle = handle
        buffers = self._lib.moss_bridge_weight_buffers(handle).decode(errors="replace")
        # Where llama.cpp put the weights, and why: "CPU_REPACK 646.0 MiB, CPU 120.5 MiB (llama.cpp's CPU_REPACK ...)".
        self.weight_layout = f"{buffers} ({placement.reason()})"
        self._n_embd = self._query(self._lib.moss_bridge_n_embd)
        self._n_vocab = self._query(self._lib.moss_bridge_n_vocab)
        self._n_ctx = self._query(self._lib.moss_bridge_n_ctx)
        self._hidden = np.empty(self._n_embd, dtype=np.float32)
        self._logits = np.empty(self._n_vocab, dtype=np.float32)
        self._text_head = True  # what the bridge was last told (moss_bridge_set_text_logits)
        # The prompt rows at KV positions 0..len-1 (what prefill_prompt may reuse); rows beyond are unknown.
        self._prompt_rows = np.empty((0, 0), dtype=np.int64)
        self._prompt_ends: tuple[int, ...] = ()  # where each of their segments ended (each its own bridge call)

    # ---- sizes ---------------------------------------------------------------------------------------

    @property
    def n_embd(self) -> int:
        """Width of an input row and of the hidden state."""
        return self._n_embd

    @property
    def n_vocab(self) -> int:
        """Number of text logits."""
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        """KV cache capacity in rows (llama.cpp rounds the requested n_ctx up to a multiple of 256)."""
        return self._n_ctx

    @property
    def position(self) -> int:
        """Rows now in the KV cache: the position the next row will take."""
        return self._query(self._lib.moss_bridge_n_pos)

    # ---- decoding ------------------------------------------------------------------------------------

    def prefill(self, embeddings: np.ndarray, text_logits: bool = True) -> None:
        """Append (S, n_embd) rows; afterwards ``hidden``/``text_logits`` describe the last row.

        Only the last row computes outputs, so a long prompt costs no text head per row. Float32
        C-contiguous input is passed to C without a copy; anything else is converted first.
        ``text_logits=False`` skips the text head for the last row too: ``hidden`` works, ``text_logits``
        raises.
        """
        rows = np.ascontiguousarray(embeddings, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] != self._n_embd:
            raise ValueError(f"prefill expects embeddings of shape (S >= 1, {self._n_embd}), got {rows.shape}")
        self._set_text_head(text_logits)
        self._call_or_forget(self._lib.moss_bridge_prefill, _floats(rows), rows.shape[0])

    def prefill_prompt(
        self,
        prompt: np.ndarray,
        embed: Callable[[np.ndarray], np.ndarray],
        text_logits: bool = True,
        shared_rows: int = 0,
    ) -> int:
        """Make the KV cache hold exactly the (S, channels) prompt rows; returns how many rows were prefilled.

        ``shared_rows``: how many rows at its start other prompts share (the voice prefix: ``Prompt.shared_rows``);
        they are prefilled apart from the rest. What an earlier ``prefill_prompt`` or ``prepare_prefix`` left in
        the cache is kept where it is this prompt's own rows computed as its own prefill computes them: its whole
        first segment when that is the same, all but the last row for the same prompt again (whose outputs,
        ``hidden``/``text_logits`` afterwards, the caller needs). Only the other rows go through ``embed`` (int64
        rows -> (n, n_embd) float32) and llama.cpp. A prompt that shares no segment with the cache is prefilled
        whole, as after ``clear``.
        """
        ends = _segment_ends(prompt.shape[0], shared_rows)
        kept = self._reusable_rows(prompt, ends, needs_output=True)
        self._extend_prompt(prompt, ends, kept, embed, text_logits)
        return prompt.shape[0] - kept

    def prepare_prefix(self, prefix: np.ndarray, embed: Callable[[np.ndarray], np.ndarray]) -> int:
        """Have the (P, channels) rows in the KV cache ahead of the prompts that will begin with them (as their
        ``shared_rows``).

        Nothing is decoded when the cache already begins with them, computed so (the rows after them stay until
        the next ``prefill_prompt``); otherwise they are prefilled as a prompt's first segment. Returns the rows
        prefilled.
        """
        ends = (prefix.shape[0],)
        kept = self._reusable_rows(prefix, ends, needs_output=False)
        if kept == prefix.shape[0]:
            return 0
        self._extend_prompt(prefix, ends, kept, embed, text_logits=False)
        return prefix.shape[0] - kept

    def _reusable_rows(self, prompt: np.ndarray, ends: tuple[int, ...], needs_output: bool) -> int:
        """The rows of ``prompt`` (cut at ``ends``) the cache holds as its own prefill would compute them.

        A segment's rows came from one bridge call (its last row decoded alone): the same rows with the same ends
        are the same batches, computed over the same cache before them."""
        common = self._cached_prefix(prompt)
        kept = 0
        for end, cached_end in zip(ends, self._prompt_ends, strict=False):
            if end != cached_end or common < end - 1:
                break
            if common < end or (needs_output and end == prompt.shape[0]):
                return end - 1  # all but the segment's last row, which its call decodes alone again
            kept = end
        return kept

    def _cached_prefix(self, prompt: np.ndarray) -> int:
        """Rows at the start of ``prompt`` equal to the remembered prompt rows in the cache."""
        cached = self._prompt_rows
        n = min(cached.shape[0], prompt.shape[0])
        if n == 0 or cached.shape[1] != prompt.shape[1]:
            return 0
        differs = np.flatnonzero(np.any(cached[:n] != prompt[:n], axis=1))
        return int(differs[0]) if differs.size else n

    def _extend_prompt(
        self,
        prompt: np.ndarray,
        ends: tuple[int, ...],
        kept: int,
        embed: Callable[[np.ndarray], np.ndarray],
        text_logits: bool,
    ) -> None:
        """Keep ``kept`` rows and prefill the rest segment by segment, remembering each once it is in the cache
        (a segment refused for room decodes nothing: the cache then holds the segments before it)."""
        self._call_or_forget(self._lib.moss_bridge_truncate, kept)
        self._prompt_rows = self._prompt_rows[:kept]
        self._prompt_ends = tuple(end for end in self._prompt_ends if end <= kept)
        rows = embed(prompt[kept:])
        start = kept
        for end in ends:
            if end <= start:
                continue
            last = end == prompt.shape[0]
            self.prefill(rows[start - kept : end - kept], text_logits and last)
            self._prompt_rows = np.array(prompt[:end], dtype=np.int64)
            self._prompt_ends = tuple(e for e in ends if e <= end)
            start = end

    def _forget_prompt(self) -> None:
        """Remember no prompt rows: the next prompt is prefilled whole."""
        self._prompt_rows = self._prompt_rows[:0]
        self._prompt_ends = ()

    def decode(self, embedding: np.ndarray, text_logits: bool = True) -> None:
        """Append one (n_embd,) row: one generation step (``text_logits`` as for ``prefill``)."""
        row = np.ascontiguousarray(embedding, dtype=np.float32)
        if row.shape != (self._n_embd,):
            raise ValueError(f"decode expects an embedding of shape ({self._n_embd},), got {row.shape}")
        self._set_text_head(text_logits)
        self._call_or_forget(self._lib.moss_bridge_decode, _floats(row))

    def _set_text_head(self, enabled: bool) -> None:
        if enabled != self._text_head:
            self._call(self._lib.moss_bridge_set_text_logits, int(enabled))
            self._text_head = enabled

    def hidden(self) -> np.ndarray:
        """Final-normed hidden state of the last row, (n_embd,) float32.

        The array is a buffer reused by every call (no allocation per step): copy it to keep it.
        """
        self._call(self._lib.moss_bridge_get_hidden, _floats(self._hidden))
        return self._hidden

    def text_logits(self) -> np.ndarray:
        """Text logits of the last row, (n_vocab,) float32; a reused buffer like ``hidden``."""
        self._call(self._lib.moss_bridge_get_text_logits, _floats(self._logits))
        return self._logits

    def clear(self) -> None:
        """Empty the KV cache (position back to 0); nothing is left to reuse."""
        self._forget_prompt()
        self._call(self._lib.moss_bridge_clear)

    # ---- lifetime ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the llama.cpp context and model now (idempotent)."""
        if self._handle is not None:
            self._lib.moss_bridge_free(self._handle)
            self._handle = None

    def __enter__(self) -> Backbone:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # ---- helpers -------------------------------------------------------------------------------------

    def _live_handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise BridgeError("the backbone is closed")
        return self._handle

    def _call(self, function: Callable[..., int], *args: object) -> None:
        handle = self._live_handle()
        status = function(handle, *args)
        if status != Status.OK:
            raise BridgeError(status_error(self._lib, status, handle))

    def _call_or_forget(self, function: Callable[..., int], *args: object) -> None:
        """``_call`` for what appends to the KV cache. A refusal for want of room decoded nothing, or only
        rows after the remembered prompt; any other failure may have left anything, so the cache is emptied
        and nothing is reused."""
        handle = self._live_handle()
        status = function(handle, *args)
        if status == Status.OK:
            return
        message = status_error(self._lib, status, handle)  # before the clear below resets it
        if status != Status.ERR_CONTEXT_FULL:
            self._forget_prompt()
            self._lib.moss_bridge_clear(handle)
        raise BridgeError(message)

    def _query(self, function: Callable[..., int]) -> int:
        value = ctypes.c_int32()
        self._call(function, ctypes.byref(value))
        return value.value


def _segment_ends(rows: int, shared_rows: int) -> tuple[int, ...]:
    """Where a prompt of ``rows`` rows is cut: after its shared rows, when they are some but not all of it."""
    return (shared_rows, rows) if 0 < shared_rows < rows else (rows,)


def _floats(array: np.ndarray) -> ctypes._Pointer[ctypes.c_float]:
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _check_gguf_file(path: Path) -> None:
    """Name the file in plain words before llama.cpp gets to it: a missing or non-GGUF file is common."""
    try:
        with path.open("rb") as f:
            magic = f.read(len(_GGUF_MAGIC))
    except OSError as error:
        raise WeightsError(f"cannot read the backbone GGUF {path}: {error.strerror or error}") from error
    if magic != _GGUF_MAGIC:
        raise WeightsError(f"{path} is not a GGUF file (it does not start with {_GGUF_MAGIC!r})")
