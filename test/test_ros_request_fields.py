"""Continuation, several speakers and the prompt's fields over real DDS, as a user types them: the real ``ros2``
CLI against the node, both in one loopback-only network namespace (docs/ros.md, "Voices, speakers and the prompt's
fields"; docs/continuation.md, "ROS").

What reached the prompt is told by its rows, which the node reports (``timing.prompt_rows``) and which depend on
the request alone: each is checked against the prompt ``Synthesizer.stream`` builds in this process for the same
request through the Python API, and against that of the request without the field, so a field the node dropped
fails. The voices' codes are random, as the demo model's weights are: the prompt is what is checked, not the sound.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from ros_helpers import node_params_file, require_ros
from ros_helpers.netns import LoopbackNamespace, NodeProcess, serving, wait_for_line

from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesizer import Synthesizer

require_ros()

SPEAK = ("action", "send_goal", "/moss_tts_node/speak", "moss_tts_msgs/action/Speak")
SYNTHESIZE = ("service", "call", "/moss_tts_node/synthesize", "moss_tts_msgs/srv/Synthesize")
LIST_VOICES = ("service", "call", "/moss_tts_node/list_voices", "moss_tts_msgs/srv/ListVoices")
TRANSCRIPT = "Good evening, sir."
# nurse is the default voice; butler has a transcript; long fits the context alone, not four times over
FRAMES = {"alice": 30, "bob": 20, "butler": 25, "nurse": 15, "long": 320}
N_CTX = 1024


@pytest.fixture(scope="module")
def voices_params(demo_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The node's params: a voice directory of five voices (codes), butler with its transcript, nurse the default,
    in a context of ``N_CTX`` rows."""
    folder = tmp_path_factory.mktemp("voices")
    rng = np.random.default_rng(7)
    for name, frames in FRAMES.items():
        np.save(folder / f"{name}.npy", rng.integers(0, 1024, (frames, 32)))
    (folder / "butler.txt").write_text(f"{TRANSCRIPT}\n")
    values = {
        "llama.n_threads": 1,
        "llama.n_ctx": N_CTX,
        "generation.max_new_tokens": 40,
        "generation.reference_audio": str(folder / "nurse.npy"),
        "voices.directories": [str(folder)],
    }
    return node_params_file(demo_config, tmp_path_factory.mktemp("params") / "node.yaml", **values)


@pytest.fixture(scope="module")
def node(netns: LoopbackNamespace, voices_params: Path) -> Iterator[NodeProcess]:
    with serving(netns, ["--params-file", str(voices_params)]) as up:
        yield up


@pytest.fixture(scope="module")
def api(voices_params: Path) -> Iterator[Synthesizer]:
    """The same model and voices, in this process: the Python API's prompts to compare the node's with."""
    with Synthesizer.from_config_file(voices_params) as loaded:
        yield loaded


def api_rows(api: Synthesizer, text: str, voices: Any = None, prefix: str | None = None, **fields: Any) -> int:
    """The rows of the prompt the Python API builds for a request that names its voices as the node's library does
    (``voices``: a name, a list of names with None for a speaker without a voice, or None for the default)."""
    library = api.voices
    if isinstance(voices, list):
        voices = [None if name is None else library[name] for name in voices]
    elif voices:  # "": no voice at all
        voices = library[voices]
    request = SpeechRequest(text, voice=voices, prefix=None if prefix is None else library[prefix], **fields)
    return api.stream(request).prompt.shape[0]


def ros2(netns: LoopbackNamespace, *args: str) -> str:
    done = netns.ros2(*args)
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


def goal(netns: LoopbackNamespace, fields: str) -> dict[str, Any]:
    """``ros2 action send_goal`` of a Speak goal written as a user writes it (YAML); its status, and its result as
    the CLI prints it (YAML)."""
    out = ros2(netns, *SPEAK, fields)
    status = re.search(r"^Goal finished with status: (\w+)$", out, re.MULTILINE)
    assert status and "\nResult:\n" in out, out[-3000:]
    result = yaml.safe_load(out.split("\nResult:\n", 1)[1].split("\nGoal finished", 1)[0].strip())
    return {"status": status[1], "prompt_rows": result["timing"]["prompt_rows"], "message": result["message"]}


def test_list_voices_says_which_voices_carry_a_transcript(netns: LoopbackNamespace, node: NodeProcess) -> None:
    out = ros2(netns, *LIST_VOICES)
    listed = re.findall(
        r"VoiceInfo\(name='(\w+)', kind='codes', duration=[\d.]+, is_default=(\w+), has_transcript=(\w+)\)", out
    )
    assert listed == [
        ("alice", "False", "False"),
        ("bob", "False", "False"),
        ("butler", "False", "True"),
        ("long", "False", "False"),
        ("nurse", "True", "False"),
    ], out[-3000:]


