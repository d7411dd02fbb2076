"""MOSS-TTS-Nano through the node, end to end over real DDS (``demo-weights --model nano``: 48 kHz stereo): the
node and its clients are separate processes in one loopback-only network namespace (ros_helpers/netns.py).

Nano runs through the Delay models' request line: ``~/text``, ``~/speak`` and ``~/synthesize`` speak, a named voice
is cloned, a field Nano's prompt has no place for is refused with the reason while the node serves on, ``~/stop``
stops speech, and a lifecycle round trip reloads it. Its audio leaves as it is made: every chunk, answer and the
audio_common AudioInfo say 48000 Hz and 2 channels and carry interleaved samples, which the player plays in stereo
(recorded back from a 48 kHz stereo null sink); ``audio.output_sample_rate`` / ``audio.output_channels`` set before
a configure give out 24 kHz mono instead.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from ros_helpers import node_params_file, require_ros
from ros_helpers.netns import LoopbackNamespace, NodeProcess, played_by_the_player, serving

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.model.spec import NanoSpec

if TYPE_CHECKING:
    from conftest import NullSink

require_ros()

SUCCEEDED = 4  # action_msgs/GoalStatus
RATE, CHANNELS = 48000, 2
FRAME = NanoSpec().samples_per_frame  # samples a channel of one frame: 3840
S16_FRAME_BYTES = 2 * CHANNELS  # one sample of each channel, pcm_s16le
VOICE = "robot_voice"
# Greedy text: the Nano demo then speaks until max_new_tokens (docs/nano.md, "Demo weights"), long enough to stop.
LONG = {"sampling.text_temperature": 0.0, "generation.max_new_tokens": 4000}


@pytest.fixture(scope="module")
def node(
    netns: LoopbackNamespace, nano_demo_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    folder = tmp_path_factory.mktemp("nano-params")
    clip = folder / f"{VOICE}.wav"  # 24 kHz mono: the node converts it to the codec's 48 kHz stereo
    write_wav(clip, 0.3 * np.sin(2 * np.pi * 200 * np.arange(24000) / 24000), 24000)
    values = {"llama.n_threads": 1, "voices.files": [str(clip)]}
    params = node_params_file(nano_demo_config, folder / "node.yaml", **values)
    with serving(netns, ["--params-file", str(params)]) as up:
        yield up


def assert_stereo_stream(chunks: list[dict[str, Any]], rate: int = RATE, channels: int = CHANNELS) -> None:
    """One utterance's chunks: in order, one final, each at ``rate`` with ``channels`` whole frames of samples,
    starting where the one before ended."""
    assert chunks and [c["index"] for c in chunks] == list(range(len(chunks)))
    assert [c["is_final"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    offset = 0.0
    for chunk in chunks:
        assert (chunk["sample_rate"], chunk["channels"], chunk["encoding"]) == (rate, channels, "pcm_s16le")
        assert chunk["bytes"] % (2 * channels) == 0
        assert chunk["start_offset"] == pytest.approx(offset)
        offset += chunk["bytes"] / (2 * channels) / rate


def test_text_speak_and_synthesize_give_48_khz_stereo(netns: LoopbackNamespace, node: NodeProcess) -> None:
    chunks = netns.client("text", texts=["Hello there, robot."])["chunks"]
    assert_stereo_stream(chunks)

    answer = netns.client("speak", goals=[{"text": "Hello there.", "seed": 2}])
    goal = answer["goals"][0]
    assert goal["status"] == SUCCEEDED and goal["success"], goal["message"]
    spoken = [c for c in answer["chunks"] if c["request_id"] == goal["id"]]
    assert_stereo_stream(spoken)
    frames = goal["timing"]["frames"]
    assert sum(c["bytes"] for c in spoken) == frames * FRAME * S16_FRAME_BYTES
    assert goal["duration"] == pytest.approx(frames * FRAME / RATE)

    response = netns.client("synthesize", requests=[{"text": "Hello there.", "seed": 1}])["responses"][0]
    assert response["success"], response["message"]
    assert (response["sample_rate"], response["channels"]) == (RATE, CHANNELS)
    assert response["bytes"] == response["timing"]["frames"] * FRAME * S16_FRAME_BYTES
    assert response["duration"] == pytest.approx(response["bytes"] / S16_FRAME_BYTES / RATE)


def test_a_named_voice_is_cloned_and_a_field_nano_lacks_is_refused(netns: LoopbackNamespace, node: NodeProcess) -> None:
    requests = [
        {"text": "Hello there.", "voice": VOICE, "seed": 1},
        {"text": "Hello there.", "language": "en"},  # Nano's prompt has no language field
        {"text": "Hello there.", "voice": "nobody"},
        {"text": "Still here.", "seed": 1},
    ]
    cloned, language, unknown, after = netns.client("synthesize", requests=requests)["responses"]
    assert cloned["success"] and cloned["channels"] == CHANNELS, cloned["message"]
    assert not language["success"] and "MOSS-TTS-Nano's prompt has no language field" in language["message"]
    assert not unknown["success"] and "nobody" in unknown["message"]
    assert after["success"], after["message"]  # the node serves on


def test_stop_ends_nano_speech_with_a_final_chunk_saying_so(netns: LoopbackNamespace, node: NodeProcess) -> None:
    steps = [
        {"params": LONG},
        {"text": "Hello there, robot, keep talking."},
        {"wait_audio": [0, 2]},
        {"stop": "service"},
        {"wait_final": 1},
        {"params": {"sampling.text_temperature": -1.0, "generation.max_new_tokens": 1500}},
    ]
    answer = netns.client("stop", steps=steps, timeout=120)
    finals = [c for c in answer["chunks"] if c["is_final"]]
    assert [c["end_reason"] for c in finals] == ["stop"]
    assert_stereo_stream(answer["chunks"])


@pytest.mark.skipif(
    importlib.util.find_spec("audio_common_msgs") is None,
    reason="audio_common_msgs is not installed (it is not on PyPI): the node publishes ~/audio only",
)
def test_audio_common_announces_and_carries_stereo(netns: LoopbackNamespace, node: NodeProcess) -> None:
    answer = netns.client("audio_common", texts=["Hello there."], params={"output_encoding": "pcm_s16le"})
    assert answer["info"] == {
        "channels": CHANNELS,
        "sample_rate": RATE,
        "sample_format": "S16LE",
        "bitrate": RATE * 16 * CHANNELS,
        "coding_format": "wave",
    }
    # The same interleaved S16LE bytes; on a failure, the message sizes say whether one was dropped or differs.
    sizes = {topic: answer[topic]["sizes"] for topic in ("raw", "chunks")}
    assert answer["raw"]["sha256"] == answer["chunks"]["sha256"], sizes


def test_the_player_plays_nano_in_stereo(
    netns: LoopbackNamespace, node: NodeProcess, stereo_sink: NullSink, tmp_path: Path
) -> None:
    sent, captured, log = played_by_the_player(netns, stereo_sink, tmp_path, "Hello robot.")
    assert np.abs(sent).max() > 0.01  # sound (the demo's gain), not silence that would compare as equal
    # Both channels, interleaved, at one offset (test_cli's play test says why 15 dB): a mono mix-down or a
    # channel swap would fall far below it.
    assert stereo_sink.snr_db(sent, captured) > 15, log.read_text()


def test_output_keys_set_before_a_configure_give_24_khz_mono(netns: LoopbackNamespace, node: NodeProcess) -> None:
    down = netns.client("transitions", transitions=["deactivate", "cleanup"])["steps"]
    assert [step["state"] for step in down] == ["inactive", "unconfigured"]
    mono = [["audio.output_sample_rate", 24000], ["audio.output_channels", "mono"]]
    try:
        assert all(change["successful"] for change in netns.client("params", set=mono)["set"])
        up = netns.client("transitions", transitions=["configure", "activate"])["steps"]
        assert all(step["success"] for step in up), up
        assert_stereo_stream(netns.client("text", texts=["Hello there."])["chunks"], rate=24000, channels=1)
        response = netns.client("synthesize", requests=[{"text": "Hello there.", "seed": 1}])["responses"][0]
        assert response["success"] and (response["sample_rate"], response["channels"]) == (24000, 1)
    finally:
        netns.client("transitions", transitions=["deactivate", "cleanup"])
        netns.client("params", set=[["audio.output_sample_rate", 0], ["audio.output_channels", "model"]])
        netns.client("transitions", transitions=["configure", "activate"])
