"""The Synthesizer end to end on the demo model: real llama.cpp, real ONNX Runtime."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import linked_copy
from qwen3_reference import exact_synthesizer

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.codec.layout import STREAM_DECODER_FILE
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.errors import ConfigError, RequestError, WeightsError
from moss_tts_node.llama.backbone import Backbone
from moss_tts_node.model.delay import remove_delay
from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.prompt import PromptFields
from moss_tts_node.timing import StageClock, TimingReport

TEXT = "Hello! I am a robot."


def test_stream_equals_offline_decode_and_keeps_the_last_chunk(synth: Synthesizer) -> None:
    stream = synth.stream(TEXT, seed=1)
    chunks = list(stream)
    assert stream.report is not None and stream.report.stop_reason == "end"
    codes = stream.codes
    assert codes is not None and codes.shape[0] > 1
    audio = np.concatenate([c.samples for c in chunks])
    assert audio.shape == (codes.shape[0] * SAMPLES_PER_FRAME,)
    with synth.stages.decoder() as codec:
        np.testing.assert_allclose(audio, codec.decode(codes), atol=1e-5)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.is_final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].stop_reason == "end"  # the final chunk says why, as the report does
    starts = np.cumsum([0] + [c.samples.shape[0] for c in chunks[:-1]]) / SAMPLE_RATE
    np.testing.assert_allclose([c.start_s for c in chunks], starts)


@pytest.fixture(scope="module")
def tiny_codec_synth(demo_config: Path, codec_tiny_dir: Path) -> Iterator[Synthesizer]:
    """The demo model speaking through codec-tiny (the real codec architecture)."""
    with Synthesizer.from_config_file(demo_config, {"model.codec_dir": str(codec_tiny_dir)}) as loaded:
        yield loaded


def test_whole_utterance_is_the_codecs_offline_decode_on_codec_tiny(
    tiny_codec_synth: Synthesizer, codec_tiny_dir: Path
) -> None:
    result = tiny_codec_synth.synthesize(TEXT, seed=1)
    one_call = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu").decode(result.codes)
    np.testing.assert_allclose(result.audio, one_call, atol=1e-6)  # float32 round-off, 1e-2 peaks
    assert result.report.codec_decode == "offline" and not result.report.codec_stalls
    streamed = tiny_codec_synth.stream(TEXT, seed=1)
    audio = np.concatenate([chunk.samples for chunk in streamed])
    assert streamed.report is not None and streamed.report.codec_decode == "windowed stream"
    np.testing.assert_array_equal(streamed.codes, result.codes)
    assert np.abs(audio - one_call).max() > 1e-3  # stitched chunks are not what the codec decodes


def streamed_audio(synth: Synthesizer, text: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A stream's audio and its codes, with the checks every stateful stream must pass on the way."""
    stream = synth.stream(text, seed=seed)
    chunks = [chunk.samples for chunk in stream]
    assert stream.report is not None and stream.report.codec_decode == "stateful stream"
    assert stream.codes is not None and len(chunks) > 2  # decoded in several chunks, not once at the end
    return np.concatenate(chunks), stream.codes


def test_the_stateful_stream_is_the_offline_decode_request_after_request(
    stateful_synth: Synthesizer, codec_tiny_dir: Path
) -> None:
    """The stream decoder carries the attention state over the chunks (equal to one offline call, where the
    windowed scheme differs by 1e-3 and more, above), and starts every request afresh, also after a cancel."""
    offline = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu")
    for text, seed in ((TEXT, 1), ("A second request, in another voice.", 2)):
        audio, codes = streamed_audio(stateful_synth, text, seed)
        np.testing.assert_allclose(audio, offline.decode(codes), rtol=0, atol=1e-6)  # float32 round-off, 1e-2 peaks
    cancel = threading.Event()
    cancelled = stateful_synth.stream(TEXT, seed=3, cancel=cancel)
    chunks = iter(cancelled)
    for _ in range(2):  # the decoder is mid-utterance when the cancel comes
        next(chunks)
    cancel.set()
    assert list(chunks) == [] and cancelled.cancelled
    audio, codes = streamed_audio(stateful_synth, TEXT, 1)
    np.testing.assert_allclose(audio, offline.decode(codes), rtol=0, atol=1e-6)


