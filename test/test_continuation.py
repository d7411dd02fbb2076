"""Continuation cloning, several speakers and every prompt field, end to end on the demo model (docs/continuation.md).

What the prompt and the generated rows are is checked against upstream in ``test_continuation_reference.py``;
here: the audio (the new speech, decoded after the prefix as the model completed it, equal to the offline decode on
codec-tiny's real architecture), cancel and ``max_audio_s``, long texts and text streams, the library's transcripts,
the report, and every refusal.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import prompt_text

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.config import Config
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.model.delay import remove_delay
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.synthesis import voices as voices_module
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.pieces import Piece

TEXT = "Dinner is served in the east wing."
TRANSCRIPT = "Good evening, sir."
N_VQ = 32
PREFIX = np.random.default_rng(21).integers(0, 1024, size=(40, N_VQ))  # 3.2 s: longer than the delay's 31 frames


def completed_prefix(prompt: np.ndarray, generated: np.ndarray, frames: int) -> np.ndarray:
    """The prefix's frames as the model completed them: its rows in the prompt, then the generated rows, de-delayed."""
    return remove_delay(np.concatenate([prompt[prompt.shape[0] - frames :, 1:], generated[:, 1:]]))[:frames]


# -- the audio -----------------------------------------------------------------------------------------------------


def test_the_audio_is_the_new_speech_decoded_after_the_prefix_as_the_model_completed_it(
    stateful_synth: Synthesizer, codec_tiny_dir: Path
) -> None:
    stream = stateful_synth.stream(TEXT, prefix=PREFIX, prefix_text=TRANSCRIPT, seed=1)
    chunks = [chunk.samples for chunk in stream]
    report = stream.report
    assert report is not None and report.codec_decode == "stateful stream" and len(chunks) > 2
    assert stream.codes is not None and stream.generated is not None and stream.prompt is not None
    new = stream.codes
    context = completed_prefix(stream.prompt, stream.generated, PREFIX.shape[0])
    # The prompt held code (t, k) for t + k < T; the model wrote the rest of the last 31 frames in its first steps.
    held = np.add.outer(np.arange(PREFIX.shape[0]), np.arange(N_VQ)) < PREFIX.shape[0]
    np.testing.assert_array_equal(context[held], PREFIX[held])
    assert (context[~held] != PREFIX[~held]).mean() > 0.9  # its own codes, not the encoder's
    whole = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu").decode(np.concatenate([context, new]))
    expected = whole[PREFIX.shape[0] * SAMPLES_PER_FRAME :]  # from the first new frame: K + 1 frames, not K
    audio = np.concatenate(chunks)
    assert audio.shape == expected.shape == (new.shape[0] * SAMPLES_PER_FRAME,)
    np.testing.assert_allclose(audio, expected, rtol=0, atol=1e-6)  # the stream is the offline decode
    result = stateful_synth.synthesize(TEXT, prefix=PREFIX, prefix_text=TRANSCRIPT, seed=1)  # whole: the same audio
    np.testing.assert_array_equal(result.codes, new)
    np.testing.assert_allclose(result.audio, expected, rtol=0, atol=1e-6)
    # the report counts the prefix's rows among the prompt's, and only the new speech as audio
    assert report.prompt_rows == stream.prompt.shape[0] and report.frames == new.shape[0]
    assert report.audio_seconds == pytest.approx(new.shape[0] / FRAMES_PER_SECOND)


def test_the_windowed_scheme_takes_its_left_context_from_the_prefix(
    demo_config: Path, codec_tiny_dir: Path, synth: Synthesizer
) -> None:
    with Synthesizer.from_config_file(demo_config, {"model.codec_dir": str(codec_tiny_dir)}) as windowed:
        stream = windowed.stream(TEXT, prefix=PREFIX, prefix_text=TRANSCRIPT, seed=1)
        first = next(iter(stream))
        list(stream)
        assert stream.report is not None and stream.report.codec_decode == "windowed stream"
        assert stream.prompt is not None and stream.generated is not None and stream.codes is not None
        context = completed_prefix(stream.prompt, stream.generated, PREFIX.shape[0])
        left = windowed.config.audio.left_context_frames
        window = np.concatenate([context[context.shape[0] - left :], stream.codes[:1]])
        codec = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu")
        np.testing.assert_allclose(first.samples, codec.decode(window)[left * SAMPLES_PER_FRAME :], atol=1e-6)
        alone = codec.decode(stream.codes[:1])  # what the first frame would be without the prefix before it
        assert np.abs(first.samples - alone).max() > 1e-3


