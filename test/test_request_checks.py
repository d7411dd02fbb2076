"""What a request is checked for before any heavy work, the voice library, and the bound on a request's audio:
the core's half of docs/security.md, "Request checks" (the node's half is in test_ros_security.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from moss_tts_node.codec.audio_io import clip_seconds, load_reference_audio, write_wav
from moss_tts_node.config import Config, LimitsConfig, SamplingConfig, load_config
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.synthesis import voices as voices_module
from moss_tts_node.synthesis.request import SpeechRequest, check_request
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary, VoiceLimit
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.normalize import has_something_to_say, normalize_text
from moss_tts_node.timing import StopReason

LIMITS = LimitsConfig()


def tone(path: Path, seconds: float, rate: int = SAMPLE_RATE) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    write_wav(path, 0.3 * np.sin(2 * np.pi * 220 * t), rate)
    return path


def codes(path: Path, frames: int) -> Path:
    np.save(path, np.random.default_rng(frames).integers(0, 1024, (frames, 32)))
    return path


def short(config: Config, steps: int = 40) -> Config:
    """``config`` with few generation steps, so that a request that is accepted is spoken quickly."""
    return replace(config, generation=replace(config.generation, max_new_tokens=steps))


# -- the cheap checks: fields and length ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"seed": -5}, r"seed must be -1 .* got -5"),
        ({"seed": -2}, r"seed must be -1"),
        ({"seed": 2**63}, r"seed must be -1"),
        ({"seed": True}, r"seed must be -1"),
        ({"seed": 1.5}, r"seed must be -1"),
        ({"tokens": 0}, r"tokens must be a whole number from 1"),
        ({"max_new_tokens": -1}, r"max_new_tokens must be a whole number from 1"),
        ({"language": 3}, r"language must be a string, got int"),
        ({"voice": 3}, r"voice must be a path, an array of codes"),
        ({"sampling": replace(SamplingConfig(), audio_top_p=1.5)}, r"'sampling\.audio_top_p' must be <= 1\.0"),
        ({"sampling": replace(SamplingConfig(), text_temperature=float("nan"))}, r"must be a number, got nan"),
        ({"instruction": "calm \ud800"}, r"instruction is not valid Unicode \(a lone surrogate\)"),
    ],
)
def test_bad_fields_are_refused_with_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        check_request(SpeechRequest("Hello.", **fields), LIMITS)


def test_a_text_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(RequestError, match="text must be a string, got bytes"):
        check_request(SpeechRequest(b"Hello."), LIMITS)  # type: ignore[arg-type]


def test_seeds_minus_one_to_the_largest_are_accepted() -> None:
    for seed in (None, -1, 0, 2**63 - 1):
        check_request(SpeechRequest("Hello.", seed=seed), LIMITS)


def test_the_length_limit_counts_every_text_field_and_names_its_key() -> None:
    limits = LimitsConfig(max_text_chars=10)
    check_request(SpeechRequest("a" * 6, instruction="b" * 2, language="en"), limits)  # 10: at the limit
    with pytest.raises(RequestError, match=r"11 characters .* more than the 10 of 'limits\.max_text_chars'"):
        check_request(SpeechRequest("a" * 6, instruction="b" * 2, language="en", quality="q"), limits)


def test_an_oversized_text_is_refused_before_it_is_cleaned(synth: Synthesizer, monkeypatch: pytest.MonkeyPatch) -> None:
    cleaned: list[str] = []
    monkeypatch.setattr("moss_tts_node.synthesis.preparation.normalize_text", lambda text: cleaned.append(text) or text)
    limit = synth.config.limits.max_text_chars
    with pytest.raises(RequestError, match=r"limits\.max_text_chars"):
        synth.stream("word " * 200_000)  # the megabyte of the issue: refused without looking at it
    assert cleaned == []
    synth.stream("a" * limit)  # at the limit: cleaned and planned
    assert cleaned == ["a" * limit]


# -- nothing to say -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "🤖🤖🤖",
        "... !!! ???",
        "😊👍✨",  # an LLM's whole reply, often
        "**🎉** — 👋",
        "\u200f\u202e\u200b",  # RTL marks and a zero-width space
        "$ % & * + = ~ ^",
        "\u0301\u0301",  # combining marks with nothing to combine with
    ],
)
def test_a_text_with_nothing_to_say_is_refused(synth: Synthesizer, text: str) -> None:
    assert not has_something_to_say(normalize_text(text))
    for normalize in (True, False):
        config = replace(synth.config, generation=replace(synth.config.generation, normalize_text=normalize))
        with pytest.raises(RequestError, match=r"^nothing to say: "):
            synth.stream(text, config=config)


@pytest.mark.parametrize("text", ["2", "Hi 🤖", "你好", "[laugh]", "½", "٣", "Ωμέγα!!!"])
def test_a_letter_or_a_digit_of_any_script_is_something_to_say(text: str) -> None:
    assert has_something_to_say(normalize_text(text))


def test_an_empty_text_is_still_empty(synth: Synthesizer) -> None:
    with pytest.raises(RequestError, match="the text is empty"):
        synth.stream(" \n\t")


# -- a voice's length, before it is decoded -------------------------------------------------------------------


def test_a_clip_longer_than_the_limit_is_refused_from_its_header(
    synth: Synthesizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip = tone(tmp_path / "long.wav", 31.0)  # the default limit is 30 s
    assert clip_seconds(clip) == pytest.approx(31.0)

    def not_decoded(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("the clip was decoded before it was refused")

    monkeypatch.setattr(voices_module, "load_reference_audio", not_decoded)
    with pytest.raises(RequestError, match=r"lasts 31\.0 s, longer than the 30 s of 'limits\.max_reference_seconds'"):
        synth.stream("Hello.", voice=clip)
    with pytest.raises(RequestError, match=r"lasts 4\.0 s, longer than the 2 s"):
        synth.stream("Hello.", voice=codes(tmp_path / "long.npy", 50), config=_limited(synth.config, 2.0))


def test_a_voice_the_context_cannot_hold_is_refused_before_it_is_decoded(
    demo_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip = tone(tmp_path / "voice.wav", 20.0)  # 250 frames: with the prompt, more than 256 rows
    with Synthesizer.from_config_file(demo_config, {"llama.n_ctx": 256}) as small:
        monkeypatch.setattr(voices_module, "load_reference_audio", None)  # calling it would fail the test
        with pytest.raises(RequestError, match=r"needs more than the 256 rows of the context \('llama\.n_ctx'\)"):
            small.stream("Hello.", voice=clip)
        with pytest.raises(RequestError, match=r"needs more than the 256 rows"):
            small.stream("Hello.", voice=np.zeros((250, 32), dtype=np.int64))


def test_at_most_the_allowed_audio_is_decoded_whatever_the_header_says(tmp_path: Path) -> None:
    clip = tone(tmp_path / "five.wav", 5.0)
    assert load_reference_audio(clip, max_seconds=5.0).shape[0] == 63 * SAMPLES_PER_FRAME  # padded to frames
    with pytest.raises(RequestError, match=r"holds more than 2 s of audio"):
        load_reference_audio(clip, max_seconds=2.0)


@pytest.mark.parametrize("name", ["a" * 5000, "a\0b", "/".join(["x" * 200] * 30) + ".wav", "x" * 300 + ".npy"])
def test_unusable_paths_are_refused_cleanly(synth: Synthesizer, name: str) -> None:
    with pytest.raises(RequestError, match="not found"):
        synth.stream("Hello.", voice=name)


def _limited(config: Config, seconds: float) -> Config:
    return replace(config, limits=replace(config.limits, max_reference_seconds=seconds))


# -- the audio of a whole request ------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
def test_max_audio_bounds_every_piece_of_a_request_together(small_context: Synthesizer, streaming: bool) -> None:
    text = " ".join(f"This is sentence number {n}, which the robot says." for n in range(8))
    unbounded = small_context.stream(text, seed=3, streaming=streaming)
    assert len(small_context.planner.plan(_fields(text), [], 600)) > 1  # several pieces
    free = list(unbounded)
    assert unbounded.report is not None and unbounded.report.audio_seconds > 3.0  # else the bound below proves nothing
    bounded = small_context.stream(text, seed=3, streaming=streaming, max_audio_s=3.0)
    chunks = list(bounded)
    report = bounded.report
    assert report is not None and report.stop_reason is StopReason.MAX_NEW_TOKENS
    assert report.frames <= 3.0 * FRAMES_PER_SECOND
    assert sum(chunk.samples.shape[0] for chunk in chunks) <= 3.0 * FRAMES_PER_SECOND * SAMPLES_PER_FRAME
    assert [chunk.is_final for chunk in chunks].count(True) == 1 and chunks[-1].is_final
    prefix = np.concatenate([c.samples for c in chunks])  # the same audio as unbounded, cut short
    if streaming:
        np.testing.assert_allclose(prefix, np.concatenate([c.samples for c in free])[: prefix.shape[0]], atol=1e-5)


@pytest.fixture(scope="module")
def low_memory(demo_config: Path) -> Iterator[Synthesizer]:
    """The demo model with its stages loaded in turn: every piece is generated before any is decoded."""
    with Synthesizer.from_config_file(demo_config, {"model.low_memory": True}) as loaded:
        yield loaded


@pytest.mark.parametrize("staged", [False, True], ids=["resident", "low_memory"])
def test_max_audio_counts_the_silence_of_pauses_too(synth: Synthesizer, low_memory: Synthesizer, staged: bool) -> None:
    """A pause marker rendered as silence takes frames of the budget: cut there, it is the request's end."""
    synthesizer = low_memory if staged else synth
    config = replace(synth.config, generation=replace(synth.config.generation, pause_markers="silence"))
    text = "Hello. [pause 5s] And goodbye."
    whole = synthesizer.synthesize(text, seed=1, config=config, max_new_tokens=40)
    assert whole.audio.shape[0] > 5 * SAMPLE_RATE  # the pause and the speech around it
    cut = synthesizer.stream(text, seed=1, config=config, max_new_tokens=40, max_audio_s=2.0, streaming=False)
    chunks = list(cut)
    audio = np.concatenate([chunk.samples for chunk in chunks])
    assert cut.report is not None and cut.report.stop_reason is StopReason.MAX_NEW_TOKENS
    assert [chunk.is_final for chunk in chunks].count(True) == 1 and chunks[-1].is_final
    assert 1.5 * SAMPLE_RATE < audio.shape[0] <= 2.0 * SAMPLE_RATE
    np.testing.assert_allclose(audio, whole.audio[: audio.shape[0]], atol=1e-6)  # the same start, cut short