def test_a_goal_continues_a_voice_by_name(netns: LoopbackNamespace, node: NodeProcess, api: Synthesizer) -> None:
    """prefix_voice with its transcript file, with and without alice as the [S1] reference; then a voice without
    a transcript, whose transcript the request gives."""
    text = "Dinner is served in the east wing."
    both = goal(netns, f"{{text: '{text}', voices: ['alice'], prefix_voice: 'butler'}}")
    assert both["status"] == "SUCCEEDED", both
    assert both["prompt_rows"] == api_rows(api, text, ["alice"], "butler") != api_rows(api, text, ["alice"])
    alone = goal(netns, f"{{text: '{text}', voices: [''], prefix_voice: 'butler'}}")  # no reference at all
    assert alone["prompt_rows"] == api_rows(api, text, "", "butler") != api_rows(api, text, None, "butler")
    given = goal(netns, f"{{text: '{text}', prefix_voice: 'bob', prefix_text: 'I beg your pardon.'}}")
    assert given["status"] == "SUCCEEDED", given
    assert given["prompt_rows"] == api_rows(api, text, None, "bob", prefix_text="I beg your pardon.")


def test_two_speakers_each_with_a_voice(netns: LoopbackNamespace, node: NodeProcess, api: Synthesizer) -> None:
    text = "[S1]Are you coming? [S2]In a minute."
    two = goal(netns, f"{{text: '{text}', voices: ['alice', 'bob']}}")
    assert two["status"] == "SUCCEEDED", two
    assert two["prompt_rows"] == api_rows(api, text, ["alice", "bob"]) != api_rows(api, text, ["alice"])
    second_only = goal(netns, f"{{text: '{text}', voices: ['', 'bob'], sound_event: 'door knock'}}")
    assert second_only["status"] == "SUCCEEDED", second_only
    expected = api_rows(api, text, [None, "bob"], sound_event="door knock")
    assert second_only["prompt_rows"] == expected != api_rows(api, text, [None, "bob"])


def test_an_old_clients_goal_is_served_as_before(netns: LoopbackNamespace, node: NodeProcess, api: Synthesizer) -> None:
    """The docs' goal, and one naming its voice in the field older clients set: none of the new fields."""
    plain = goal(netns, "{text: 'Hello', language: en}")
    assert plain["status"] == "SUCCEEDED" and plain["prompt_rows"] == api_rows(api, "Hello", language="en")
    old = goal(netns, "{text: 'Hello', reference_audio: 'bob'}")
    assert old["status"] == "SUCCEEDED" and old["prompt_rows"] == api_rows(api, "Hello", "bob")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            "voices: ['alice', 'carol']",
            "voices[1] 'carol' is not a voice of this node: give one of the names that `ros2 service call "
            "/moss_tts_node/list_voices moss_tts_msgs/srv/ListVoices` lists (a name, never a path)",
        ),
        ("prefix_voice: 'nurse'", "prefix_voice 'nurse' has no transcript"),
        ("voices: ['alice'], voice: 'bob'", "the request gives 'voices' and a voice in 'voice' or 'reference_audio'"),
        (  # MOSS-TTS's template has no scene; MOSS-TTSD's has (test_family_prompts.py)
            "scene: 'a hall'",
            "prompt has no scene field (its template's fields: reference, instruction, tokens, quality, sound_event, "
            "ambient_sound, language, text): leave scene out",
        ),
        (  # the core's refusal, answered as the node's are
            "voices: ['long', 'long', 'long', 'long']",
            f"the request's voices last 102.4 s together: their rows and one frame's steps need 1437 of the {N_CTX} "
            "rows of the context ('llama.n_ctx')",
        ),
    ],
)
def test_a_bad_voice_is_refused_with_the_way_out(
    netns: LoopbackNamespace, node: NodeProcess, fields: str, reason: str
) -> None:
    refused = goal(netns, f"{{text: 'Hello.', {fields}}}")
    assert refused["status"] == "ABORTED" and reason in refused["message"], refused
    answer = ros2(netns, *SYNTHESIZE, f"{{text: 'Hello.', {fields}}}")
    assert "success=False" in answer and reason in answer, answer[-3000:]


def test_a_text_stream_takes_its_voices_from_its_first_chunk(netns: LoopbackNamespace, node: NodeProcess) -> None:
    """A stream continuing butler is spoken; one continuing nurse (no transcript) is refused, its reason logged."""
    chunks = [
        {
            "chunk": {
                "stream_id": "continued",
                "text": "Dinner is served",
                "prefix_voice": "butler",
                "voices": ["alice"],
            }
        },
        {"chunk": {"stream_id": "continued", "text": " in the east wing.", "prefix_voice": "nurse", "final": True}},
        {"chunk": {"stream_id": "refused", "text": "Hello.", "prefix_voice": "nurse", "final": True}},
    ]
    answer = netns.client("text_stream", steps=chunks, finals=["continued"])
    assert [c["is_final"] for c in answer["chunks"] if c["request_id"] == "continued"][-1:] == [True]
    refusal = "text stream 'refused' refused: prefix_voice 'nurse' has no transcript"
    wait_for_line(node.output, refusal, lambda: node.process.poll() is None, "the node", 30.0)
    assert not any(c["request_id"] == "refused" for c in answer["chunks"])
