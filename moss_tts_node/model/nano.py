"""MOSS-TTS-Nano's generation: one global step and one local pass per 80 ms frame (docs/nano.md, "Generation").

Per frame, as upstream's ``_iter_generation_events`` does it:

1. The global transformer (llama.cpp, ``global_backbone``) has taken the prompt, then each generated row
   (``[assistant slot, code_0 .. code_15]``); its final-normed hidden state of the last row starts the local pass.
2. The local transformer (ONNX Runtime, ``model/nano_local.py``, its KV cache cleared each frame) takes that hidden
   state at position 0; its output through the text head, restricted to the assistant slot and audio end, decides
   whether the frame is spoken or the speech ends (text sampling, no penalty).
3. Positions 1..16 take the slot's text embedding, then the embedding of each code just sampled; the output at
   position k + 1 through audio head k (tied to audio embedding table k) gives code k (audio sampling, with the
   repetition penalty over that codebook's codes generated so far in this piece: the prompt's do not count).

There is no delay pattern: a step is a frame, complete as soon as it is sampled. The heads are the embedding tables
themselves (upstream ties them), held once more for the matrix-vector products: in float32, or in 8 bits.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import partial

import numpy as np
from threadpoolctl import threadpool_limits

from moss_tts_node.errors import ConfigError
from moss_tts_node.llama.backbone import Backbone
from moss_tts_node.model.embeddings import EmbeddingTables
from moss_tts_node.model.heads import Q8MatVec, quantize_heads_q8
from moss_tts_node.model.nano_local import OnnxLocalTransformer
from moss_tts_node.model.sampling import SamplingParams, penalized, sample_rows, tempered
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.timing import StageClock, StopReason


class NanoHeads:
    """The text head's two rows that a frame chooses between (assistant slot: speak on; audio end: stop) and the
    n_vq audio heads, from the tied embedding tables, on one of two backends (``nano_heads_backend``):

    - ``numpy``: exact, float32 GEMVs;
    - ``onnx``: each head in 8-bit blocks, one ONNX Runtime ``MatMulNBits`` session per head, as
      the Delay models' onnx heads; the logits differ by the 8-bit rounding (docs/nano.md, "Speed").
    """

    weight_bytes: int  # the audio heads' weights as held: all of them are read for every frame

    def __init__(self, embeddings: EmbeddingTables, spec: ModelSpec, backend: str = "numpy") -> None:
        choices = [spec.audio_assistant_gen_slot_token_id, spec.audio_end_token_id]
        self.name = backend
        self.choice_ids = np.array(choices, dtype=np.int64)
        self.choices = np.asarray(embeddings.text[choices], dtype=np.float32)
        # The pad row of each table (zeros: upstream masks the pad out of the sum) is no code: the heads leave it.
        tables = [table[: spec.audio_vocab_size] for table in embeddings.audio]
        if backend == "onnx":
            hidden = embeddings.hidden
            q8 = [quantize_heads_q8(iter([table]), table.shape[0], hidden) for table in tables]
            self.weight_bytes = sum(codes.nbytes + scales.nbytes for codes, scales in q8)
            self._sessions = [Q8MatVec(blocks, 1, ("CPUExecutionProvider",)) for blocks in q8]
            self._audio: list[Callable[[np.ndarray], np.ndarray]] = list(self._sessions)
        else:
            self._sessions = []
            widened = [np.asarray(table, dtype=np.float32) for table in tables]
            self.weight_bytes = sum(table.nbytes for table in widened)
            self._audio = [partial(np.matmul, table) for table in widened]
        self.n_vq = len(tables)
        self.slot_embedding = np.asarray(embeddings.text[spec.audio_assistant_gen_slot_token_id], dtype=np.float32)
        self.code_embeddings = embeddings.audio

    def code_logits(self, codebook: int, hidden: np.ndarray) -> np.ndarray:
        """The logits of codebook ``codebook``'s codes at a local position's hidden state (valid until the next call
        for that codebook)."""
        return self._audio[codebook](hidden)

    def code_embedding(self, codebook: int, code: int) -> np.ndarray:
        return np.asarray(self.code_embeddings[codebook][code], dtype=np.float32)

    def close(self) -> None:
        for session in self._sessions:
            session.close()
        self._sessions, self._audio = [], []


def nano_heads_backend(backend: str) -> str:
    """What ``audio.heads_backend`` means for MOSS-TTS-Nano: ``auto`` is the 8-bit ``onnx`` heads (faster on a CPU,
    docs/nano.md, "Speed"); ``gguf`` is refused, Nano's heads being its audio tables, one a local position."""
    if backend == "gguf":
        raise ConfigError(
            "audio.heads_backend 'gguf' does not apply to MOSS-TTS-Nano: its audio heads are its audio embedding "
            "tables, one for each local position, not a GGUF output matrix; set audio.heads_backend to auto, onnx "
            "(8-bit) or numpy (exact float32)"
        )
    return "onnx" if backend == "auto" else backend