def test_the_estimate_is_known_before_generating(synth: Synthesizer) -> None:
    short_text, long_text = synth.stream("Hello."), synth.stream("Hello there. " * 40)
    assert 0 < short_text.estimated_seconds < long_text.estimated_seconds
    assert synth.stream("Hello.", tokens=50).estimated_seconds == 4.0  # the tokens field is the length asked for
    silence = replace(synth.config, generation=replace(synth.config.generation, pause_markers="silence"))
    assert synth.stream("Hello. [pause 5s] Bye.", tokens=50, config=silence).estimated_seconds == 9.0


def _fields(text: str) -> Any:
    from moss_tts_node.text.prompt import PromptFields

    return PromptFields(text=text)


# -- the voice library ------------------------------------------------------------------------------------------


@pytest.fixture
def voice_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "voices"
    folder.mkdir()
    tone(folder / "butler.wav", 1.0)
    codes(folder / "nurse.npy", 25)
    (folder / "README.txt").write_text("not a voice")
    (folder / "sub").mkdir()
    return folder.resolve()  # as the configuration resolves it: a client's path is matched against that text


def library(synth: Synthesizer, demo_config: Path, **overrides: Any) -> VoiceLibrary:
    config = load_config(demo_config, {f"voices.{key}": value for key, value in overrides.items()})
    return VoiceLibrary.build(config, synth.spec, synth.stages.encoder, VoiceLimit(30.0, synth.n_ctx, synth.spec))


