"""Voices: a reference clip or its codes, as the (T, n_vq) codes a prompt takes (docs/model.md, "Prompt format"),
and the library of named voices that the owner configures (``voices.*``), encoded once when the model loads.

A voice is bounded before it is decoded: a clip's duration is read from its header, a .npy's shape from its
header, and either is refused when longer than ``limits.max_reference_seconds`` or than the context leaves room
for (``VoiceLimit``), alone and with the other voices of its request. What comes from an untrusted client (the ROS
node) is looked up in the library, never opened: ``VoiceLibrary.find`` (docs/security.md,
"Request checks").

A voice of the library may carry its transcript, a UTF-8 ``.txt`` beside its file (``butler.txt`` beside
``butler.wav``): what a request that continues the voice puts before its text (docs/continuation.md).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moss_tts_node.codec.audio_io import clip_seconds, is_file, load_reference_audio
from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.config import Config
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.speakers import MAX_SPEAKERS, speaker_label

CODES_SUFFIX = ".npy"
CLIP_SUFFIXES = (".wav", ".flac", ".ogg")
TRANSCRIPT_SUFFIX = ".txt"
# Longer than any path the file system takes (PATH_MAX): such a value names no voice, and is not normalized.
_MAX_PATH_CHARS = 4096
# A voice's name is its file's name without the extension, and no file name is longer: a longer value names no
# voice, and is refused without a look.
MAX_NAME_CHARS = 255
_SHOWN_CHARS = 40  # of a name that is no voice, quoted in its refusal


@dataclass(frozen=True)
class VoiceLimit:
    """How long a voice may be: ``limits.max_reference_seconds``, and what an ``n_ctx``-row context leaves.

    The context check is a lower bound of what the prompt needs (the voice's slot rows, then the steps of the first
    frame: ``ModelSpec.first_frame_budget``), so a voice it passes may still leave too little room for a text: the
    prompt's own check says so.
    """

    max_seconds: float
    n_ctx: int
    spec: ModelSpec  # the model's, whose codebook count sets the rows a voice takes

    def check_together(self, references: list[int], prefix: int) -> None:
        """RequestError when voices of these frames, the ``references`` (of [S1], [S2] ...) and a ``prefix`` (0 for
        none), leave no room in the context for one frame, before any is decoded."""
        spec = self.spec
        rows = sum(spec.delayed_rows(frames) for frames in references) + prefix + spec.first_frame_budget
        if rows > self.n_ctx:
            seconds = (sum(references) + prefix) / FRAMES_PER_SECOND
            raise RequestError(
                f"the request's voices last {seconds:.1f} s together: their rows and one frame's steps need {rows} of "
                f"the {self.n_ctx} rows of the context ('llama.n_ctx'); give fewer or shorter voices, or raise "
                "llama.n_ctx"
            )

    def check(self, frames: int, what: str) -> None:
        """RequestError naming ``what`` when a voice of ``frames`` codec frames is too long."""
        seconds = frames / FRAMES_PER_SECOND
        if seconds > self.max_seconds:
            raise RequestError(
                f"{what} lasts {seconds:.1f} s, longer than the {self.max_seconds:g} s of "
                "'limits.max_reference_seconds': use 3 to 20 s of clear speech, or raise the limit"
            )
        rows = self.spec.delayed_rows(frames) + self.spec.first_frame_budget  # its slot rows, then one frame's steps
        if rows > self.n_ctx:
            raise RequestError(
                f"{what} lasts {seconds:.1f} s ({frames} frames): its prompt needs more than the {self.n_ctx} rows "
                "of the context ('llama.n_ctx'); use a shorter clip, or raise llama.n_ctx"
            )


def load_voice(
    reference: str | Path | np.ndarray,
    spec: ModelSpec,
    encoder: Callable[[], AbstractContextManager[AudioCodec]],
    limit: VoiceLimit,
    role: str = "reference",
) -> np.ndarray:
    """A voice as (T, n_vq) codes: from a WAV/FLAC clip (encoded with the codec ``encoder()`` gives), a .npy
    of codes, or an array of codes; refused (RequestError, naming it by its ``role``) before it is decoded when
    ``limit`` says it is too long."""
    if isinstance(reference, np.ndarray):
        codes = checked_codes(reference, spec, f"{role} codes")
        limit.check(codes.shape[0], f"the {role} codes")
        return codes
    path = Path(reference)
    if path.suffix.lower() == CODES_SUFFIX:
        return _load_codes(path, spec, limit, role)
    seconds = clip_seconds(path)
    limit.check(math.ceil(seconds * FRAMES_PER_SECOND), f"{role} audio {path}")
    with encoder() as codec:  # the clip is read as this codec takes it (its rate and channels)
        return codec.encode(load_reference_audio(path, max_seconds=seconds + 1.0, codec=type(codec)))


def voice_frames(reference: str | Path | np.ndarray) -> int:
    """How many codec frames a voice holds, read without decoding it: an array's shape, a .npy's from its header, a
    clip's duration from its header (RequestError for a clip that is missing or not audio). 0 where the value
    cannot be a voice's codes: ``load_voice`` says why."""
    if isinstance(reference, np.ndarray):
        return reference.shape[0] if reference.ndim == 2 else 0
    path = Path(reference)
    if path.suffix.lower() != CODES_SUFFIX:
        return math.ceil(clip_seconds(path) * FRAMES_PER_SECOND)
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False) if is_file(path) else None
    except (ValueError, OSError):
        return 0
    return mapped.shape[0] if mapped is not None and mapped.ndim == 2 else 0


