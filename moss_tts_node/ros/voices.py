"""The node's voices over ROS: ``~/list_voices`` says what they are, and a request's voice becomes one of them.

A request names a voice (its ``voice`` field, or ``reference_audio`` for clients older than that field); a
value with a "/" is a path, used only when its text, normalized, is the path of a voice directory's file, and
nothing of the file system is read for it (``VoiceLibrary.find``, docs/security.md,
"Request checks"). The voices were encoded
when the node was configured.
"""

from __future__ import annotations

import numpy as np
from moss_tts_msgs.msg import VoiceInfo

from moss_tts_node.errors import RequestError
from moss_tts_node.synthesis.voices import VoiceLibrary


def requested_voice(library: VoiceLibrary, voice: str, reference_audio: str) -> np.ndarray | None:
    """The codes of the voice a request asks for; None for the default voice (neither field given)."""
    if voice and reference_audio and voice != reference_audio:
        raise RequestError("the request gives two voices, in 'voice' and in 'reference_audio': give one")
    value = voice or reference_audio
    return library.find(value).codes if value else None


def voice_infos(library: VoiceLibrary) -> list[VoiceInfo]:
    """Every voice of ``library`` as ``~/list_voices`` answers it, by name."""
    default = library.default_name
    return [VoiceInfo(name=v.name, kind=v.kind, duration=v.seconds, is_default=v.name == default) for v in library]