LISTING = "~/list_voices"


def find(voices: VoiceLibrary, value: str) -> LibraryVoice:
    """The voice a client asks for in a request's ``voice`` field."""
    return voices.find(value, "voice", LISTING)


def test_the_library_names_every_voice_and_encodes_it_once(
    synth: Synthesizer, demo_config: Path, voice_dir: Path, tmp_path: Path
) -> None:
    extra = codes(tmp_path / "guide.npy", 40)
    voices = library(synth, demo_config, files=[str(extra)], directories=[str(voice_dir)])
    assert voices.names == ["butler", "guide", "nurse"]
    assert [(v.name, v.kind, v.seconds, v.in_directory) for v in voices] == [
        ("butler", "clip", 13 / FRAMES_PER_SECOND, True),
        ("guide", "codes", 40 / FRAMES_PER_SECOND, False),
        ("nurse", "codes", 2.0, True),
    ]
    np.testing.assert_array_equal(voices["butler"].codes, synth.encode_reference(voice_dir / "butler.wav"))
    assert voices.default is None


def test_the_default_voice_is_one_of_the_library(demo_config: Path, voice_dir: Path) -> None:
    overrides = {"voices.directories": [str(voice_dir)], "generation.reference_audio": str(voice_dir / "nurse.npy")}
    with Synthesizer.from_config_file(demo_config, overrides) as synth:
        assert synth.voices.default_name == "nurse" and synth.voices.names == ["butler", "nurse"]
        np.testing.assert_array_equal(
            synth.stream("Hi.").prompt, synth.stream("Hi.", voice=voice_dir / "nurse.npy").prompt
        )


