"""From generated rows to audio, as soon as it can be heard.

``FrameAssembler`` undoes the delay pattern online: frame t is complete at generated row
t + n_vq - 1, when its last codebook arrives. ``StreamingDecoder`` turns complete frames into
samples: the codec graphs are stateless and the decoder is causal, so it decodes a window of
``left_context`` already-played frames plus the new ones and keeps only the new samples.
With a left context at least as long as the decoder's receptive field the stream equals the
offline decode; a shorter one trades exactness at chunk joins for less work per chunk.
"""

from __future__ import annotations

import numpy as np

from moss_tts_node.codec.base import AudioCodec


class StreamingDecoder:
    """Decodes frames in chunks with left context; emits each sample once."""

    def __init__(self, codec: AudioCodec, chunk_frames: int, left_context: int) -> None:
        self.codec = codec
        self.chunk_frames = chunk_frames
        self.left_context = left_context
        self.segment: list[np.ndarray] = []  # frames of the current segment
        self.emitted = 0  # frames of the current segment already turned into samples
        self.chunks_out = 0
        self.frames: list[np.ndarray] = []  # every frame of the utterance, for callers that keep codes

    def push(self, frame: np.ndarray) -> np.ndarray | None:
        """Add a complete frame; returns samples when a chunk is due.

        The first chunk of an utterance leaves with its first frame, so a listener hears
        audio one decode after the first frame completes; later chunks gather chunk_frames.
        """
        self.segment.append(frame)
        self.frames.append(frame)
        due = 1 if self.chunks_out == 0 else self.chunk_frames
        if len(self.segment) - self.emitted >= due:
            return self._decode_pending()
        return None

    def end_segment(self) -> np.ndarray | None:
        """A gap: flush what is pending; the next frames do not continue this audio."""
        samples = self._decode_pending()
        self.segment = []
        self.emitted = 0
        return samples

    def _decode_pending(self) -> np.ndarray | None:
        pending = len(self.segment) - self.emitted
        if pending == 0:
            return None
        start = max(0, self.emitted - self.left_context)
        window = np.stack(self.segment[start:])
        samples = self.codec.decode(window)
        new = samples[(self.emitted - start) * self.codec.samples_per_frame :]
        self.emitted = len(self.segment)
        self.chunks_out += 1
        return new

    def codes(self) -> np.ndarray:
        """(T, n_vq) every frame pushed, gaps excluded."""
        if not self.frames:
            return np.empty((0, self.codec.n_quantizers), dtype=np.int64)
        return np.stack(self.frames)