def test_beside_a_stream_decoder_whole_utterances_decode_on_it_and_decoder_onnx_is_never_loaded(
    demo_config: Path, codec_tiny_dir: Path, codec_tiny_streaming_dir: Path, tmp_path: Path
) -> None:
    """One decode graph resident: the stream decoder's output is the offline decode, so whole utterances run
    on it too. Here decoder.onnx is not a model at all, so any session on it would fail at load."""
    codec_dir = linked_copy(codec_tiny_streaming_dir, tmp_path, skip=["decoder.onnx"])
    (codec_dir / "decoder.onnx").write_bytes(b"not an ONNX model")
    offline = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu")
    with Synthesizer.from_config_file(demo_config, {"model.codec_dir": str(codec_dir)}) as synth:
        result = synth.synthesize(TEXT, seed=1)
        assert result.report.codec_decode == "offline" and result.codes.shape[0] > 1
        np.testing.assert_allclose(result.audio, offline.decode(result.codes), rtol=0, atol=1e-6)
        audio, codes = streamed_audio(synth, TEXT, 1)  # a stream after it starts from an empty state
        np.testing.assert_array_equal(codes, result.codes)
        np.testing.assert_allclose(audio, result.audio, rtol=0, atol=1e-6)


def test_off_selects_the_windowed_scheme(demo_config: Path, codec_tiny_streaming_dir: Path) -> None:
    overrides = {"model.codec_dir": str(codec_tiny_streaming_dir), "audio.stream_decoder": "off"}
    with Synthesizer.from_config_file(demo_config, overrides) as windowed:
        stream = windowed.stream(TEXT, seed=1, max_new_tokens=40)
        list(stream)
        assert windowed.stages.stream_decoding is None
        assert stream.report is not None and stream.report.codec_decode == "windowed stream"


def test_a_graph_that_is_no_stream_decoder_is_refused_at_load_naming_the_key(
    demo_config: Path, codec_tiny_dir: Path, tmp_path: Path
) -> None:
    explicit = {"model.codec_dir": str(codec_tiny_dir), "audio.stream_decoder": str(codec_tiny_dir / "decoder.onnx")}
    with pytest.raises(ConfigError, match=r"'audio\.stream_decoder' .*decoder\.onnx is not a stream decoder graph"):
        Synthesizer.from_config_file(demo_config, explicit)
    codec_dir = linked_copy(codec_tiny_dir, tmp_path)  # auto finds a decoder_stream.onnx that is something else
    (codec_dir / STREAM_DECODER_FILE).symlink_to(codec_tiny_dir / "decoder.onnx")
    with pytest.raises(
        ConfigError, match=r"'audio\.stream_decoder' auto selects .*or set 'audio\.stream_decoder' to off"
    ):
        Synthesizer.from_config_file(demo_config, {"model.codec_dir": str(codec_dir)})


def test_the_stream_clock_times_every_step(synth: Synthesizer) -> None:
    """What bench reads: one heads call per generated row, one decode between consecutive rows."""
    stream = synth.stream(TEXT, seed=1)
    list(stream)
    assert stream.clock is not None and stream.generated is not None and stream.report is not None
    steps = stream.generated.shape[0]
    assert len(stream.clock.calls["heads"]) == steps and len(stream.clock.calls["backbone"]) == steps - 1
    starts = [start for start, _ in stream.clock.calls["heads"]]
    assert starts == sorted(starts)
    total = sum(seconds for _, seconds in stream.clock.calls["backbone"])
    assert total * 1000 / steps == pytest.approx(stream.report.backbone_ms_per_step)


def test_generated_rows_de_delay_to_the_decoded_codes(synth: Synthesizer) -> None:
    result = synth.synthesize(TEXT, seed=2)
    frames = remove_delay(result.generated[:, 1:])
    frames = frames[~np.all(frames == 1024, axis=1)]
    assert np.array_equal(frames, result.codes)
    assert result.generated[-1, 0] == synth.spec.im_end_token_id
    assert result.report.frames == result.codes.shape[0]
    assert result.report.audio_seconds == pytest.approx(result.codes.shape[0] * 0.08)