def test_two_voices_of_one_name_are_refused_at_load(
    synth: Synthesizer, demo_config: Path, voice_dir: Path, tmp_path: Path
) -> None:
    other = codes(tmp_path / "butler.npy", 30)
    with pytest.raises(ConfigError, match=r"two voices are named 'butler'"):
        library(synth, demo_config, files=[str(other)], directories=[str(voice_dir)])


def test_a_voice_too_long_or_unreadable_is_refused_at_load_naming_the_key(
    synth: Synthesizer, demo_config: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"'voices\.files': voice 'long' cannot be used: .*limits\.max_reference"):
        library(synth, demo_config, files=[str(codes(tmp_path / "long.npy", 400))])
    (tmp_path / "bad.wav").write_text("not audio")
    with pytest.raises(ConfigError, match=r"'voices\.files': voice 'bad' cannot be used: .*not a readable audio"):
        library(synth, demo_config, files=[str(tmp_path / "bad.wav")])
    with pytest.raises(ConfigError, match=r"'voices\.directories' directory not found"):
        library(synth, demo_config, directories=[str(tmp_path / "absent")])


def test_a_voice_directory_file_that_links_outside_is_refused_at_load(
    synth: Synthesizer, demo_config: Path, voice_dir: Path, tmp_path: Path
) -> None:
    (voice_dir / "outside.npy").symlink_to(codes(tmp_path / "elsewhere.npy", 20))
    with pytest.raises(ConfigError, match=r"links to .*elsewhere\.npy, outside its directory"):
        library(synth, demo_config, directories=[str(voice_dir)])


def test_find_takes_names_and_directory_paths_and_nothing_else(
    synth: Synthesizer, demo_config: Path, voice_dir: Path, tmp_path: Path
) -> None:
    extra = codes(tmp_path / "guide.npy", 40)
    voices = library(synth, demo_config, files=[str(extra)], directories=[str(voice_dir)])
    assert find(voices, "butler").name == "butler"
    assert find(voices, str(voice_dir / "nurse.npy")).name == "nurse"
    # The text normalized: ".", "..", "//" collapsed as written (no link is read), a relative path taken from the
    # working directory.
    assert find(voices, f"{voice_dir}/sub/../nurse.npy").name == "nurse"
    assert find(voices, f"{voice_dir}//./nurse.npy").name == "nurse"
    assert find(voices, os.path.relpath(voice_dir / "nurse.npy", Path.cwd())).name == "nurse"

    (voice_dir / "sub" / "etc").symlink_to("/etc")
    (voice_dir / "passwd.wav").symlink_to("/etc/passwd")  # made after the library was built
    (voice_dir / "alias.npy").symlink_to(voice_dir / "nurse.npy")  # a link to a voice, made after the build too
    (tmp_path / "elsewhere").symlink_to(voice_dir)  # a link outside every voice directory, into one
    relative_escape = os.path.relpath("/etc/passwd", Path.cwd())
    refused = [
        "/etc/passwd",
        "/etc/shadow",
        "/proc/self/environ",
        f"{voice_dir}/../../../../../../etc/passwd",
        "../" * 12 + "etc/shadow",
        relative_escape,
        str(voice_dir / "sub" / "etc" / "passwd"),
        str(voice_dir / "passwd.wav"),
        str(voice_dir / "alias.npy"),
        str(tmp_path / "elsewhere" / "nurse.npy"),
        str(voice_dir / "absent.wav"),
        str(voice_dir / "README.txt"),
        str(extra),  # a voice by name, not by path: it is in no voice directory
        "/nonexistent/voice.wav",
        "guide.npy",
        "a\0b/c",
        "x/" * 3000,
        "Butler",
        "",
    ]
    reasons = set()
    for value in refused:
        with pytest.raises(RequestError) as error:
            find(voices, value)
        shown = value if len(value) <= 40 else f"{value[:40]}..."
        reasons.add(str(error.value).replace(repr(shown), "'...'", 1))
    assert reasons == {
        f"voice '...' is not a voice of this node: give one of the names that {LISTING} lists or the path of a file "
        "in one of its voice directories"
    }