def test_cancel_and_max_audio_count_the_new_speech_only(synth: Synthesizer) -> None:
    request = SpeechRequest(TEXT, prefix=PREFIX, prefix_text=TRANSCRIPT, seed=2)
    steps = 0

    def count_steps() -> bool:
        nonlocal steps
        steps += 1
        return False

    stream = synth.stream(request, cancel=count_steps)
    first = next(iter(stream))
    assert steps == N_VQ  # the first new frame completes at step n_vq, after the prefix's last frames
    assert first.samples.shape == (SAMPLES_PER_FRAME,)
    cancel = threading.Event()
    cancelled = synth.stream(request, cancel=cancel)
    chunks = iter(cancelled)
    next(chunks)
    cancel.set()
    assert list(chunks) == [] and cancelled.cancelled
    bounded = synth.stream(request, max_audio_s=1.0)
    audio = np.concatenate([chunk.samples for chunk in bounded])
    assert bounded.report is not None and bounded.report.frames == int(FRAMES_PER_SECOND)
    assert audio.shape[0] == bounded.report.frames * SAMPLES_PER_FRAME


# -- the text of each piece ---------------------------------------------------------------------------------------


def planned_pieces(synth: Synthesizer, monkeypatch: pytest.MonkeyPatch) -> list[Piece]:
    """Records every piece the planner makes from now on."""
    pieces: list[Piece] = []
    original = synth.planner.pieces

    def recording(*args: Any, **kwargs: Any) -> Any:
        planned = original(*args, **kwargs)
        pieces.extend(item for item in planned if isinstance(item, Piece))
        return planned

    monkeypatch.setattr(synth.planner, "pieces", recording)
    return pieces


def assert_continues_the_prefix(synth: Synthesizer, piece: Piece, transcript: str) -> str:
    """The piece ends on the prefix's rows and its text begins with the transcript; returns its own text."""
    frames = PREFIX.shape[0]
    assert piece.prefix_frames == frames
    assert (piece.prompt[piece.prompt.shape[0] - frames :, 0] == synth.spec.audio_assistant_gen_slot_token_id).all()
    text = prompt_text(synth, piece.prompt).split("- Text:\n")[1].split("\n</user_inst>")[0]
    assert text.startswith(transcript + " ")
    return text[len(transcript) + 1 :]


