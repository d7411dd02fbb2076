"""Nothing is too long: windowed codec calls, long texts split into pieces, low_memory staging."""

from __future__ import annotations

import gc
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.codec.base import WINDOW_OVERLAP_SPANS, run_windowed, window_context
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.codec.streaming import SegmentDecoder, WindowedStreamDecoding
from moss_tts_node.errors import RequestError
from moss_tts_node.llama.backbone import Backbone
from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME, frames_for_seconds
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.prompt import PromptFields
from moss_tts_node.tools.dev.codec_fidelity import snr_db

LONG_TEXT = (
    "The robot walks to the door. It opens the door slowly! Then it says hello to everyone in the room. "
    "Finally, it sits down and waits. Nobody answers, so it tells a story about the sea. The end."
)


def causal_sum(frames: np.ndarray, reach: int = 3) -> np.ndarray:
    """A causal 'graph': frame t's output is the sum of frames t-reach+1 .. t."""
    padded = np.concatenate([np.zeros((reach - 1, *frames.shape[1:])), frames])
    return np.stack([padded[t : t + reach].sum(axis=0) for t in range(frames.shape[0])])


def test_frames_for_seconds_rounds_down_to_whole_frames() -> None:
    assert frames_for_seconds(40) == 500
    assert frames_for_seconds(2.2) == 27
    assert frames_for_seconds(0.01) == 1


@pytest.mark.parametrize(("total", "limit", "context"), [(50, 10, 4), (50, 10, 7), (7, 10, 2), (31, 5, 2)])
def test_windowed_run_equals_one_call_and_respects_the_limit(total: int, limit: int, context: int) -> None:
    frames = np.random.default_rng(0).standard_normal((total, 3))
    windows: list[int] = []

    def graph(window: np.ndarray) -> np.ndarray:
        windows.append(window.shape[0])
        return causal_sum(window)

    out = run_windowed(frames, limit, graph, context)
    np.testing.assert_allclose(out, causal_sum(frames))  # context >= receptive field - 1
    assert max(windows) <= limit and sum(windows) >= total
    assert windows[0] == min(total, limit)  # the first window is used in full


def test_windowed_run_refuses_a_context_that_leaves_no_room() -> None:
    with pytest.raises(ValueError, match="context"):
        run_windowed(np.zeros((20, 1)), 4, causal_sum, context=4)


@pytest.mark.parametrize(("limit", "span", "context"), [(500, 125, 375), (2000, 125, 625), (90, 10, 50), (4, 125, 3)])
def test_window_overlap_is_spans_capped_to_leave_new_frames(limit: int, span: int, context: int) -> None:
    assert window_context(limit, span) == context


class CountingCodec(OnnxCodec):
    """The ONNX codec, recording how many frames each graph call gets."""

    calls: list[int]

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        self.calls.append(codes.shape[0])
        return super()._decode(codes)

    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        self.calls.append(waveform.shape[0] // SAMPLES_PER_FRAME)
        return super()._encode(waveform)


def counting_codec(paths: tuple[Path, Path], max_frames: int | None) -> CountingCodec:
    encoder, decoder = paths
    codec = CountingCodec(decoder, encoder, provider="cpu", threads=1, max_frames=max_frames)
    codec.calls = []
    return codec


def test_offline_decode_and_encode_longer_than_the_limit_are_windowed(demo_codec: tuple[Path, Path]) -> None:
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 1024, size=(37, 32))
    audio = (0.1 * rng.standard_normal(23 * SAMPLES_PER_FRAME)).astype(np.float32)
    whole, limited = counting_codec(demo_codec, None), counting_codec(demo_codec, 8)
    np.testing.assert_allclose(limited.decode(codes), whole.decode(codes), atol=1e-6)
    np.testing.assert_array_equal(limited.encode(audio), whole.encode(audio))
    assert whole.calls == [37, 23]
    assert max(limited.calls) == 8 and len(limited.calls) > 2


