"""Audio out of the node: ``moss_tts_msgs/AudioChunk`` on ``~/audio``, and the ros-drivers
``audio_common`` topics when ``audio_common_msgs`` is installed.

``audio_common_msgs`` is not on PyPI and not a hard dependency: where it imports (an apt or
colcon ROS install), the node also publishes what ros-drivers' ``audio_capture`` publishes, so
``audio_play`` (format ``wave``) plays the speech with no glue:

- ``~/audio_common/audio``          AudioData, raw S16LE, channels interleaved (what ``audio_play`` subscribes to)
- ``~/audio_common/audio_stamped``  AudioDataStamped, the same with a header
- ``~/audio_common/audio_info``     AudioInfo, latched (transient local)

The player imports ``decode`` and ``AUDIO_QOS`` from here: this module imports no synthesis code (only
``pcm.py`` and the NumPy-only result types), and ``test/test_ros_player_imports.py`` keeps it so.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np
from moss_tts_msgs.msg import AudioChunk as AudioChunkMsg
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Header

from moss_tts_node.pcm import channels_of, float_to_pcm16, pcm16_to_float
from moss_tts_node.synthesis.results import AudioChunk

ENCODINGS = (AudioChunkMsg.ENCODING_PCM_S16LE, AudioChunkMsg.ENCODING_FLOAT32)

# Reliable, so no chunk of an utterance goes missing (best-effort subscribers still match), and
# deep enough to hold an utterance's burst: the model can produce audio many times faster than
# it plays.
AUDIO_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
LATCHED_QOS = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)


def encode(samples: np.ndarray, encoding: str) -> bytes:
    """Float samples, (n,) or (n, channels), as the bytes of ``encoding`` (one of ENCODINGS), channels interleaved."""
    if encoding == AudioChunkMsg.ENCODING_FLOAT32:
        return np.asarray(samples, dtype="<f4").tobytes()
    return float_to_pcm16(samples)


def decode(data: bytes, encoding: str) -> np.ndarray:
    """The float32 samples of ``data`` in ``encoding`` (one of ENCODINGS); ValueError for another."""
    if encoding == AudioChunkMsg.ENCODING_FLOAT32:
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if encoding == AudioChunkMsg.ENCODING_PCM_S16LE:
        return pcm16_to_float(data)
    raise ValueError(f"unknown encoding {encoding!r}: expected one of {', '.join(ENCODINGS)}")


def _audio_common() -> ModuleType | None:
    try:
        return importlib.import_module("audio_common_msgs.msg")
    except ImportError:
        return None


class AudioOut:
    """Publishes each chunk the moment the synthesizer yields it. The publishers exist in every lifecycle state;
    ``announce`` latches the AudioInfo of the model each configure loads."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._chunks = node.create_publisher(AudioChunkMsg, "~/audio", AUDIO_QOS)
        self._common = _audio_common()
        if self._common is None:
            node.get_logger().info("audio_common_msgs is not installed: publishing ~/audio only")
            return
        self._raw = node.create_publisher(self._common.AudioData, "~/audio_common/audio", AUDIO_QOS)
        self._stamped = node.create_publisher(self._common.AudioDataStamped, "~/audio_common/audio_stamped", AUDIO_QOS)
        self._info = node.create_publisher(self._common.AudioInfo, "~/audio_common/audio_info", LATCHED_QOS)

    def listeners(self) -> int:
        """How many subscriptions ~/audio has matched: its writer's own count, which a subscriber's view of the
        graph only approaches (~/audio is volatile: what is published before a match is lost to that reader)."""
        return self._chunks.get_subscription_count()

    def announce(self, sample_rate: int, channels: int) -> None:
        """Latch the audio_common AudioInfo of the loaded model's audio as the node gives it out (nothing without
        audio_common_msgs)."""
        if self._common is None:
            return
        self._info.publish(
            self._common.AudioInfo(
                channels=channels,
                sample_rate=sample_rate,
                sample_format="S16LE",
                bitrate=sample_rate * 16 * channels,  # bits/s of raw 16-bit PCM
                coding_format="wave",
            )
        )

    def publish(self, request_id: str, chunk: AudioChunk, encoding: str, end_reason: str) -> None:
        """One chunk on ~/audio (``end_reason`` on the final one: an AudioChunk ``END_REASON_*``), and its samples on
        the audio_common topics."""
        header = self._header()
        self._chunks.publish(
            AudioChunkMsg(
                header=header,
                request_id=request_id,
                chunk_index=chunk.index,
                sample_rate=chunk.sample_rate,
                channels=channels_of(chunk.samples),
                encoding=encoding,
                data=encode(chunk.samples, encoding),
                is_final=bool(end_reason),
                start_offset=chunk.start_s,
                end_reason=end_reason,
            )
        )
        if self._common is not None and chunk.samples.size:
            audio = self._common.AudioData(data=float_to_pcm16(chunk.samples))
            self._raw.publish(audio)
            self._stamped.publish(self._common.AudioDataStamped(header=header, audio=audio))

    def _header(self) -> Header:
        return Header(stamp=self._node.get_clock().now().to_msg())