def test_a_link_in_a_voice_directory_when_it_loads_is_a_voice_of_its_own_name_and_path(
    synth: Synthesizer, demo_config: Path, voice_dir: Path, tmp_path: Path
) -> None:
    """The owner's links are followed when the library is built: a link to a file of the directory is a voice
    named and found by its own path, with the codes of the file it leads to; a directory configured through a link
    is where the link led then, and its files are found there."""
    (voice_dir / "alias.npy").symlink_to(voice_dir / "nurse.npy")
    (tmp_path / "configured").symlink_to(voice_dir)
    voices = library(synth, demo_config, directories=[str(tmp_path / "configured")])
    assert voices.names == ["alias", "butler", "nurse"]
    np.testing.assert_array_equal(voices["alias"].codes, voices["nurse"].codes)
    assert find(voices, str(voice_dir / "alias.npy")).name == "alias"
    assert find(voices, str(voice_dir / "nurse.npy")).name == "nurse"
    with pytest.raises(RequestError, match="not a voice of this node"):
        find(voices, str(tmp_path / "configured" / "nurse.npy"))


def test_find_touches_no_file_of_the_machine(
    synth: Synthesizer, demo_config: Path, voice_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is opened, looked at (stat, lstat) or read as a link for a client's value, with a voice directory
    or without one: what a client learns cannot depend on the files of the machine, links included."""
    with_directory = library(synth, demo_config, directories=[str(voice_dir)])
    files_only = library(synth, demo_config, files=[str(voice_dir / "nurse.npy")])
    touched: list[tuple[str, object]] = []

    def recording(name: str, real: Any) -> Any:
        return lambda *args, **kwargs: touched.append((name, args[0])) or real(*args, **kwargs)

    for name in ("open", "stat", "lstat", "readlink", "scandir", "listdir", "access"):
        monkeypatch.setattr(os, name, recording(name, getattr(os, name)))
    monkeypatch.setattr("builtins.open", recording("builtins.open", open))
    values = ("/etc/passwd", str(voice_dir / "nurse.npy"), f"{voice_dir}/sub/../butler.wav", "butler", "../x/y")
    for voices in (with_directory, files_only):
        for value in values:
            with contextlib.suppress(RequestError):
                find(voices, value)
    monkeypatch.undo()
    assert touched == []


# -- fuzzing the API's checks ------------------------------------------------------------------------------------

# RTL marks, a zero-width space, controls, lone surrogates, emoji, CJK punctuation, brackets, a letter, breaks
HOSTILE = ["\u200f", "\u202e", "\u200b", "\x00", "\x1b", "\ud800", "\udfff", "🤖", "。", "【", "】", "a", " ", "\n"]
ANY_CHARACTER = st.characters(exclude_categories=())  # every code point: controls, surrogates, RTL marks
texts = st.one_of(
    st.text(ANY_CHARACTER, max_size=300),
    st.text(st.sampled_from(HOSTILE), max_size=LIMITS.max_text_chars + 2),
    st.builds(lambda char, n: char * n, ANY_CHARACTER, st.integers(1, LIMITS.max_text_chars + 2)),  # no spaces
)


small_texts = st.none() | st.text(ANY_CHARACTER, max_size=30)
samplings = st.builds(
    SamplingConfig,
    text_temperature=st.floats(-1, 150) | st.just(float("nan")),
    text_top_k=st.integers(-1, 2000),
    audio_temperature=st.floats(0, 100),
    audio_top_k=st.integers(0, 1100),
    audio_top_p=st.floats(0, 1.2),
    audio_repetition_penalty=st.floats(0, 120),
)
valid_samplings = st.builds(
    SamplingConfig,
    text_temperature=st.floats(0, 100),
    text_top_k=st.integers(0, 2000),
    audio_temperature=st.floats(0, 100),
    audio_top_k=st.integers(0, 1025),
    audio_top_p=st.floats(0, 1),
    audio_repetition_penalty=st.floats(0.01, 100),
)
# What a request with fields in range and a hostile text may be refused for: its text alone.
TEXT_REFUSALS = (
    "the text is empty",
    "nothing to say",
    "is not valid Unicode",
    "limits.max_text_chars",
    "control token",
)


@pytest.fixture(scope="module")
def voice_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """Voices a request may give: ``valid`` ones, and every kind of ``invalid`` one."""
    folder = tmp_path_factory.mktemp("fuzz_voices")
    (folder / "fake.wav").write_text("not audio")
    valid = [None, "", str(tone(folder / "voice.wav", 1.0)), str(codes(folder / "voice.npy", 20))]
    invalid = [
        "/etc/passwd",
        str(folder / "fake.wav"),
        str(codes(folder / "long.npy", 500)),
        "a\0b",
        "x" * 5000,
        np.zeros((3, 8), dtype=np.int64),
    ]
    return {"valid": [*valid, np.zeros((3, 32), dtype=np.int64)], "invalid": invalid}


def spoken_or_refused(synth: Synthesizer, request: SpeechRequest) -> str | None:
    """Speak ``request`` (at most 40 steps a piece) if it is accepted, and check that it was: None. The reason
    if it is refused: a RequestError, never another exception."""
    try:
        stream = synth.stream(request, config=short(synth.config))
    except RequestError as error:
        assert str(error)  # a reason for people
        event("refused", str(error)[:40])  # pytest --hypothesis-show-statistics shows the mix
        return str(error)
    chunks = list(stream)
    assert stream.report is not None and chunks and chunks[-1].is_final
    event("spoken")
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_requests_are_refused_cleanly_or_spoken(
    synth: Synthesizer, voice_files: dict[str, list[Any]], data: Any
) -> None:
    request = SpeechRequest(
        data.draw(texts, "text"),
        language=data.draw(small_texts, "language"),
        instruction=data.draw(small_texts, "instruction"),
        quality=data.draw(st.none() | st.just("high"), "quality"),
        tokens=data.draw(st.none() | st.integers(-2, 3000), "tokens"),
        voice=data.draw(st.sampled_from(voice_files["valid"] + voice_files["invalid"]), "voice"),
        seed=data.draw(st.none() | st.integers(-10, 2**64), "seed"),
        max_new_tokens=data.draw(st.none() | st.integers(-2, 40), "max_new_tokens"),  # 40 at most: spoken quickly
        sampling=data.draw(st.none() | samplings, "sampling"),
    )
    spoken_or_refused(synth, request)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_texts_with_fields_in_range_are_spoken_unless_the_text_is_refused(
    synth: Synthesizer, voice_files: dict[str, list[Any]], data: Any
) -> None:
    request = SpeechRequest(
        data.draw(texts, "text"),
        language=data.draw(st.none() | st.sampled_from(["en", "zh", " French ", "CANTONESE"]), "language"),
        instruction=data.draw(st.none() | st.text(st.sampled_from(HOSTILE), max_size=20), "instruction"),
        tokens=data.draw(st.none() | st.integers(1, 3000), "tokens"),
        voice=data.draw(st.sampled_from(voice_files["valid"]), "voice"),
        seed=data.draw(st.none() | st.integers(-1, 2**63 - 1), "seed"),
        max_new_tokens=data.draw(st.none() | st.integers(1, 40), "max_new_tokens"),
        sampling=data.draw(st.none() | valid_samplings, "sampling"),
    )
    reason = spoken_or_refused(synth, request)
    assert reason is None or any(kind in reason for kind in TEXT_REFUSALS), reason
