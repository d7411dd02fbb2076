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
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary, voices_by_name


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
    listing = f"`ros2 service call {node}/list_voices moss_tts_msgs/srv/ListVoices`"
    if not names:
        prefix = voices_by_name(library, [], msg.prefix_voice, msg.prefix_text, listing)[1]
        return _one_voice(library, msg.voice, msg.reference_audio, listing), prefix
    return voices_by_name(library, names, msg.prefix_voice, msg.prefix_text, listing)


def _one_voice(library: VoiceLibrary, voice: str, reference_audio: str, listing: str) -> LibraryVoice | None:
    """The voice a request asks for in ``voice`` or ``reference_audio``; None for the default voice (neither given)."""
    if voice and reference_audio and voice != reference_audio:
        raise RequestError("the request gives two voices, in 'voice' and in 'reference_audio': give one")
    if voice:
        return library.find(voice, "voice", listing)
    return library.find(reference_audio, "reference_audio", listing) if reference_audio else None


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