def _load_codes(path: Path, spec: ModelSpec, limit: VoiceLimit, role: str) -> np.ndarray:
    """A .npy of codes; its shape is read from the header (a memory map) and checked before it is read."""
    if not is_file(path):
        raise RequestError(f"{role} audio not found: {path}")
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise RequestError(f"{path}: not a readable .npy of voice codes ({exc})") from exc
    if mapped.ndim == 2 and mapped.shape[1] == spec.n_vq:
        limit.check(mapped.shape[0], f"{role} codes {path}")
    return checked_codes(np.asarray(mapped), spec, str(path))


def checked_codes(codes: np.ndarray, spec: ModelSpec, what: str) -> np.ndarray:
    """``codes`` as int64 if they are (T, n_vq) codes of this model; RequestError naming ``what`` otherwise."""
    if codes.ndim == 2 and codes.shape[0] > 0 and codes.shape[1] != spec.n_vq:
        raise RequestError(
            f"{what}: codes of {codes.shape[1]} codebooks, but this model has {spec.n_vq}: they were encoded for "
            "another model; re-encode the clip with encode-voice, with this model's config"
        )
    if codes.ndim != 2 or codes.shape[1] != spec.n_vq or codes.shape[0] == 0:
        raise RequestError(f"{what}: shape {codes.shape}, expected (frames, {spec.n_vq}); make it with encode-voice")
    if not np.issubdtype(codes.dtype, np.integer) or codes.min() < 0 or codes.max() >= spec.audio_vocab_size:
        raise RequestError(f"{what}: codes must be integers in 0..{spec.audio_vocab_size - 1}")
    return codes.astype(np.int64)


@dataclass(frozen=True, eq=False)  # eq=False: its codes are an array, which has no truth value to compare by
class LibraryVoice:
    """One voice of the library: its name, its codes and the file they came from, and its transcript if it has one."""

    name: str
    codes: np.ndarray  # (T, n_vq) int64
    source: Path  # the file as configured; ``resolved`` is where it really is (links followed)
    resolved: Path
    in_directory: bool  # a file of one of voices.directories, so a client may also give its path
    transcript: str | None = None  # what the voice says, from the .txt beside its file (docs/continuation.md)

    @property
    def kind(self) -> str:
        """``codes`` for a .npy of codes, ``clip`` for an audio file (encoded when the library was built)."""
        return "codes" if self.source.suffix.lower() == CODES_SUFFIX else "clip"

    @property
    def seconds(self) -> float:
        return self.codes.shape[0] / FRAMES_PER_SECOND


