"""Exceptions raised by moss_tts_node.

Every error says what is wrong and how to fix it; adapters (CLI, ROS node) show
``str(error)`` to people as it is.
"""

EXIT_BAD_INPUT = 2  # what the CLI and the node exit with when the input (config, request, files) is bad
EXIT_INTERRUPTED = 130  # what the CLI exits with after Ctrl-C (128 + SIGINT, as shells report it)


class MossTTSError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(MossTTSError):
    """A configuration file or value is invalid (unknown key, wrong type, bad range)."""


class WeightsError(MossTTSError):
    """A weight file is missing, unreadable, or has the wrong shape or dtype."""


class BridgeError(MossTTSError):
    """The llama.cpp bridge failed to build, load a model, or decode."""


class CodecError(MossTTSError):
    """The audio codec failed to load, or was given audio or codes it cannot use."""


class RequestError(MossTTSError):
    """A synthesis request is invalid (empty text, prompt too long, bad reference)."""


class ExpectedTooLong(RequestError):
    """A request whose speech is expected to take longer than its caller's bound (``max_expected_s``); an adapter
    may say which of its settings that bound is."""

    def __init__(self, expected_s: float, limit_s: float) -> None:
        super().__init__(
            f"the speech is expected to take {expected_s:.1f} s, more than the {limit_s:g} s this request may take: "
            "split the text, or stream it"
        )
        self.expected_s = expected_s
        self.limit_s = limit_s


class PlaybackError(MossTTSError):
    """Audio cannot be played: no ``sounddevice``/PortAudio, no output device, or a rate it refuses."""


class Cancelled(MossTTSError):
    """Raised by ``Synthesizer.synthesize`` when its cancel flag was set."""