def test_first_chunk_leaves_right_after_the_32nd_step(synth: Synthesizer) -> None:
    steps = 0

    def count_steps() -> bool:  # the cancel flag is read once before every step
        nonlocal steps
        steps += 1
        return False

    stream = synth.stream(TEXT, seed=1, cancel=count_steps)
    first = next(iter(stream))
    assert steps == 32
    assert first.samples.shape == (SAMPLES_PER_FRAME,)
    list(stream)  # drain


def test_cancel_stops_within_a_step(synth: Synthesizer) -> None:
    cancel = threading.Event()
    stream = synth.stream(TEXT, seed=1, cancel=cancel)
    chunks = iter(stream)
    next(chunks)
    cancel.set()
    assert list(chunks) == []
    assert stream.cancelled and stream.report is not None
    assert stream.report.steps == 32  # not one step more


def test_same_seed_same_codes_different_seed_different_codes(synth: Synthesizer) -> None:
    a = synth.synthesize(TEXT, seed=5).codes
    b = synth.synthesize(TEXT, seed=5).codes
    c = synth.synthesize(TEXT, seed=6).codes
    assert np.array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)


def test_max_new_tokens_stops_generation(synth: Synthesizer) -> None:
    result = synth.synthesize(TEXT, seed=1, max_new_tokens=40)
    assert result.report.stop_reason == "max_new_tokens"
    assert result.generated.shape[0] == 40
    assert result.codes.shape[0] == 40 - 31  # frames whose last codebook arrived


def test_a_stream_keeps_the_settings_it_was_made_with(synth: Synthesizer) -> None:
    """The node makes a stream when it accepts a request and runs it later: a config replaced in
    between (``ros2 param set``) must not reach it."""
    before = synth.config
    after = replace(
        before,
        audio=replace(before.audio, chunk_frames=before.audio.chunk_frames + 3, left_context_frames=0),
        sampling=replace(before.sampling, text_temperature=0.0, audio_temperature=0.3),
        generation=replace(before.generation, max_new_tokens=35, normalize_text=False),
    )
    reference = [c.samples for c in synth.stream(TEXT, seed=3)]  # made and run under ``before``
    queued = synth.stream(TEXT, seed=3)
    synth.reconfigure(after)
    try:
        ran = [c.samples for c in queued]
        changed = synth.stream(TEXT, seed=3)
        changed_chunks = [c.samples for c in changed]
    finally:
        synth.reconfigure(before)
    assert [c.shape for c in ran] == [c.shape for c in reference]
    np.testing.assert_array_equal(np.concatenate(ran), np.concatenate(reference))
    assert changed.report is not None and changed.report.steps == 35  # the new settings do apply to new streams
    assert [c.shape for c in changed_chunks] != [c.shape for c in reference]


def test_reconfigure_takes_per_request_keys_and_refuses_the_others(synth: Synthesizer) -> None:
    """What the model and its planner were made of cannot change under them; the voices are read again under new
    limits (they were checked against the old ones)."""
    before, voices = synth.config, synth.voices
    loaded = replace(before, audio=replace(before.audio, max_codec_seconds=before.audio.max_codec_seconds / 2))
    with pytest.raises(ConfigError, match=r"audio\.max_codec_seconds cannot change while the model is loaded"):
        synth.reconfigure(loaded)
    assert synth.config is before
    try:
        synth.reconfigure(replace(before, sampling=replace(before.sampling, seed=5)))
        assert synth.config.sampling.seed == 5 and synth.voices is voices  # the limits are the same
        synth.reconfigure(replace(before, limits=replace(before.limits, max_text_chars=100)))
        assert synth.voices is not voices and synth.voices.names == voices.names
        with pytest.raises(RequestError, match="more than the 100"):
            synth.stream("word " * 30)
    finally:
        synth.reconfigure(before)


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_is_refused(synth: Synthesizer, text: str) -> None:
    with pytest.raises(RequestError, match="empty"):
        synth.stream(text)


def test_text_that_normalizes_to_nothing_is_refused(synth: Synthesizer) -> None:
    with pytest.raises(RequestError, match="nothing to say"):
        synth.stream("\u200b\u200b")


