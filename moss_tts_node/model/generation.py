"""The autoregressive step loop: backbone, heads, delay rules and sampling, one row per step.

Everything outside ``backbone.decode`` is overhead on llama.cpp's time; a step does, in order: the
logits the delay state needs (the loop reads from the backbone only the outputs the heads ask for: the
hidden state for the audio channels it samples, the text logits only when the whole vocabulary may be
sampled, else the heads compute the two the audio phase allows from the hidden state), sampling and the
delay update, the next row's embedding (1 + n_vq float16 rows), and the decode, told whether its text head is
needed. The caller's codec work happens while the row is out.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np
from threadpoolctl import threadpool_limits

from moss_tts_node.llama.backbone import Backbone
from moss_tts_node.model.delay import DelayState, TextRule
from moss_tts_node.model.embeddings import EmbeddingTables
from moss_tts_node.model.heads import AudioHeads, StepLogits
from moss_tts_node.model.sampling import Sampler
from moss_tts_node.timing import StageClock, StopReason


def step_logits(backbone: Backbone, heads: AudioHeads, rule: TextRule, channels: np.ndarray) -> StepLogits:
    """The logits of a step sampled with ``rule`` and ``channels``, from the backbone's last decode."""
    inputs = heads.inputs(rule, channels)
    hidden = backbone.hidden() if inputs.hidden else None
    text_logits = backbone.text_logits() if inputs.text_logits else None
    return heads.step(rule, channels, hidden, text_logits)


def generate_rows(
    backbone: Backbone,
    embeddings: EmbeddingTables,
    heads: AudioHeads,
    prompt: np.ndarray,
    state: DelayState,
    sampler: Sampler,
    max_steps: int,
    cancelled: Callable[[], bool],
    clock: StageClock,
    *,
    shared_rows: int,
) -> Generator[np.ndarray, None, StopReason]:
    """Yield each generated (1 + n_vq,) row until im_end, max_steps, or cancellation; return which.

    The caller sees the row before the backbone consumes it, so audio can leave while the
    next step runs; the cancel flag is read before every step. The prompt's prefix that the last
    request left in the KV cache is reused (``Backbone.prefill_prompt``, with the prompt's ``shared_rows``).
    """
    # Idle BLAS threads busy-wait after each GEMV and starve llama.cpp's threads, which can cost many times
    # a step on a small machine. One BLAS thread streams the heads; the onnx heads' threads sleep when idle.
    with threadpool_limits(limits=1, user_api="blas"):
        rule = state.text_rule()
        with clock.stage("prefill"):
            clock.prefilled_rows += backbone.prefill_prompt(
                prompt, embeddings.embed, text_logits=heads.wants_text_head(rule), shared_rows=shared_rows
            )
        row = np.empty(prompt.shape[1], dtype=np.int64)
        for step in range(max_steps):
            if cancelled():
                return StopReason.CANCELLED
            with clock.stage("heads"):
                channels = state.audio_channels()
                logits = step_logits(backbone, heads, rule, channels)
            with clock.stage("sampling"):
                row[0] = sampler.sample_text(logits.text, rule, logits.text_ids)
                row[1:] = sampler.sample_audio(logits.audio, channels)
                state.advance(int(row[0]))
                sampler.observe(row[1:])
            yield row.copy()
            if state.is_stopping:
                return StopReason.END
            if step == max_steps - 1:
                break
            with clock.stage("sampling"):
                embedding = embeddings.embed(row[None, :])[0]
                rule = state.text_rule()
                text_head = heads.wants_text_head(rule)
            with clock.stage("backbone"):
                backbone.decode(embedding, text_logits=text_head)
    return StopReason.MAX_NEW_TOKENS
