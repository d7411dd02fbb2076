"""``moss_tts_player``: plays the node's ``~/audio`` on this machine's speaker.

    ros2 run moss_tts_node moss_tts_player [--ros-args -p tts_node:=moss_tts_node -p device:=pulse]
    ros2 launch moss_tts_node moss_tts.launch.py play:=true

It subscribes to ``<tts_node>/audio`` (AudioChunk, either encoding, the rate and channels each message gives:
MOSS-TTS-Nano's stereo plays as stereo)
and feeds a ``Speaker`` (playback.py): a jitter buffer, one utterance per ``request_id`` in order.
Every utterance ends with one final chunk that says how it ended (``end_reason``): one that was stopped
(a cancel, ``~/stop``, an interrupting request, deactivation, an error) stops its audio at once, what the
player had buffered of it included; one the model ended plays to its end. Two more signals stop audio at
once: the Speak action's goal statuses (a goal canceling, canceled or aborted), for an older node whose final
chunks do not say; and the node's lifecycle (``<tts_node>/transition_event``): when the node leaves the active
state (deactivate, shutdown) every utterance it had fed stops, even one it had finished sending that still
plays, so nothing plays while the node is inactive.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Sequence

import rclpy
from action_msgs.msg import GoalStatus, GoalStatusArray
from lifecycle_msgs.msg import State, TransitionEvent
from moss_tts_msgs.msg import AudioChunk as AudioChunkMsg
from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_action_status_default

from moss_tts_node.config import NODE_NAME
from moss_tts_node.errors import MossTTSError, PlaybackError
from moss_tts_node.playback import DEFAULT_PREBUFFER_S, ENDED_MEMORY, Speaker, sound_output
from moss_tts_node.ros.audio import AUDIO_QOS, decode
from moss_tts_node.ros.process import start_node, wait_for_stop

PLAYER_NAME = "moss_tts_player"
STOPPED = (GoalStatus.STATUS_CANCELING, GoalStatus.STATUS_CANCELED, GoalStatus.STATUS_ABORTED)
# How the utterances that play to their end ended; "" is an older node's final chunk, which says nothing.
SPOKEN_TO_ITS_END = (AudioChunkMsg.END_REASON_END, AudioChunkMsg.END_REASON_MAX_NEW_TOKENS, "")
# rcl_lifecycle publishes transition events with the default QoS (reliable, volatile, depth 10).
TRANSITION_EVENT_QOS = QoSProfile(depth=10)


class PlayerNode(Node):
    """Parameters: ``tts_node`` (whose ~/audio to play), ``device`` (empty: the default), ``prebuffer_s``."""

    def __init__(self) -> None:
        super().__init__(PLAYER_NAME)
        tts_node = self.declare_parameter("tts_node", NODE_NAME).value
        device = self.declare_parameter("device", "").value
        prebuffer_s = float(self.declare_parameter("prebuffer_s", DEFAULT_PREBUFFER_S).value)
        self.speaker = Speaker(sound_output(device or None), prebuffer_s, self.get_logger().error)
        self._next_index: dict[str, int] = {}
        self._fed: deque[str] = deque(maxlen=ENDED_MEMORY)  # the utterances fed, newest last, to stop them all
        self.create_subscription(AudioChunkMsg, f"{tts_node}/audio", self._on_chunk, AUDIO_QOS)
        self.create_subscription(
            GoalStatusArray, f"{tts_node}/speak/_action/status", self._on_status, qos_profile_action_status_default
        )
        self.create_subscription(
            TransitionEvent, f"{tts_node}/transition_event", self._on_transition, TRANSITION_EVENT_QOS
        )
        self.get_logger().info(f"playing {self.resolve_topic_name(f'{tts_node}/audio')} (prebuffer {prebuffer_s} s)")

    def _on_chunk(self, msg: AudioChunkMsg) -> None:
        key = msg.request_id
        expected = self._next_index.get(key, 0)
        if msg.chunk_index != expected:
            self.get_logger().warning(f"request {key[:8]}: chunk {msg.chunk_index} after {expected - 1}: a gap")
        self._next_index = {key: msg.chunk_index + 1}  # only the current request's count is needed
        if not self._fed or self._fed[-1] != key:
            self._fed.append(key)
        if msg.is_final and msg.end_reason not in SPOKEN_TO_ITS_END:
            if self.speaker.cancel(key):
                self.get_logger().info(f"request {key[:8]} stopped ({msg.end_reason})")
            return
        try:
            samples = decode(bytes(msg.data), msg.encoding)
            if msg.channels > 1:  # interleaved: played as it is, in as many channels
                samples = samples.reshape(-1, msg.channels)
            self.speaker.feed(key, samples, msg.sample_rate, msg.is_final)
        except (ValueError, PlaybackError) as err:
            self.get_logger().error(f"request {key[:8]}, chunk {msg.chunk_index} not played: {err}")

    def _on_status(self, msg: GoalStatusArray) -> None:
        for status in msg.status_list:
            if status.status in STOPPED:
                key = bytes(status.goal_info.goal_id.uuid).hex()
                if self.speaker.cancel(key):
                    self.get_logger().info(f"request {key[:8]} stopped (goal status {status.status})")

    def _on_transition(self, msg: TransitionEvent) -> None:
        if msg.start_state.id == State.PRIMARY_STATE_ACTIVE:  # deactivating or shutting down
            stopped = [key for key in self._fed if self.speaker.cancel(key)]
            self._fed.clear()
            self.get_logger().info(
                f"the node left the active state ({msg.goal_state.label}): its audio stopped "
                f"({len(stopped)} utterances playing or waiting)"
            )


def main(args: Sequence[str] | None = None) -> int:
    """Play until SIGINT or SIGTERM; exit 2 when there is no sound output to play on."""
    started = start_node(args, PlayerNode, PLAYER_NAME, "cannot start: ", (MossTTSError,))
    if isinstance(started, int):
        return started
    node, stop = started
    spinner = threading.Thread(target=rclpy.spin, args=(node,), name="executor")
    spinner.start()
    wait_for_stop(stop)
    node.speaker.close()
    rclpy.try_shutdown()
    spinner.join()
    node.destroy_node()
    return 0


if __name__ == "__main__":
    sys.exit(main())
