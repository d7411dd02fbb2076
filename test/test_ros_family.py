"""A 16-codebook model of the family through the node, end to end over real DDS: the MOSS-VoiceGenerator demo
(``demo-weights --model voice-generator``, docs/family.md) speaks a voice described in its instruction on
``~/synthesize`` and ``~/speak``, and ``/diagnostics`` names it. Two nodes of two models in two namespaces, from the
shipped launch files: test_ros_cli.py (it needs an installed package).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ros_helpers import node_params_file, require_ros
from ros_helpers.netns import LoopbackNamespace, NodeProcess, serving

from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME

require_ros()

MODEL = "MOSS-VoiceGenerator"
N_VQ = 16
DESIGNED = {"text": "Hello there, I am your robot.", "instruction": "an old man, calm and slow", "seed": 1}


@pytest.fixture(scope="module")
def node(
    netns: LoopbackNamespace, family_demo: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    config = family_demo("voice-generator")
    params = node_params_file(config, tmp_path_factory.mktemp("params") / "node.yaml", **{"llama.n_threads": 1})
    with serving(netns, ["--params-file", str(params)]) as up:
        yield up


def assert_16_codebook_speech(timing: dict[str, object], samples: int) -> None:
    """A whole utterance of a 16-codebook model: its audio holds every frame, and the delay pattern took
    ``N_VQ`` + 1 steps beyond its frames (the last codebook's delay and the end), where MOSS-TTS takes 33."""
    frames = timing["frames"]
    assert isinstance(frames, int) and frames > 0 and timing["stop_reason"] == "end", timing
    assert timing["steps"] == frames + N_VQ + 1, timing
    assert samples == frames * SAMPLES_PER_FRAME


def test_a_voice_generator_node_speaks_a_described_voice(netns: LoopbackNamespace, node: NodeProcess) -> None:
    response = netns.client("synthesize", requests=[DESIGNED])["responses"][0]
    assert response["success"], response["message"]
    assert_16_codebook_speech(response["timing"], response["bytes"] // 2)  # pcm_s16le
    assert response["duration"] == pytest.approx(response["bytes"] / 2 / SAMPLE_RATE)

    answer = netns.client("speak", goals=[DESIGNED])
    goal = answer["goals"][0]
    assert goal["success"], goal["message"]
    chunks = [c for c in answer["chunks"] if c["request_id"] == goal["id"]]
    assert chunks[-1]["is_final"] and [c["index"] for c in chunks] == list(range(len(chunks)))
    assert_16_codebook_speech(goal["timing"], sum(c["bytes"] for c in chunks) // 2)


def test_the_diagnostics_and_the_log_name_the_model(netns: LoopbackNamespace, node: NodeProcess) -> None:
    status = netns.client("diagnostics")
    assert status["values"]["model"] == MODEL, status
    ready = [line for line in node.output().splitlines() if "ready: model loaded in " in line]
    assert len(ready) == 1 and f" ({MODEL}); listening on /moss_tts_node/text" in ready[0], node.output()
