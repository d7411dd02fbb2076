"""From generated rows to audio: one offline decode per segment, or a stream as soon as it can be heard.

``FrameAssembler`` undoes the delay pattern online: frame t is complete at generated row
t + n_vq - 1, when its last codebook arrives. ``SegmentDecoder`` turns the complete frames of
an audio segment (the frames between gaps) into samples, a chunk at a time, by a
``SegmentDecoding`` strategy:

- ``OfflineDecoding``: nothing until the segment ends, then the codec's decode of the whole
  segment (in windows when longer than one codec call allows): what the codec says the audio is.
- ``WindowedStreamDecoding``: the codec graphs are stateless and the decoder is causal, so each
  chunk decodes ``left_context`` already-played frames plus the new ones and keeps only the new
  samples. The real codec's Transformer layers stack attention spans, so no affordable context
  reaches the offline decode: the stream differs from it at every chunk (docs/stream-decoder.md, "The
  windowed scheme", has the error per setting).
- ``StatefulStreamDecoding``: a ``StreamDecoder`` keeps the codec's attention state between
  calls, so each chunk decodes only its new frames; with a "window" graph the stream equals the
  offline decode (docs/stream-decoder.md). Its state is the utterance's, reset at each segment's end.

A segment may begin with frames the listener has heard already (the recording that continuation continues,
docs/continuation.md): they are the left context of the frames after them, never emitted. The offline decode
decodes them with the rest and drops their samples; the windowed scheme takes its context from them; the stream
decoder takes them into its state before the first new frame. So every strategy gives what the codec gives for
the whole recording, from the first new frame on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.errors import CodecError


class SegmentDecoding(ABC):
    """How the frames of one segment become samples; ``name`` is what the timing report calls it."""

    name: ClassVar[str]
    streams: ClassVar[bool]  # False: decodes only once the segment has ended

    @abstractmethod
    def decode(self, segment: Sequence[np.ndarray], start: int) -> np.ndarray:
        """Samples of ``segment[start:]``, given the segment's frames so far (T frames of n_vq, T > start).

        Each strategy stacks only the frames it reads, so a long segment is not copied whole per chunk."""

    @abstractmethod
    def reset(self) -> None:
        """The segment has ended: the next frames do not continue its audio."""

    @abstractmethod
    def prime(self, segment: Sequence[np.ndarray], start: int, end: int) -> None:
        """Take ``segment[start:end]`` in as left context, its samples unwanted (the frames before ``start`` were
        taken in already)."""


class OfflineDecoding(SegmentDecoding):
    """The codec's decode of each whole segment, decoded once it has ended."""

    name = "offline"
    streams = False

    def __init__(self, codec: AudioCodec) -> None:
        self.codec = codec

    def decode(self, segment: Sequence[np.ndarray], start: int) -> np.ndarray:
        return self.codec.decode(np.stack(segment))[start * self.codec.samples_per_frame :]

    def reset(self) -> None:
        pass  # the codec graphs are stateless

    def prime(self, segment: Sequence[np.ndarray], start: int, end: int) -> None:
        pass  # the context is decoded with the rest of the segment


class WindowedStreamDecoding(SegmentDecoding):
    """Each chunk re-decoded with ``left_context`` frames before it; only its own samples are kept."""

    name = "windowed stream"
    streams = True

    def __init__(self, codec: AudioCodec, left_context: int) -> None:
        self.codec = codec
        self.left_context = left_context

    def decode(self, segment: Sequence[np.ndarray], start: int) -> np.ndarray:
        left = max(0, start - self.left_context)
        return self.codec.decode(np.stack(segment[left:]))[(start - left) * self.codec.samples_per_frame :]

    def reset(self) -> None:
        pass  # each call carries its own context

    def prime(self, segment: Sequence[np.ndarray], start: int, end: int) -> None:
        pass  # each call takes its context from the segment


class StatefulStreamDecoding(SegmentDecoding):
    """Each chunk's new frames decoded by a ``StreamDecoder``, which holds the attention state of the frames before."""

    name = "stateful stream"
    streams = True

    def __init__(self, decoder: StreamDecoder) -> None:
        self.decoder = decoder

    def decode(self, segment: Sequence[np.ndarray], start: int) -> np.ndarray:
        return self._feed(segment, start, len(segment))

    def prime(self, segment: Sequence[np.ndarray], start: int, end: int) -> None:
        self._feed(segment, start, end)

    def _feed(self, segment: Sequence[np.ndarray], start: int, end: int) -> np.ndarray:
        """The samples of ``segment[start:end]``, decoded on the state of the frames before ``start``."""
        # The state must be this segment's frames before ``start``: a stream abandoned mid-segment
        # (never reset) would otherwise continue someone else's audio.
        if self.decoder.frames_done != start:
            raise CodecError(
                f"the stream decoder holds {self.decoder.frames_done} frames of state, not the {start} this chunk "
                "follows: two streams of one synthesizer were iterated at once; run them one after the other"
            )
        new = np.stack(segment[start:end])
        per_call = self.decoder.max_frames or len(new)  # ring graphs take a bounded number of frames per call
        return np.concatenate([self.decoder.decode(new[i : i + per_call]) for i in range(0, len(new), per_call)])

    def reset(self) -> None:
        if self.decoder.frames_done:  # nothing decoded since the last reset: the state is already empty
            self.decoder.reset()


class SegmentDecoder:
    """Feeds complete frames to a ``SegmentDecoding``; emits each sample once, in order.

    A streaming strategy gets chunks: the first chunk of an utterance leaves with its first
    frame, so a listener hears audio one decode after the first frame completes; later chunks
    gather ``chunk_frames``. The offline strategy gets each whole segment when it ends.
    """

    def __init__(self, decoding: SegmentDecoding, chunk_frames: int) -> None:
        self.decoding = decoding
        self.chunk_frames = chunk_frames
        self.segment: list[np.ndarray] = []  # frames of the current segment
        self.emitted = 0  # frames of the current segment already turned into samples, or heard already
        self.context = 0  # frames the segment begins with that were heard already
        self.primed = 0  # of those, the ones the decoding has taken in
        self.chunks_out = 0

    def push_context(self, frame: np.ndarray) -> None:
        """Add a frame the listener has heard already, at the start of a segment: the left context of the frames
        after it, never emitted,."""
        if self.emitted != self.context:
            raise ValueError("context frames come first in a segment")
        self.segment.append(frame)
        self.context += 1
        self.emitted += 1

    def push(self, frame: np.ndarray) -> np.ndarray | None:
        """Add a complete frame; returns samples when a chunk is due."""
        self.segment.append(frame)
        if not self.decoding.streams:
            return None
        due = 1 if self.chunks_out == 0 else self.chunk_frames
        if len(self.segment) - self.emitted >= due:
            return self._decode_pending()
        return None

    def end_segment(self) -> np.ndarray | None:
        """A gap or the end: what is pending; the next frames do not continue this audio."""
        samples = self._decode_pending()
        self.segment = []
        self.emitted = self.context = self.primed = 0
        self.decoding.reset()
        return samples

    def _decode_pending(self) -> np.ndarray | None:
        if len(self.segment) == self.emitted:
            return None
        if self.primed < self.context:
            self.decoding.prime(self.segment, self.primed, self.context)
            self.primed = self.context
        samples = self.decoding.decode(self.segment, self.emitted)
        self.emitted = len(self.segment)
        self.chunks_out += 1
        return samples