class VoiceLibrary:
    """The voices a request may name, every one encoded when the model loads.

    Built from ``voices.files`` and the files directly inside ``voices.directories`` (clips and .npy codes,
    each named by its file name without the extension), and ``generation.reference_audio``, the default
    voice, which is one of them too. Two files of one name are refused when it is built, as is a file of a
    voice directory that links outside it.

    ``add`` and ``remove`` change it while it serves (the HTTP server's uploaded voices): each replaces its tables
    whole, so a reader on another thread sees the library before or after, never between.
    """

    def __init__(self, voices: dict[str, LibraryVoice], default: str | None) -> None:
        self._voices = voices
        self._by_path = _client_paths(voices.values())
        self.default_name = default
        self._changing = threading.Lock()

    def add(self, voice: LibraryVoice) -> None:
        """Make ``voice`` one of the library's at once; RequestError when its name is taken (nothing is replaced)."""
        with self._changing:
            self.check_free(voice.name)
            self._set({**self._voices, voice.name: voice})

    def check_free(self, name: str) -> None:
        """RequestError when a voice is called ``name`` already."""
        if name in self._voices:
            raise RequestError(f"a voice named {name!r} exists already: delete it first, or pick another name")

    def remove(self, name: str) -> LibraryVoice:
        """Take the voice ``name`` out of the library (requests that hold it keep its codes) and return it;
        KeyError when there is none, ValueError for the default voice."""
        with self._changing:
            voice = self._voices[name]
            if name == self.default_name:
                raise ValueError(f"{name!r} is the default voice (generation.reference_audio)")
            self._set({key: value for key, value in self._voices.items() if key != name})
            return voice

    def _set(self, voices: dict[str, LibraryVoice]) -> None:
        self._by_path = _client_paths(voices.values())
        self._voices = voices

    @classmethod
    def build(
        cls,
        config: Config,
        spec: ModelSpec,
        encoder: Callable[[], AbstractContextManager[AudioCodec]],
        limit: VoiceLimit,
    ) -> VoiceLibrary:
        """Encode every configured voice now; ConfigError naming the key of any that cannot be used."""
        voices: dict[str, LibraryVoice] = {}
        default = None
        with ExitStack() as stack:  # one encoder for every clip, loaded at the first (low_memory loads it once)
            loaded: list[AudioCodec] = []

            def shared_encoder() -> AbstractContextManager[AudioCodec]:
                if not loaded:
                    loaded.append(stack.enter_context(encoder()))
                return nullcontext(loaded[0])

            for key, path, in_directory in _configured(config):
                resolved = path.resolve()
                name = path.stem
                known = voices.get(name)
                if known is not None and known.resolved == resolved:
                    in_any = known.in_directory or in_directory
                    voices[name] = LibraryVoice(name, known.codes, path, resolved, in_any, known.transcript)
                elif known is not None:
                    raise ConfigError(
                        f"'{key}': two voices are named {name!r}: {known.source} and {path}; rename one of the files"
                    )
                else:
                    try:
                        codes = load_voice(path, spec, shared_encoder, limit)
                    except RequestError as error:
                        raise ConfigError(f"'{key}': voice {name!r} cannot be used: {error}") from error
                    transcript = _transcript(path, key, config.limits.max_text_chars)
                    voices[name] = LibraryVoice(name, codes, path, resolved, in_directory, transcript)
                if key == "generation.reference_audio":
                    default = name
        return cls(voices, default)

    @property
    def names(self) -> list[str]:
        return sorted(self._voices)

    def __iter__(self) -> Iterator[LibraryVoice]:
        return iter(self._voices[name] for name in self.names)

    def __len__(self) -> int:
        return len(self._voices)

    def __contains__(self, name: object) -> bool:
        return name in self._voices

    def __getitem__(self, name: str) -> LibraryVoice:
        voice = self._voices.get(name)
        if voice is None:
            raise KeyError(name)
        return voice

    @property
    def default(self) -> LibraryVoice | None:
        """The default voice (``generation.reference_audio``), or None when there is none."""
        return None if self.default_name is None else self._voices[self.default_name]

    def get(self, name: str) -> LibraryVoice | None:
        """The voice called ``name``, or None: the one lookup of a name, whoever asks (a client, the command line)."""
        return self._voices.get(name)

    def find(self, value: str, field: str, listing: str) -> LibraryVoice:
        """The voice an untrusted client asks for in the request's ``field``: a name is that voice, and a path (it
        has a "/") is the voice of a voice directory's file when its text, normalized, is that file's path
        (``_client_paths``). Nothing of the file system is read for it, no link followed (``os.path`` normalizes
        text alone), and every other value gets the library's one refusal (``named``'s), which quotes the value and
        says nothing else of it, so a client learns nothing about the files of the machine, links included.
        ``listing`` says where a client finds the names.
        """
        voice = self._named(value)
        if voice is None and self._by_path and "/" in value and len(value) <= _MAX_PATH_CHARS:
            voice = self._by_path.get(_normalized(value))
        if voice is None:
            raise RequestError(self._refusal(value, field, listing, bool(self._by_path)))
        return voice

    def named(self, name: str, field: str, listing: str) -> LibraryVoice:
        """The voice called ``name`` (a name only: a path is never one), given in the request's ``field``;
        RequestError naming it otherwise, and saying that ``listing`` lists the names."""
        voice = self._named(name)
        if voice is None:
            raise RequestError(self._refusal(name, field, listing, paths=False))
        return voice

    def _named(self, name: str) -> LibraryVoice | None:
        """The voice called ``name``; a value longer than a file name is none, and is not looked up."""
        return self.get(name) if len(name) <= MAX_NAME_CHARS else None

    def _refusal(self, value: str, field: str, listing: str, paths: bool) -> str:
        """Why ``value``, given in ``field``, is no voice: the same words for every value (quoted, shortened), and
        whether a voice directory's path would do (``paths``)."""
        shown = value if len(value) <= _SHOWN_CHARS else f"{value[:_SHOWN_CHARS]}..."
        refused = f"{field} {shown!r} is not a voice of this node"
        if not self._voices:
            return f"{refused}: it has no voices (its owner lists them in voices.files or voices.directories)"
        way = " or the path of a file in one of its voice directories" if paths else " (a name, never a path)"
        return f"{refused}: give one of the names that {listing} lists{way}"


