"""ros/voices.py without a middleware: a request's voices by name, and ~/list_voices' answer.

Over DDS with the real ``ros2`` CLI: test_ros_request_fields.py; the paths of the old fields: test_ros_security.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ros_helpers import require_ros

from moss_tts_node.errors import RequestError
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary

require_ros()

from moss_tts_msgs.action import Speak  # noqa: E402
from moss_tts_msgs.msg import TextChunk  # noqa: E402
from moss_tts_msgs.srv import Synthesize  # noqa: E402

from moss_tts_node.ros.voices import requested_voices, voice_infos  # noqa: E402
from moss_tts_node.synthesis.voices import MAX_NAME_CHARS  # noqa: E402

NODE = "/robot1/moss_tts_node"
LISTED = f"`ros2 service call {NODE}/list_voices moss_tts_msgs/srv/ListVoices` lists (a name, never a path)"


def voice(name: str, frames: int, transcript: str | None = None, in_directory: bool = False) -> LibraryVoice:
    path = Path(f"/voices/{name}.npy")
    return LibraryVoice(name, np.full((frames, 32), 7, np.int64), path, path, in_directory, transcript)


class Counted(VoiceLibrary):
    """A library that counts the names looked up in it."""

    looked_up = 0

    def get(self, name: str) -> LibraryVoice | None:
        self.looked_up += 1
        return super().get(name)


@pytest.fixture
def library() -> Counted:
    voices = [voice("alice", 10), voice("bob", 12), voice("butler", 25, "Good evening, sir.", in_directory=True)]
    return Counted({v.name: v for v in voices}, default="alice")


@pytest.mark.parametrize("message", [Speak.Goal, Synthesize.Request, TextChunk])
def test_voices_and_prefix_voice_are_the_library_voices_of_those_names(message: type, library: Counted) -> None:
    voices, prefix = requested_voices(library, message(voices=["bob", "", "alice"], prefix_voice="butler"), NODE)
    assert voices == [library["bob"], None, library["alice"]] and prefix is library["butler"]
    assert requested_voices(library, message(prefix_voice="bob", prefix_text="Hello."), NODE) == (None, library["bob"])


def test_an_old_clients_voice_is_found_as_before(library: Counted) -> None:
    """voice or reference_audio: a name, or the path of a voice directory's file; neither: the default voice."""
    assert requested_voices(library, Speak.Goal(voice="bob"), NODE) == (library["bob"], None)
    assert requested_voices(library, Speak.Goal(reference_audio="/voices/butler.npy"), NODE) == (
        library["butler"],
        None,
    )
    assert requested_voices(library, Speak.Goal(), NODE) == (None, None)


def test_a_list_of_empty_names_asks_for_no_voice_at_all(library: Counted) -> None:
    assert requested_voices(library, Speak.Goal(voices=["", ""]), NODE) == ("", None)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"voices": ["alice", "carol"]},
            f"voices[1] 'carol' is not a voice of this node: give one of the names that {LISTED}",
        ),
        ({"voices": ["/voices/bob.npy"]}, "voices[0] '/voices/bob.npy' is not a voice of this node"),  # a path: never
        ({"prefix_voice": "Butler"}, "prefix_voice 'Butler' is not a voice of this node"),
        ({"voices": ["x" * 300]}, f"voices[0] '{'x' * 40}...' is not a voice of this node"),
        (
            {"voices": ["alice"], "voice": "bob"},
            "the request gives 'voices' and a voice in 'voice' or 'reference_audio'",
        ),
        ({"voices": ["alice"], "reference_audio": "bob"}, "give every speaker's voice in 'voices' alone ([S1] first)"),
        (
            {"prefix_voice": "bob"},
            "prefix_voice 'bob' has no transcript, and the speech that continues it follows what its recording says: "
            "give that in prefix_text, or put bob.txt beside the voice's file on the robot",
        ),
        ({"prefix_voice": "bob", "prefix_text": " \t "}, "prefix_voice 'bob' has no transcript"),  # blank: none
    ],
)
def test_a_voice_that_is_not_the_librarys_is_refused_naming_it_and_the_way_out(
    library: Counted, fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(RequestError) as refused:
        requested_voices(library, Synthesize.Request(text="Hi.", **fields), NODE)
    assert reason in str(refused.value)


def test_too_many_voices_or_too_long_a_name_is_refused_before_any_lookup(library: Counted) -> None:
    with pytest.raises(
        RequestError, match=r"^the request gives 6 voices: give 1 to 5, the references of the speakers \[S1\] to \[S5\]"
    ):
        requested_voices(library, Speak.Goal(voices=["alice"] * 6), NODE)
    with pytest.raises(RequestError, match="is not a voice of this node"):
        requested_voices(library, Speak.Goal(voices=["a" * (MAX_NAME_CHARS + 1)]), NODE)
    assert library.looked_up == 0


def test_a_node_without_voices_says_so() -> None:
    with pytest.raises(RequestError, match=r"^voices\[0\] 'alice' is not a voice of this node: it has no voices \("):
        requested_voices(VoiceLibrary({}, None), Speak.Goal(voices=["alice"]), NODE)


def test_list_voices_says_which_voices_carry_a_transcript(library: Counted) -> None:
    infos = voice_infos(library)
    assert [(v.name, v.kind, v.duration, v.is_default, v.has_transcript) for v in infos] == [
        ("alice", "codes", 10 / FRAMES_PER_SECOND, True, False),
        ("bob", "codes", 12 / FRAMES_PER_SECOND, False, False),
        ("butler", "codes", 25 / FRAMES_PER_SECOND, False, True),
    ]