def test_streaming_with_a_left_context_longer_than_the_limit_stays_within_it(demo_codec: tuple[Path, Path]) -> None:
    codes = np.random.default_rng(2).integers(0, 1024, size=(40, 32))
    codec = counting_codec(demo_codec, 6)
    stream = SegmentDecoder(WindowedStreamDecoding(codec, left_context=25), chunk_frames=5)
    pieces = [stream.push(frame) for frame in codes]
    pieces.append(stream.end_segment())
    audio = np.concatenate([piece for piece in pieces if piece is not None])
    np.testing.assert_allclose(audio, counting_codec(demo_codec, None).decode(codes), atol=1e-6)
    assert max(codec.calls) <= 6


def test_codec_tiny_windows_overlapping_by_the_chosen_spans_stay_close_to_one_call(codec_tiny_dir: Path) -> None:
    """The real architecture's stacked attention reaches past any overlap: the error is measured, not zero.

    codec-tiny's span is 10 frames; windows of the overlap plus 4 spans, as ``codec-fidelity``
    measures them (docs/stream-decoder.md, "Long audio: windows": 41.7 dB, 7.4e-4 on a peak of 1.1e-2).
    """
    paths = (codec_tiny_dir / "encoder.onnx", codec_tiny_dir / "decoder.onnx")
    windowed = counting_codec(paths, None)
    span = windowed.attention_span_frames
    windowed.max_frames = limit = (WINDOW_OVERLAP_SPANS + 4) * span
    codes = np.random.default_rng(5).integers(0, 1024, size=(2 * limit + 7, 32))
    one_call = counting_codec(paths, None).decode(codes)
    audio = windowed.decode(codes)
    assert len(windowed.calls) > 2 and max(windowed.calls) == limit
    assert snr_db(audio, one_call) > 35
    assert np.abs(audio - one_call).max() < 2e-3
    # The measurement the choice rests on: one span of overlap is far off.
    one_span = run_windowed(codes, limit, lambda window: windowed._decode(window).reshape(-1, SAMPLES_PER_FRAME), span)
    assert snr_db(one_span.reshape(-1), one_call) < 10


# -- long text -------------------------------------------------------------------------------


def test_text_too_long_for_the_context_is_spoken_in_pieces_as_one_stream(small_context: Synthesizer) -> None:
    stream = small_context.stream(LONG_TEXT, seed=3, max_new_tokens=60)
    chunks = list(stream)
    report, generated = stream.report, stream.generated
    assert report is not None and generated is not None and stream.codes is not None
    pieces = int(np.sum(generated[:, 0] == small_context.spec.im_end_token_id))
    pieces += report.stop_reason == "max_new_tokens"  # a piece cut by the budget has no im_end
    assert pieces >= 2
    assert [chunk.index for chunk in chunks] == list(range(len(chunks)))
    assert [chunk.is_final for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].stop_reason == report.stop_reason
    starts = np.cumsum([0] + [chunk.samples.shape[0] for chunk in chunks[:-1]]) / SAMPLE_RATE
    np.testing.assert_allclose([chunk.start_s for chunk in chunks], starts)
    audio = np.concatenate([chunk.samples for chunk in chunks])
    assert audio.shape[0] == stream.codes.shape[0] * SAMPLES_PER_FRAME
    assert report.steps == generated.shape[0] and report.frames == stream.codes.shape[0]
    assert report.prompt_rows > stream.prompt.shape[0]  # every piece's prompt counted
    assert stream.prompt.shape[0] + 60 <= small_context.n_ctx


def test_each_piece_fits_the_context_and_ends_a_sentence(small_context: Synthesizer) -> None:
    pieces = small_context.planner.plan(PromptFields(text=LONG_TEXT), [], max_new_tokens=1000)
    assert len(pieces) >= 2
    for piece in pieces:
        assert piece.prompt.shape[0] + piece.max_steps <= small_context.n_ctx
        text = small_context.prompts.tokenizer.decode(piece.prompt[:, 0].tolist())
        assert re.search(r"[.!?]\s*</user_inst>", text), text
    assert len(small_context.planner.plan(PromptFields(text="Hello."), [], max_new_tokens=1000)) == 1