def check_speaker_count(count: int) -> None:
    """RequestError unless a request's list of voices, ``count`` of them, holds one per speaker the prompt has."""
    if not 1 <= count <= MAX_SPEAKERS:
        raise RequestError(
            f"the request gives {count} voices: give 1 to {MAX_SPEAKERS}, the references of the speakers "
            f"{speaker_label(0)} to {speaker_label(MAX_SPEAKERS - 1)} in order (or one voice alone, '' for none)"
        )


def voices_by_name(
    library: VoiceLibrary, names: list[str], prefix_name: str, prefix_text: str, listing: str
) -> tuple[list[LibraryVoice | None] | str, LibraryVoice | None]:
    """The voices a remote client names (names only, never a path; docs/security.md, "Request checks"): the
    speakers' voices ``names`` ([S1] first, "" for a speaker without one; every one "": no reference at all, not
    even the default voice) and the voice it continues, ``prefix_name`` ("" for none), which needs its transcript:
    its own (``LibraryVoice.transcript``) or the request's ``prefix_text``. Counted and bounded before any name is
    looked up; ``listing`` says where a client finds the names, for a refusal.
    """
    if names:
        check_speaker_count(len(names))
    prefix = library.named(prefix_name, "prefix_voice", listing) if prefix_name else None
    if prefix is not None and prefix.transcript is None and not prefix_text.strip():
        raise RequestError(
            f"prefix_voice {prefix.name!r} has no transcript, and the speech that continues it follows what its "
            f"recording says: give that in prefix_text, or put {prefix.name}.txt beside the voice's file on the robot "
            f"(read when the model loads; {listing} says which voices have one)"
        )
    if not any(names):
        return "", prefix
    return [library.named(name, f"voices[{i}]", listing) if name else None for i, name in enumerate(names)], prefix


def _client_paths(voices: Iterable[LibraryVoice]) -> dict[str, LibraryVoice]:
    """The voice directories' files by the path a client may give, normalized: the file's path in its directory
    as the configuration resolved it (links followed) when the library was built. That is the owner's doing, at
    load time: a link in a voice directory (to a file of it, ``_directory_voices``) is a voice of its own name,
    found by its own path, and a path that leads to a voice only through a link (one outside the voice
    directories, a directory's own path through a link, a link made after the load) names none."""
    return {os.path.abspath(voice.source): voice for voice in voices if voice.in_directory}


def _normalized(path: str) -> str | None:
    """``path`` made absolute (a relative one from the working directory) with ".", ".." and repeated "/"
    collapsed as written: text alone, so a ".." after a link is not where the link leads. None when a relative
    path has no working directory to start from (it was removed)."""
    try:
        return os.path.abspath(path)
    except OSError:
        return None


def _transcript(voice: Path, key: str, max_chars: int) -> str | None:
    """The transcript of the voice in file ``voice``: the UTF-8 text of the .txt of its name beside it, stripped;
    None when there is none or it is blank (a blank one says nothing the continued speech could follow).
    ConfigError naming ``key`` for one that cannot be used."""
    path = voice.with_suffix(TRANSCRIPT_SUFFIX)
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8-sig") as file:
            text = file.read(max_chars + 1)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"'{key}': the transcript {path} cannot be read as UTF-8 text: {error}") from error
    if len(text) > max_chars:
        raise ConfigError(
            f"'{key}': the transcript {path} holds more than the {max_chars} characters of 'limits.max_text_chars'"
        )
    return text.strip() or None


def _configured(config: Config) -> Iterator[tuple[str, Path, bool]]:
    """(key, path, whether it is a voice directory's file) of every voice file the config names, the default
    voice last."""
    for path in config.voices.files:
        yield "voices.files", Path(path), False
    for directory in config.voices.directories:
        yield from (("voices.directories", path, True) for path in _directory_voices(Path(directory)))
    if config.generation.reference_audio:
        yield "generation.reference_audio", Path(config.generation.reference_audio), False


def _directory_voices(directory: Path) -> list[Path]:
    """The clips and .npy codes directly inside ``directory``; ConfigError for one that links outside it."""
    inside = directory.resolve()
    found = []
    for path in sorted(directory.iterdir()):
        if path.suffix.lower() not in (CODES_SUFFIX, *CLIP_SUFFIXES) or not path.is_file():
            continue
        if path.resolve().parent != inside:
            raise ConfigError(
                f"'voices.directories': {path} links to {path.resolve()}, outside its directory (a client may give "
                "the path of a directory's voice): copy the file in, or list it in voices.files"
            )
        found.append(path)
    return found
