"""Audio rates shared by the model and its codec (docs/model.md, "Shape of the model").

One generation step completes one frame of n_vq codes; the codec turns a frame into SAMPLES_PER_FRAME
samples at SAMPLE_RATE, so a step is 80 ms of audio.
"""

from __future__ import annotations

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
FRAMES_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_FRAME  # 12.5
# Upstream's MAX_AUDIO_SECONDS: the most audio one codec call takes by default (audio.max_codec_seconds, and the
# engines build-engines makes), 500 frames.
MAX_CODEC_SECONDS = 40.0


def frames_for_seconds(seconds: float) -> int:
    """Whole frames in ``seconds``, rounded down; at least 1."""
    return max(1, int(seconds * FRAMES_PER_SECOND + 1e-9))