def test_every_piece_of_a_long_text_continues_the_prefix(
    small_context: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = planned_pieces(small_context, monkeypatch)
    text = " ".join(f"This is sentence number {n}, which the butler says." for n in range(6))
    small_context.stream(TRANSCRIPT + " " + text, prefix=PREFIX, prefix_text=TRANSCRIPT)  # said once, not twice
    assert len(pieces) > 1
    said = [assert_continues_the_prefix(small_context, piece, TRANSCRIPT) for piece in pieces]
    assert " ".join(said) == text
    apart = r"needs more than one piece .* give its transcript \(prefix_text\) apart"
    for blank in (None, " \n "):  # a blank transcript is none: the text would follow nothing the prefix said
        with pytest.raises(RequestError, match=apart):
            small_context.stream(TRANSCRIPT + " " + text, prefix=PREFIX, prefix_text=blank)


def test_a_text_stream_continues_the_prefix_in_every_piece(synth: Synthesizer, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = planned_pieces(synth, monkeypatch)
    fragments = ["The soup ", "is ready. ", "The wine is ", "breathing. ", "Shall I bring it?"]
    stream = synth.stream_text(fragments, prefix=PREFIX, prefix_text=TRANSCRIPT, pack_tokens=0, seed=3)
    list(stream)
    assert stream.report is not None and stream.report.stop_reason != "cancelled"
    said = [assert_continues_the_prefix(synth, piece, TRANSCRIPT) for piece in pieces]
    assert said == ["The soup is ready.", "The wine is breathing.", "Shall I bring it?"]
    for blank in (None, "  "):
        with pytest.raises(RequestError, match=r"give the transcript \(prefix_text\)"):
            synth.stream_text(fragments, prefix=PREFIX, prefix_text=blank)


# -- voices, fields, transcripts ---------------------------------------------------------------------------------


def test_speakers_and_every_field_reach_the_prompt(synth: Synthesizer) -> None:
    a, b = PREFIX[:10], PREFIX[10:25]
    fields = {"sound_event": "door knock", "ambient_sound": "rain on a window", "quality": "high", "tokens": 60}
    text = prompt_text(synth, synth.stream("[S1]Are you coming? [S2]In a minute.", voice=[a, b], **fields).prompt)
    assert "- Reference(s):\n[S1]:\n<|audio_start|>" in text and "<|audio_end|>\n[S2]:\n<|audio_start|>" in text
    assert "- Tokens:\n60\n- Quality:\nhigh\n- Sound Event:\ndoor knock\n- Ambient Sound:\nrain on a window\n" in text
    assert "- Text:\n[S1]Are you coming? [S2]In a minute.\n" in text
    skipped = prompt_text(synth, synth.stream("Hello.", voice=[None, b]).prompt)
    assert "- Reference(s):\n[S2]:\n<|audio_start|>" in skipped and "[S1]" not in skipped
    assert "- Sound Event:\nNone\n- Ambient Sound:\nNone\n" in skipped


def test_the_same_clip_as_reference_and_prefix_is_read_once(
    synth: Synthesizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip = tmp_path / "butler.wav"
    write_wav(clip, 0.3 * np.sin(2 * np.pi * 220 * np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE), SAMPLE_RATE)
    reads: list[Path] = []
    original = voices_module.load_reference_audio

    def counting(path: Path, max_seconds: float | None = None, codec: type[AudioCodec] = AudioCodec) -> np.ndarray:
        reads.append(path)
        return original(path, max_seconds, codec)

    monkeypatch.setattr(voices_module, "load_reference_audio", counting)
    stream = synth.stream(TEXT, voice=clip, prefix=clip, prefix_text=TRANSCRIPT)
    assert len(reads) == 1
    frames = synth.encode_reference(clip).shape[0]
    assert stream.prompt is not None and stream.prompt[-1, 0] == synth.spec.audio_assistant_gen_slot_token_id
    assert (stream.prompt[:, 0] == synth.spec.audio_user_slot_token_id).sum() == frames + N_VQ - 1


def test_a_library_voice_brings_its_transcript(demo_config: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "butler.npy", PREFIX)
    (tmp_path / "butler.txt").write_text(TRANSCRIPT + "\n", encoding="utf-8")
    np.save(tmp_path / "maid.npy", PREFIX[:20])  # no transcript
    np.save(tmp_path / "page.npy", PREFIX[:20])
    (tmp_path / "page.txt").write_text(" \n", encoding="utf-8")  # a blank one: none
    overrides = {"voices.directories": [str(tmp_path)]}
    with Synthesizer.from_config_file(demo_config, overrides) as synth:
        butler, maid = synth.voices["butler"], synth.voices["maid"]
        assert butler.transcript == TRANSCRIPT and maid.transcript is None and synth.voices["page"].transcript is None
        stream = synth.stream(TEXT, prefix=butler)
        assert stream.prompt is not None
        assert f"- Text:\n{TRANSCRIPT} {TEXT}\n</user_inst>" in prompt_text(synth, stream.prompt)
        own = synth.stream(TEXT, prefix=butler, prefix_text="Quite so.")  # the request's transcript wins
        assert "- Text:\nQuite so. Dinner" in prompt_text(synth, own.prompt)
    (tmp_path / "butler.txt").write_text("x" * 50, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"butler\.txt holds more than the 40 characters of 'limits\.max_text_chars'"):
        Synthesizer.from_config_file(demo_config, {**overrides, "limits.max_text_chars": 40})


# -- refusals --------------------------------------------------------------------------------------------------


def _limits(config: Config, **limits: Any) -> Config:
    return replace(config, limits=replace(config.limits, **limits))


def test_bad_requests_are_refused_with_what_to_change(synth: Synthesizer) -> None:
    six = [PREFIX[:5]] * 6
    with pytest.raises(RequestError, match=r"gives 6 voices: give 1 to 5, the references of the speakers \[S1\] to"):
        synth.stream(TEXT, voice=six)
    with pytest.raises(RequestError, match="holds no voice"):
        synth.stream(TEXT, voice=[None, ""])
    with pytest.raises(RequestError, match=r"prefix codes: codes of 16 codebooks, but this model has 32: .* re-encode"):
        synth.stream(TEXT, prefix=PREFIX[:, :16], prefix_text=TRANSCRIPT)
    with pytest.raises(RequestError, match=r"the prefix codes lasts 3\.2 s, longer than the 2 s"):
        synth.stream(TEXT, prefix=PREFIX, prefix_text=TRANSCRIPT, config=_limits(synth.config, max_reference_seconds=2))
    config = _limits(synth.config, max_text_chars=len(TEXT) + 5)
    with pytest.raises(RequestError, match=r"\(text, language, instruction, .* and scene together\)"):
        synth.stream(TEXT, prefix=PREFIX, prefix_text=TRANSCRIPT, config=config)
    with pytest.raises(RequestError, match="prefix_text but no prefix"):
        synth.stream(TEXT, prefix_text=TRANSCRIPT)
    with pytest.raises(RequestError, match="only the prefix's transcript"):
        synth.stream(f"  {TRANSCRIPT} ", prefix=PREFIX, prefix_text=TRANSCRIPT)
    with pytest.raises(RequestError, match="the request's prefix must be a path"):
        synth.stream(TEXT, prefix=[PREFIX])


def test_voices_that_leave_no_room_are_refused_before_any_is_decoded(
    demo_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip = tmp_path / "long.wav"
    write_wav(clip, np.zeros(8 * SAMPLE_RATE), SAMPLE_RATE)  # 100 frames: alone it fits 256 rows, twice it does not
    with Synthesizer.from_config_file(demo_config, {"llama.n_ctx": 256}) as small:
        monkeypatch.setattr(voices_module, "load_reference_audio", None)  # calling it would fail the test
        with pytest.raises(RequestError, match=r"voices last 16\.0 s together: .* need 264 of the 256 rows"):
            small.stream(TEXT, voice=clip, prefix=tmp_path / "long.wav", prefix_text=TRANSCRIPT)
        long_prefix = np.random.default_rng(3).integers(0, 1024, size=(150, N_VQ))
        with pytest.raises(
            RequestError, match=r"takes \d+ rows of the 256-row context before its text \(the prefix's 150"
        ):
            small.stream(TEXT, prefix=long_prefix, prefix_text=TRANSCRIPT)
