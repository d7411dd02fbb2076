"""The autoregressive step loop: backbone, heads, delay rules and sampling, one row per step.

Everything outside ``backbone.decode`` is overhead on llama.cpp's time; a step does, in order: the
logits the delay state needs (``heads``: only the audio channels it samples; the text logits from
llama.cpp only when the whole vocabulary may be sampled, else the two the audio phase allows, computed
from the hidden state), sampling and the delay update, the next row's embedding (33 float16 rows), and
the decode, told whether its text head is needed. The caller's codec work happens while the row is out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from threadpoolctl import threadpool_limits

from moss_tts_node.llama.backbone import Backbone
from moss_tts_node.model.delay import DelayState
from moss_tts_node.model.embeddings import EmbeddingTables
from moss_tts_node.model.heads import AudioHeads
from moss_tts_node.model.sampling import Sampler
from moss_tts_node.timing import StageClock


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
) -> Iterator[np.ndarray]:
    """Yield each generated (1 + n_vq,) row until im_end, max_steps, or cancellation.

    The caller sees the row before the backbone consumes it, so audio can leave while the
    next step runs; the cancel flag is read before every step. The prompt's prefix that the last
    request left in the KV cache is reused (``Backbone.prefill_prompt``).
    """
    # Idle BLAS threads busy-wait after each GEMV and starve llama.cpp's threads (measured on
    # 2 cores: a tiny model's step went from 0.2 ms to 110 ms). One BLAS thread streams the heads;
    # the onnx heads' threads sleep when idle instead.
    with threadpool_limits(limits=1, user_api="blas"):
        rule = state.text_rule()
        with clock.stage("prefill"):
            clock.prefilled_rows += backbone.prefill_prompt(
                prompt, embeddings.embed, text_logits=heads.wants_text_head(rule)
            )
        row = np.empty(prompt.shape[1], dtype=np.int64)
        for step in range(max_steps):
            if cancelled():
                return
            with clock.stage("heads"):
                channels = state.audio_channels()
                logits = heads.step(backbone, rule, channels)
            with clock.stage("sampling"):
                row[0] = sampler.sample_text(logits.text, rule, logits.text_ids)
                row[1:] = sampler.sample_audio(logits.audio, channels)
                state.advance(int(row[0]))
                sampler.observe(row[1:])
            yield row.copy()
            if state.is_stopping or step == max_steps - 1:
                return
            with clock.stage("sampling"):
                embedding = embeddings.embed(row[None, :])[0]
                rule = state.text_rule()
            with clock.stage("backbone"):
                backbone.decode(embedding, text_logits=heads.wants_text_head(rule))