def test_prompt_longer_than_the_context_is_refused(demo_config: Path) -> None:
    with Synthesizer.from_config_file(demo_config, {"llama.n_ctx": 256}) as small:
        with pytest.raises(RequestError, match=r"256-row context.*raise llama\.n_ctx"):
            small.stream("Hi.", instruction="word " * 300)  # a long text is split instead (test_length_safety)
        result = small.synthesize("Hi.", seed=1)  # a short one is clamped to the room left
        assert result.prompt.shape[0] + result.generated.shape[0] <= 256 + 1


def test_reference_from_clip_and_from_codes(synth: Synthesizer, tmp_path: Path) -> None:
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    clip = tmp_path / "voice.wav"
    write_wav(clip, 0.3 * np.sin(2 * np.pi * 220 * t), SAMPLE_RATE)
    codes = synth.encode_reference(clip)
    assert codes.shape == (13, 32) and codes.dtype == np.int64  # 1 s padded up to 13 frames
    np.save(tmp_path / "voice.npy", codes)
    from_clip = synth.stream(TEXT, voice=clip, seed=1)
    from_codes = synth.stream(TEXT, voice=tmp_path / "voice.npy", seed=1)
    assert np.array_equal(from_clip.prompt, from_codes.prompt)
    slots = from_clip.prompt[:, 0] == synth.spec.audio_user_slot_token_id
    assert slots.sum() == 13 + 31
    assert len(list(from_codes)) > 0


def test_bad_references_are_refused(synth: Synthesizer, tmp_path: Path) -> None:
    fake = tmp_path / "voice.wav"
    fake.write_text("not audio")
    with pytest.raises(RequestError, match=r"voice\.wav"):
        synth.stream(TEXT, voice=fake)
    with pytest.raises(RequestError, match="not found"):
        synth.stream(TEXT, voice=tmp_path / "absent.wav")
    np.save(tmp_path / "bad.npy", np.zeros((5, 8), dtype=np.int64))
    with pytest.raises(RequestError, match=r"bad\.npy: codes of 8 codebooks, but this model has 32.*encode-voice"):
        synth.stream(TEXT, voice=tmp_path / "bad.npy")
    np.save(tmp_path / "range.npy", np.full((5, 32), 1024, dtype=np.int64))
    with pytest.raises(RequestError, match=r"0\.\.1023"):
        synth.stream(TEXT, voice=tmp_path / "range.npy")


@pytest.fixture(scope="module")
def exact_synth(demo_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesizer]:
    """The demo model with F32 weights and KV cache, greedy: equal inputs give bit-equal rows."""
    with exact_synthesizer(demo_config, tmp_path_factory.mktemp("f32"), **{"generation.max_new_tokens": 48}) as loaded:
        yield loaded


def generate_exactly(synth: Synthesizer, request: dict[str, Any], fresh: bool) -> tuple[np.ndarray, int, int]:
    """A request's generated rows, prefilled rows and prompt rows (``fresh``: with nothing in the KV cache before
    it; the key ``cancel_after``: cancelled after that many chunks)."""
    if fresh:
        with synth.stages.generation() as stage:
            stage.backbone.clear()
    cancel = threading.Event()
    fields = {key: value for key, value in request.items() if key != "cancel_after"}
    stream = synth.stream(SpeechRequest(**fields, seed=3), cancel=cancel)
    for number, _ in enumerate(stream, start=1):
        if number == request.get("cancel_after"):
            cancel.set()
    assert stream.report is not None and stream.generated is not None and stream.prompt is not None
    assert stream.cancelled == ("cancel_after" in request)
    return stream.generated, stream.report.prefilled_rows, stream.prompt.shape[0]


