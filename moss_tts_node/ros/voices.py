"""The node's voices over ROS: ``~/list_voices`` says what they are, and a request's voices become theirs.

A request names one voice in ``voice`` (or ``reference_audio``, for clients older than that field): a name, or a
path, used only when its text, normalized, is the path of a voice directory's file, and nothing of the file
system is read for it (``VoiceLibrary.find``, docs/security.md, "Request checks"). The newer fields take names
only: ``voices``, one per speaker ([S1] first), and ``prefix_voice``, the recording the speech continues
(docs/continuation.md, "ROS"); they are counted and bounded before any name is looked up. The voices were
encoded when the node was configured.
"""

from __future__ import annotations

from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import TextChunk, VoiceInfo
from moss_tts_msgs.srv import Synthesize

from moss_tts_node.errors import RequestError
from moss_tts_node.synthesis.request import Voices
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary
from moss_tts_node.text.speakers import MAX_SPEAKERS

# A voice's name is its file's name without the extension, and no file name is longer: a longer value names no
# voice, and is refused without a look.
MAX_NAME_CHARS = 255
_SHOWN_CHARS = 40  # of a name that is no voice, quoted in its refusal


def requested_voices(
    library: VoiceLibrary, msg: Speak.Goal | Synthesize.Request | TextChunk, node: str
) -> tuple[Voices, LibraryVoice | None]:
    """The voices of a request as the synthesizer takes them: its references (one voice, a list of the speakers'
    voices, "" for none, None for the default voice) and the voice it continues (None: none). ``node`` is the
    node's full name, for the way to its list of voices in a refusal.

    ``voices`` replaces ``voice`` and ``reference_audio``, so a request may not give both; a list of empty
    names asks for no reference at all. A ``prefix_voice`` needs its transcript: the voice's own
    (``LibraryVoice.transcript``) or the request's ``prefix_text``.
    """
    names = list(msg.voices)
    if names and (msg.voice or msg.reference_audio):
        raise RequestError(
            "the request gives 'voices' and a voice in 'voice' or 'reference_audio': give every speaker's voice in "
            "'voices' alone ([S1] first)"
        )
    if len(names) > MAX_SPEAKERS:
        raise RequestError(
            f"the request gives {len(names)} voices: give at most {MAX_SPEAKERS}, one per speaker ([S1] first)"
        )
    prefix = _named(library, msg.prefix_voice, "prefix_voice", node) if msg.prefix_voice else None
    if prefix is not None and prefix.transcript is None and not msg.prefix_text.strip():
        raise RequestError(
            f"prefix_voice {prefix.name!r} has no transcript, and the speech that continues it follows what its "
            f"recording says: give that in prefix_text, or put {prefix.name}.txt beside the voice's file on the robot "
            "(read when the node is configured; ~/list_voices says which voices have one: has_transcript)"
        )
    if not names:
        return _one_voice(library, msg.voice, msg.reference_audio), prefix
    if not any(names):
        return "", prefix  # no reference at all, not even the default voice
    return [_named(library, name, f"voices[{i}]", node) if name else None for i, name in enumerate(names)], prefix


def _one_voice(library: VoiceLibrary, voice: str, reference_audio: str) -> LibraryVoice | None:
    """The voice a request asks for in ``voice`` or ``reference_audio``; None for the default voice (neither given)."""
    if voice and reference_audio and voice != reference_audio:
        raise RequestError("the request gives two voices, in 'voice' and in 'reference_audio': give one")
    value = voice or reference_audio
    return library.find(value) if value else None


def _named(library: VoiceLibrary, name: str, field: str, node: str) -> LibraryVoice:
    """The voice of the library called ``name`` (a name only: a path is never one), given in the request's
    ``field``; RequestError naming it otherwise."""
    if len(name) <= MAX_NAME_CHARS and name in library:
        return library[name]
    shown = name if len(name) <= _SHOWN_CHARS else f"{name[:_SHOWN_CHARS]}..."
    if not len(library):
        raise RequestError(
            f"{field} {shown!r} is not a voice of this node: it has no voices (its owner lists them in voices.files "
            "or voices.directories)"
        )
    raise RequestError(
        f"{field} {shown!r} is not a voice of this node: give one of the names that "
        f"`ros2 service call {node}/list_voices moss_tts_msgs/srv/ListVoices` lists (a name, never a path)"
    )


def voice_infos(library: VoiceLibrary) -> list[VoiceInfo]:
    """Every voice of ``library`` as ``~/list_voices`` answers it, by name."""
    default = library.default_name
    return [
        VoiceInfo(
            name=v.name,
            kind=v.kind,
            duration=v.seconds,
            is_default=v.name == default,
            has_transcript=v.transcript is not None,
        )
        for v in library
    ]