def test_a_cancelled_split_request_stops_at_once(small_context: Synthesizer) -> None:
    steps = 0

    def cancel_after_40() -> bool:
        nonlocal steps
        steps += 1
        return steps > 40

    stream = small_context.stream(LONG_TEXT, seed=3, max_new_tokens=60, cancel=cancel_after_40)
    chunks = list(stream)
    assert stream.cancelled and stream.report is not None and stream.report.steps == 40
    assert not any(chunk.is_final for chunk in chunks)


# -- low_memory ------------------------------------------------------------------------------


def test_low_memory_loads_stages_in_turn_and_gives_the_same_speech(
    demo_config: Path, synth: Synthesizer, tmp_path: Path
) -> None:
    resident = _loaded_stages()  # the ``synth`` fixture's
    with Synthesizer.from_config_file(demo_config, {"model.low_memory": True}) as staged:
        assert _loaded_stages() == resident  # nothing of its own resident between requests
        expected = synth.synthesize("Hello! I am a robot.", seed=4)
        got = staged.synthesize("Hello! I am a robot.", seed=4)
        np.testing.assert_array_equal(got.codes, expected.codes)
        np.testing.assert_allclose(got.audio, expected.audio, atol=1e-5)
        assert _loaded_stages() == resident
        clip = tmp_path / "voice.wav"
        write_wav(clip, 0.3 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE), SAMPLE_RATE)
        np.testing.assert_array_equal(staged.encode_reference(clip), synth.encode_reference(clip))


def _loaded_stages() -> tuple[int, int]:
    """Backbones holding a llama.cpp model, and codecs holding an ONNX Runtime session, alive in this process."""
    gc.collect()
    # type(), not isinstance(): some live objects (NumPy's NpzFile attribute bags) answer any attribute
    # lookup, __class__ included, with an error.
    objects = gc.get_objects()
    backbones = sum(1 for o in objects if issubclass(type(o), Backbone) and o._handle is not None)
    codecs = sum(1 for o in objects if issubclass(type(o), OnnxCodec) and not o._closed)
    return backbones, codecs


class CountingTokenizer:
    """A tokenizer that records the text of every ``encode`` call and does the rest as the real one."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer
        self.encoded: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> object:
        self.encoded.append(text)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._tokenizer, name)

    def times(self, text: str) -> int:
        """How many calls tokenized ``text``, alone or in a prompt."""
        return sum(text in encoded for encoded in self.encoded)


def test_a_text_that_fits_is_tokenized_once_for_its_prompt_its_plan_and_its_estimate(
    synth: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = CountingTokenizer(synth.prompts.tokenizer)
    monkeypatch.setattr(synth.prompts, "tokenizer", counting)
    stream = synth.stream("Hello there, I am a robot.", seed=1)
    assert counting.times("Hello there, I am a robot.") == 1
    assert stream.estimated_seconds is not None and stream.estimated_seconds > 0
    config = replace(synth.config, generation=replace(synth.config.generation, pause_markers="silence"))
    synth.stream("First part here. [pause 1s] Second part there.", seed=1, config=config)
    assert counting.times("First part here.") == counting.times("Second part there.") == 1  # one per piece


def test_a_request_expected_to_take_too_long_is_refused_before_its_text_is_split(
    small_context: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = CountingTokenizer(small_context.prompts.tokenizer)
    monkeypatch.setattr(small_context.prompts, "tokenizer", counting)
    with pytest.raises(RequestError, match=r"expected to take \d+\.\d s, more than the 2 s this request may take"):
        small_context.stream(LONG_TEXT, max_expected_s=2.0)
    assert len(counting.encoded) == 1  # measured in one prompt; no sentence was measured for a split
    assert len(small_context.stream(LONG_TEXT, max_expected_s=600.0).prompt) > 0  # within the bound: planned