class NanoSampler:
    """Samples a frame's choice and its codes as upstream's ``_sample_next_token`` does: repetition penalty, then
    greedy (temperature <= 0) or temperature, top-k, top-p and a draw. Owns the piece's random generator."""

    def __init__(self, config: SamplingParams, spec: ModelSpec) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self._seen = np.zeros((spec.n_vq, spec.audio_vocab_size), dtype=bool)  # codes generated per codebook

    def speaks(self, logits: np.ndarray) -> bool:
        """Whether the frame is spoken, from the logits of (assistant slot, audio end)."""
        config = self.config
        scaled = logits.astype(np.float64)[None, :]
        if config.text_temperature <= 0:
            return int(np.argmax(scaled[0])) == 0
        pick = sample_rows(tempered(scaled, config.text_temperature), config.text_top_k, config.text_top_p, self.rng)
        return int(pick[0]) == 0

    def code(self, codebook: int, logits: np.ndarray) -> int:
        config = self.config
        scaled = logits.astype(np.float64)[None, :]
        if config.audio_repetition_penalty != 1.0:
            scaled = penalized(scaled, self._seen[codebook][None, :], config.audio_repetition_penalty)
        if config.audio_temperature <= 0:
            return int(np.argmax(scaled[0]))
        scaled = tempered(scaled, config.audio_temperature)
        return int(sample_rows(scaled, config.audio_top_k, config.audio_top_p, self.rng)[0])

    def observe(self, frame: np.ndarray) -> None:
        """``frame``'s codes are now generated: later frames are penalized for repeating them."""
        self._seen[np.arange(frame.shape[0]), frame] = True


def generate_nano_frames(
    global_backbone: Backbone,
    local: OnnxLocalTransformer,
    embeddings: EmbeddingTables,
    heads: NanoHeads,
    prompt: np.ndarray,
    sampler: NanoSampler,
    max_frames: int,
    cancelled: Callable[[], bool],
    clock: StageClock,
    *,
    shared_rows: int,
) -> Generator[np.ndarray, None, StopReason]:
    """Yield each generated (n_vq,) frame until audio end, ``max_frames``, or cancellation; return which.

    The caller has the frame before the global transformer takes it, so its audio can be decoded while the next
    step runs; the cancel flag is read before every frame. The prompt's prefix that the last request left in the
    global KV cache is reused (``Backbone.prefill_prompt``, with the prompt's ``shared_rows``).
    """
    spec_slot = int(heads.choice_ids[0])
    n_vq = heads.n_vq
    # Idle BLAS threads busy-wait after each GEMV and starve llama.cpp's threads (model/generation.py).
    with threadpool_limits(limits=1, user_api="blas"):
        with clock.stage("prefill"):
            clock.prefilled_rows += global_backbone.prefill_prompt(
                prompt, embeddings.embed, text_logits=False, shared_rows=shared_rows
            )
        row = np.empty(1 + n_vq, dtype=np.int64)
        row[0] = spec_slot
        for step in range(max_frames):
            if cancelled():
                return StopReason.CANCELLED
            with clock.stage("heads"):
                local.clear()
                local.decode(global_backbone.hidden())
                choice = heads.choices @ local.hidden()
            with clock.stage("sampling"):
                speaks = sampler.speaks(choice)
            if not speaks:
                return StopReason.END
            local_input = heads.slot_embedding
            for codebook in range(n_vq):
                with clock.stage("heads"):
                    local.decode(local_input)
                    logits = heads.code_logits(codebook, local.hidden())
                with clock.stage("sampling"):
                    row[1 + codebook] = sampler.code(codebook, logits)
                    if codebook + 1 < n_vq:
                        local_input = heads.code_embedding(codebook, int(row[1 + codebook]))
            frame = row[1:].copy()
            sampler.observe(frame)
            yield frame
            if step == max_frames - 1:
                break
            with clock.stage("sampling"):
                embedding = embeddings.embed(row[None, :])[0]
            with clock.stage("backbone"):
                global_backbone.decode(embedding, text_logits=False)
    return StopReason.MAX_NEW_TOKENS
