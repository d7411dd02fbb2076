"""The autoregressive step loop: backbone, heads, delay rules and sampling, one row per step."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from threadpoolctl import threadpool_limits

from .backbone import Backbone
from .delay import DelayState
from .sampling import Sampler
from .timing import StageClock
from .weights import AudioHeads, EmbeddingTables


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
    next step runs; the cancel flag is read before every step.
    """
    # Idle BLAS threads busy-wait after each GEMV and starve llama.cpp's threads (measured on
    # 2 cores: a tiny model's step went from 0.2 ms to 110 ms). One BLAS thread streams the heads.
    with threadpool_limits(limits=1, user_api="blas"):
        with clock.stage("prefill"):
            backbone.clear()
            backbone.prefill(embeddings.embed(prompt))
        row = np.empty(prompt.shape[1], dtype=np.int64)
        for step in range(max_steps):
            if cancelled():
                return
            with clock.stage("sampling"):
                row[0] = sampler.sample_text(backbone.text_logits(), state.text_rule())
                channels = state.audio_channels()
            with clock.stage("heads"):
                logits = heads.logits(backbone.hidden(), channels)
            with clock.stage("sampling"):
                row[1:] = sampler.sample_audio(logits, channels)
                state.advance(int(row[0]))
                sampler.observe(row[1:])
            yield row.copy()
            if state.is_stopping or step == max_steps - 1:
                return
            with clock.stage("sampling"):
                embedding = embeddings.embed(row[None, :])[0]
            with clock.stage("backbone"):
                backbone.decode(embedding)
