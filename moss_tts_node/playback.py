"""Speech to the machine's speaker: a jitter-buffered player over PortAudio (``sounddevice``).

Used by ``synth --play`` and by the ROS player (``ros/player.py``). Utterances play one after
another, each from its chunks as they arrive:

- a jitter buffer: an utterance starts (and restarts after running dry) only once ``prebuffer_s``
  of it is queued or its last chunk is in, so chunks that arrive in bursts play without gaps;
- the sample rate and channels are each utterance's own (the output reopens when they change): a mono
  utterance plays as mono, a stereo one (MOSS-TTS-Nano) as stereo;
- a chunk of a new utterance while the newest one has not had its final chunk means that one was
  cancelled (the node publishes nothing more for it): it is dropped at once, as ``cancel()`` does.

``sounddevice`` is optional (``pip install 'moss_tts_node[play]'``); PortAudio comes from the system
(Debian: ``libportaudio2``). The device buffers ``DEVICE_LATENCY_S`` so a busy machine (the model
runs beside it) does not click; ``cancel`` aborts the stream, which drops what the device had
buffered, so a cancel is heard within one block.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from moss_tts_node.errors import PlaybackError
from moss_tts_node.pcm import channels_of

# Covers the one-frame first chunk and the 0.4 s one after it (docs/stream-decoder.md, "Streaming").
DEFAULT_PREBUFFER_S = 0.3
DEVICE_LATENCY_S = 0.1  # the device's buffer: room for the player thread to be late on a busy machine
BLOCK_S = 0.02  # what the player thread writes at a time: a cancel waits for at most one block
ENDED_MEMORY = 64  # ended utterances remembered, so a straggling chunk of one is refused, not replayed
INSTALL_HINT = "pip install 'moss_tts_node[play]' (sounddevice) and the PortAudio library (Debian: libportaudio2)"


class OutputStream(Protocol):
    """What the player needs of a started output stream (a ``sounddevice.OutputStream``)."""

    latency: float  # seconds of audio the device buffers

    def write(self, data: np.ndarray) -> Any: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


OpenStream = Callable[[int, int], OutputStream]  # sample rate, channels -> a started float32 stream


def sound_output(device: str | int | None = None) -> OpenStream:
    """Check now that PortAudio and the output ``device`` (None: the system's default) are there.

    Returns the function that opens a stream on it at a given rate and channel count; raises PlaybackError with the
    fix.
    """
    try:
        import sounddevice
    except (ImportError, OSError) as exc:  # OSError: the module is there, the PortAudio library is not
        raise PlaybackError(f"cannot play audio ({exc}): {INSTALL_HINT}") from exc
    if isinstance(device, str) and device.isdigit():
        device = int(device)
    try:
        name = sounddevice.query_devices(device if device != "" else None, "output")["name"]
    except (ValueError, sounddevice.PortAudioError) as exc:
        which = f"output device {device!r}" if device not in (None, "") else "default output device"
        raise PlaybackError(
            f"no {which} ({exc}): check that a sound card or a sound server (PulseAudio, PipeWire) is there; "
            "list the devices with `python -m sounddevice`"
        ) from exc

    def open_stream(sample_rate: int, channels: int) -> OutputStream:
        try:
            stream = sounddevice.OutputStream(
                samplerate=sample_rate, channels=channels, dtype="float32", device=device, latency=DEVICE_LATENCY_S
            )
        except sounddevice.PortAudioError as exc:
            raise PlaybackError(
                f"output device {name!r} cannot play {sample_rate} Hz, {channels} channels ({exc}): use the "
                "'default' or 'pulse' device, which resample and remix, or set audio.output_sample_rate and "
                "audio.output_channels to what it plays"
            ) from exc
        stream.start()
        # Through ALSA's PulseAudio plugin the first milliseconds after a start were lost: let them be silence.
        stream.write(_silence(math.ceil(stream.latency * sample_rate), channels))
        return stream

    return open_stream


def _silence(frames: int, channels: int) -> np.ndarray:
    """Frames of silence as the player writes ``channels`` channels: (frames,) mono, else (frames, channels)."""
    return np.zeros((frames,) if channels == 1 else (frames, channels), np.float32)


@dataclass
class _Utterance:
    key: str
    sample_rate: int
    channels: int
    blocks: deque[np.ndarray] = field(default_factory=deque)
    buffered: int = 0  # frames (a sample of each channel) queued, not yet written
    final: bool = False  # its last chunk is in
    cancelled: bool = False
    playing: bool = False  # prebuffered and being written; False again after running dry

    def ready(self, prebuffer_s: float) -> bool:
        """Whether the player thread has something to do with it now (a playing one: play or run dry)."""
        return self.cancelled or self.final or self.playing or self.buffered >= max(1, prebuffer_s * self.sample_rate)

    def take(self, count: int) -> np.ndarray:
        """Up to ``count`` queued frames, oldest first (fewer, or none, when fewer are queued)."""
        parts, wanted = [], count
        while self.blocks and wanted:
            block = self.blocks[0]
            if block.shape[0] <= wanted:
                parts.append(self.blocks.popleft())
            else:
                parts.append(block[:wanted])
                self.blocks[0] = block[wanted:]
            wanted -= parts[-1].shape[0]
        self.buffered -= count - wanted
        return np.concatenate(parts) if parts else _silence(0, self.channels)


def _finish(output: OutputStream, sample_rate: int, channels: int) -> None:
    """Play out what was written, then release the stream.

    Stopping does not wait for the device's own buffer everywhere (through ALSA's PulseAudio plugin
    the last ``latency`` seconds were lost), so silence as long as that buffer goes first.
    """
    output.write(_silence(math.ceil((output.latency + BLOCK_S) * sample_rate), channels))
    output.stop()
    output.close()


def _print_error(message: str) -> None:
    print(f"playback: {message}", file=sys.stderr)


class Speaker:
    """Plays utterances, each fed chunk by chunk under a key (a request id), one after another."""

    def __init__(
        self,
        open_stream: OpenStream,
        prebuffer_s: float = DEFAULT_PREBUFFER_S,
        on_error: Callable[[str], None] = _print_error,
    ) -> None:
        if prebuffer_s < 0:
            raise PlaybackError(f"prebuffer_s must be >= 0 seconds, got {prebuffer_s}")
        self.prebuffer_s = prebuffer_s
        self.underruns = 0  # times an utterance ran dry before its final chunk (heard as a gap)
        self._open = open_stream
        self._on_error = on_error
        self._changed = threading.Condition()
        self._queue: deque[_Utterance] = deque()
        self._ended: deque[str] = deque(maxlen=ENDED_MEMORY)
        self._closed = False
        self._idle = False  # the player thread waits for more than it was fed: wait_idle's condition
        self._thread = threading.Thread(target=self._run, name="speaker", daemon=True)
        self._thread.start()

    def feed(self, key: str, samples: np.ndarray, sample_rate: int, final: bool) -> None:
        """Queue a chunk of utterance ``key``: float samples, (n,) mono or (n, channels) (AudioChunk's); raises
        PlaybackError for one that cannot be played."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim not in (1, 2):
            raise PlaybackError(f"utterance {key[:8]}: samples of shape {samples.shape}, not (n,) or (n, channels)")
        if samples.ndim == 2 and samples.shape[1] == 1:
            samples = samples.reshape(-1)
        channels = channels_of(samples)
        with self._changed:
            if key in self._ended:
                raise PlaybackError(f"utterance {key[:8]} has ended (final or cancelled): chunk not played")
            newest = self._queue[-1] if self._queue else None
            if newest is None or newest.key != key:
                for earlier in self._queue:
                    if not earlier.final:
                        self._cancel(earlier)  # the source went on to another utterance without finishing it
                newest = _Utterance(key, sample_rate, channels)
                self._queue.append(newest)
            elif newest.final:
                raise PlaybackError(f"utterance {key[:8]}: a chunk after its final one: chunk not played")
            elif (newest.sample_rate, newest.channels) != (sample_rate, channels):
                raise PlaybackError(
                    f"utterance {key[:8]}: a chunk at {sample_rate} Hz, {channels} channels after "
                    f"{newest.sample_rate} Hz, {newest.channels} channels: chunk not played"
                )
            if samples.size:
                newest.blocks.append(samples)
                newest.buffered += samples.shape[0]
            newest.final = final
            self._idle = False
            self._changed.notify_all()

    def cancel(self, key: str) -> bool:
        """Stop utterance ``key`` at once (queued or playing); False if it is not here."""
        with self._changed:
            for utterance in self._queue:
                if utterance.key == key and not utterance.cancelled:
                    self._cancel(utterance)
                    self._idle = False
                    self._changed.notify_all()
                    return True
        return False

    def _cancel(self, utterance: _Utterance) -> None:
        utterance.cancelled = True
        utterance.blocks.clear()
        utterance.buffered = 0

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every utterance fed so far has ended (played, or cancelled); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._queue, timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the player has done all it can with what was fed so far and waits for more: every utterance
        ended, or the first one short of its prebuffer (before it starts, or after running dry); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._idle or self._closed, timeout)

    def close(self) -> None:
        """Drop what is still queued, let the device play what it was given, and release it."""
        with self._changed:
            for utterance in self._queue:
                self._cancel(utterance)
            self._closed = True
            self._changed.notify_all()
        self._thread.join()

    def __enter__(self) -> Speaker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        """The player thread: write each utterance's blocks to the device as they become ready."""
        output: OutputStream | None = None
        layout = (0, 0)  # the open stream's rate and channels
        try:
            while (step := self._next_step()) is not None:
                utterance, block = step
                if block is None:  # cancelled while playing: drop what the device still holds
                    if output is not None:
                        # Closed, not started again: a restarted stream lost up to 18 ms of the start of the next
                        # utterance (through PulseAudio); the next one opens a stream of its own.
                        output.abort()
                        output.close()
                        output = None
                    continue
                wanted = (utterance.sample_rate, utterance.channels)
                if output is None or layout != wanted:
                    if output is not None:
                        _finish(output, *layout)  # plays out the previous utterance first
                        output = None
                    try:
                        output, layout = self._open(*wanted), wanted
                    except PlaybackError as exc:
                        self._on_error(f"{exc}: utterance {utterance.key[:8]} not played")
                        self.cancel(utterance.key)
                        continue
                try:
                    output.write(block)
                except Exception as exc:  # the device went away mid-utterance (unplugged, server stopped)
                    self._on_error(f"the output failed ({exc}): utterance {utterance.key[:8]} stopped")
                    self.cancel(utterance.key)
                    output.close()
                    output = None  # reopened for the next utterance
        finally:
            if output is not None:
                _finish(output, *layout)

    def _next_step(self) -> tuple[_Utterance, np.ndarray | None] | None:
        """Wait for the next thing to do: (utterance, its next block), (utterance, None) when the one
        playing was cancelled, or None once closed. Ended utterances leave the queue here."""
        with self._changed:
            while True:
                while not (self._closed or (self._queue and self._queue[0].ready(self.prebuffer_s))):
                    self._idle = True  # until a feed or a cancel changes what there is to do
                    self._changed.notify_all()
                    self._changed.wait()
                if not self._queue:
                    return None
                head = self._queue[0]
                if head.cancelled:
                    self._end(head)
                    if head.playing:
                        return head, None
                    continue
                block = head.take(round(BLOCK_S * head.sample_rate))
                if block.size:
                    head.playing = True
                    return head, block
                if head.final:
                    self._end(head)
                else:
                    head.playing = False  # ran dry before its final chunk: prebuffer again
                    self.underruns += 1

    def _end(self, utterance: _Utterance) -> None:
        self._queue.popleft()
        self._ended.append(utterance.key)
        self._changed.notify_all()