def test_reused_prompt_prefix_generates_what_a_full_prefill_does(exact_synth: Synthesizer) -> None:
    rng = np.random.default_rng(4)
    voice_a, voice_b = (rng.integers(0, 1024, size=(frames, 32)) for frames in (12, 7))
    requests: list[dict[str, Any]] = [
        {"text": TEXT, "voice": voice_a, "language": "en"},
        {"text": "Good morning, how are you?", "voice": voice_a, "language": "en"},  # only the text differs
        {"text": "Good morning, how are you?", "voice": voice_a, "language": "zh"},
        {"text": TEXT, "voice": voice_a, "language": "zh", "instruction": "slowly"},
        {"text": TEXT, "voice": voice_b, "language": "en"},  # another voice: the ChatML header is shared
        {"text": "Stop here.", "voice": voice_b, "language": "en", "cancel_after": 1},
        {"text": "After the cancel.", "voice": voice_b, "language": "en"},
        {"text": "No voice at all.", "voice": ""},
        {"text": TEXT, "voice": voice_a, "language": "en"},  # the first request again
    ]

    # Kept are the rows before the text where they are those of the request before (voice and the fields before it).
    shares_the_voice_prefix = [False, True, False, False, False, True, True, False, False]

    reused = [generate_exactly(exact_synth, request, fresh=False) for request in requests]
    fresh = [generate_exactly(exact_synth, request, fresh=True) for request in requests]
    for number, ((rows, prefilled, prompt_rows), (expected, full, _)) in enumerate(zip(reused, fresh, strict=True)):
        assert np.array_equal(rows, expected), f"request {number} generated other rows with the prefix reused"
        assert full == prompt_rows
        if number > 0:
            assert (prefilled < full) == shares_the_voice_prefix[number], f"request {number} prefilled {prefilled}"
    # the same voice and fields: everything before the text was reused
    prefix = exact_synth.prompts.voice_prefix(PromptFields(text="", language="en"), [voice_a])
    assert reused[1][1] == reused[1][2] - prefix.shape[0]


@pytest.fixture(scope="module", params=["delay", "nano"])
def sampled_synth(request: pytest.FixtureRequest, demo_config: Path, nano_demo_config: Path) -> Iterator[Synthesizer]:
    """A demo model as a user's config runs it: F16 KV cache, flash attention as llama.cpp chooses (on, on a CPU:
    the demos turn it off), sampled."""
    config = nano_demo_config if request.param == "nano" else demo_config
    with Synthesizer.from_config_file(config, {"generation.max_new_tokens": 40, "llama.flash_attn": "auto"}) as loaded:
        yield loaded


def test_the_same_seed_gives_the_same_audio_whatever_came_before(
    sampled_synth: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interfaces promise it. Prompts of 64 rows or more and texts of fewer are where llama.cpp's kernels round a
    reused prefix differently unless it is cut alike (``Backbone.prefill_prompt``): before, the prompt's last hidden
    state moved by rounding here (a draw it changes is rarer on these tiny models), and frames changed in longer runs.
    """
    spec = sampled_synth.spec
    rng = np.random.default_rng(8)
    voice, other = (rng.integers(0, spec.audio_vocab_size, size=(frames, spec.n_vq)) for frames in (40, 30))
    hidden: list[np.ndarray] = []  # what the first step starts from, after each prefill
    prefill_prompt = Backbone.prefill_prompt

    def recorded(backbone: Backbone, *args: Any, **kwargs: Any) -> int:
        rows = prefill_prompt(backbone, *args, **kwargs)
        hidden.append(backbone.hidden().copy())
        return rows

    monkeypatch.setattr(Backbone, "prefill_prompt", recorded)

    def speak(text: str, codes: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        stream = sampled_synth.stream(SpeechRequest(text=text, voice=codes, seed=seed))
        samples = np.concatenate([chunk.samples for chunk in stream])
        assert stream.generated is not None and stream.report is not None
        return hidden[-1], stream.generated, samples, stream.report.prefilled_rows

    with sampled_synth.stages.generation() as stage:
        stage.backbone.clear()
    *expected, prefilled = speak(TEXT, voice, 3)
    for text, codes, seed in (("Good morning to you all.", voice, 4), (TEXT, other, 3), ("Once more.", voice, 5)):
        speak(text, codes, seed)
        *again, again_prefilled = speak(TEXT, voice, 3)
        assert (again_prefilled < prefilled) == (codes is voice)  # the voice prefix was reused where it could be...
        for mine, theirs in zip(again, expected, strict=True):
            assert np.array_equal(mine, theirs)  # ...and gave the same bits


def test_prepared_voice_leaves_only_the_text_to_prefill(exact_synth: Synthesizer) -> None:
    voice = np.random.default_rng(5).integers(0, 1024, size=(9, 32))
    with exact_synth.stages.generation() as stage:
        stage.backbone.clear()
    prepared = exact_synth.prepare_voice(voice=voice, language="en")
    assert prepared > 9 + 31  # the clip's rows and the fields before the text
    assert exact_synth.prepare_voice(voice=voice, language="en") == 0
    stream = exact_synth.stream(TEXT, voice=voice, language="en", seed=1)
    list(stream)
    assert stream.report is not None
    assert stream.report.prefilled_rows == stream.prompt.shape[0] - prepared


@pytest.mark.parametrize(
    ("target", "content", "message"),
    [
        ("embeddings/emb_ext_05.npy", None, r"weight file not found: .*emb_ext_05\.npy"),
        ("lm_heads/lm_head_audio_31.npy", b"garbage", r"lm_head_audio_31\.npy: not a readable \.npy"),
        ("embeddings/emb_ext_00.npy", np.zeros((1025, 8), dtype=np.float16), r"emb_ext_00\.npy: shape \(1025, 8\)"),
        ("lm_heads/lm_head_audio_03.npy", np.zeros((1025, 256), dtype=np.float32), r"dtype float32, expected float16"),
        ("MOSS_TTS_F16.gguf", b"GGUF but truncated", r"MOSS_TTS_F16\.gguf"),
        ("tokenizer/tokenizer.json", None, r"tokenizer not found"),
    ],
)
def test_broken_weight_files_are_named(
    demo_config: Path, tmp_path: Path, target: str, content: bytes | np.ndarray | None, message: str
) -> None:
    config = linked_copy(demo_config.parent, tmp_path, skip=[target]) / "config.yaml"
    if isinstance(content, bytes):
        (tmp_path / target).write_bytes(content)
    elif isinstance(content, np.ndarray):
        np.save(tmp_path / target, content)
    with pytest.raises(WeightsError, match=message):
        Synthesizer.from_config_file(config)


@pytest.mark.parametrize(
    ("decode", "streamed", "codec_s", "warned"),
    [("windowed stream", True, 1.5, True), ("windowed stream", True, 0.5, False), ("offline", False, 1.5, False)],
)
def test_timing_report_warns_when_the_codec_cannot_keep_up_with_a_stream(
    decode: str, streamed: bool, codec_s: float, warned: bool
) -> None:
    clock = StageClock()
    clock.seconds["codec"] = codec_s
    report = TimingReport.from_clock(
        clock,
        model="MOSS-TTS 1.5",
        weights="CPU_REPACK 1.0 MiB (...)",
        seed=0,
        prompt_rows=1,
        max_new_tokens=1,
        steps=1,
        frames=12,
        audio_seconds=0.96,
        codec_decode=decode,
        streamed=streamed,
        stop_reason="end",
    )
    assert report.codec_rtf == pytest.approx(codec_s / 0.96)
    assert report.codec_stalls is warned
    assert f"({decode}, real-time factor {codec_s / 0.96:.2f})" in report.format()
    assert ("warning" in report.format()) is warned


def test_a_continuation_reuses_what_comes_before_its_text_and_generates_what_a_full_prefill_does(
    exact_synth: Synthesizer,
) -> None:
    """docs/continuation.md, "What is reused": the prefix's rows follow the text, the fields and voices precede it."""
    rng = np.random.default_rng(6)
    voice, prefix = rng.integers(0, 1024, size=(8, 32)), rng.integers(0, 1024, size=(10, 32))
    said = {"voice": voice, "language": "en", "prefix": prefix, "prefix_text": "Good evening, sir."}
    requests: list[dict[str, Any]] = [
        {"text": TEXT, "voice": voice, "language": "en"},
        {"text": TEXT, **said},  # the rows before the text are the first request's
        {"text": "Another text.", **said},  # only those: the transcript's rows follow the cut
        {"text": "Another text.", **said},  # all of it but the last row
    ]

    reused = [generate_exactly(exact_synth, request, fresh=False) for request in requests]
    fresh = [generate_exactly(exact_synth, request, fresh=True) for request in requests]
    for number, ((rows, _, _), (expected, full, prompt_rows)) in enumerate(zip(reused, fresh, strict=True)):
        assert np.array_equal(rows, expected), f"request {number} generated other rows with the prefix reused"
        assert full == prompt_rows
    before_text = exact_synth.prompts.voice_prefix(PromptFields(text="", language="en"), [voice]).shape[0]
    (_, second, second_rows), (_, third, third_rows), (_, fourth, _) = reused[1:]
    assert second == second_rows - before_text
    assert third == third_rows - before_text
    assert fourth == 1
