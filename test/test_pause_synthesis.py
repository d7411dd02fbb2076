"""What a pause marker means in a request (generation.pause_markers), planned and spoken end to end on the demo model:
silence exactly as long as asked, in chunks like speech, the same in the stream as in the whole utterance."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import linked_copy

from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.config import Config
from moss_tts_node.errors import RequestError
from moss_tts_node.model.identity import RECORD_KEY, V1_5
from moss_tts_node.model.layout import CONFIG_FILE
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.pieces import FRAMES_PER_TEXT_TOKEN, Pause, Piece, PiecePlanner
from moss_tts_node.text.prompt import PromptFields

POEM = "它的名字是[pause 0.5s]静夜思！"  # upstream's example, with a shorter pause
HALF_SECOND = SAMPLE_RATE // 2


def with_pauses(config: Config, mode: str) -> Config:
    return replace(config, generation=replace(config.generation, pause_markers=mode))


def test_silence_takes_markers_out_and_plans_exact_pauses_between_the_speech(synth: Synthesizer) -> None:
    prompts, planner = synth.prompts, synth.planner
    plan = planner.plan(
        PromptFields(text="[pause 1s] Hi. [pause 0.25s][pause 0.25s] Bye. [pause 0s]"), [], 100, "silence"
    )
    assert [type(item) for item in plan] == [Pause, Piece, Pause, Piece]
    assert [item.samples for item in plan if isinstance(item, Pause)] == [SAMPLE_RATE, HALF_SECOND]
    speech = [item for item in plan if isinstance(item, Piece)]
    for piece, text in zip(speech, ("Hi.", "Bye."), strict=True):
        np.testing.assert_array_equal(piece.prompt, prompts.build(PromptFields(text=text)))
    # a target duration is shared by the speech in proportion to its tokens; the pauses come on top
    timed = planner.plan(PromptFields(text="Hi there. [pause 1s] Bye.", tokens=60), [], 100, "silence")
    shares = [planner.count_tokens(t) for t in ("Hi there.", "Bye.")]
    tokens = [round(60 * s / sum(shares)) for s in shares]
    expected = [
        prompts.build(PromptFields(text=t, tokens=n)) for t, n in zip(("Hi there.", "Bye."), tokens, strict=True)
    ]
    for piece, prompt in zip([item for item in timed if isinstance(item, Piece)], expected, strict=True):
        np.testing.assert_array_equal(piece.prompt, prompt)


def test_model_and_text_leave_markers_in_the_prompt_and_model_plans_their_frames(synth: Synthesizer) -> None:
    fields = PromptFields(text="Hi [pause 3s] there")
    for mode in ("model", "text"):
        (piece,) = synth.planner.plan(fields, [], 100, mode)
        assert isinstance(piece, Piece)
        np.testing.assert_array_equal(piece.prompt, synth.prompts.build(fields))
    # A codec window that just holds the text's tokens at 4 frames a token: as text they fit; the model must also
    # make 3 s of pause (38 frames), which does not fit with the words, so the text is cut around the marker.
    tokens = synth.planner.count_tokens(fields.text)
    narrow = PiecePlanner(synth.prompts, synth.spec, synth.n_ctx, tokens * FRAMES_PER_TEXT_TOKEN / FRAMES_PER_SECOND)
    assert len(narrow.plan(fields, [], 100, "text")) == 1
    texts = [synth.prompts.tokenizer.decode(p.prompt[:, 0].tolist()) for p in narrow.plan(fields, [], 100, "model")]
    assert [text.split("- Text:\n")[1].split("\n</user_inst>")[0] for text in texts] == ["Hi", "[pause 3s]", "there"]


def test_markers_that_cannot_be_rendered_are_refused_before_any_work(synth: Synthesizer) -> None:
    config = with_pauses(synth.config, "silence")
    with pytest.raises(RequestError, match="only pause markers: give at least one word"):
        synth.stream("[pause 1s] [pause 2s]", config=config)
    for mode in ("silence", "model"):
        with pytest.raises(RequestError, match=r"'\[pause 90s\]' asks for more than 60 s"):
            synth.stream("Wait [pause 90s] go.", config=with_pauses(synth.config, mode))
    synth.stream("Wait [pause 90s] go.", config=with_pauses(synth.config, "text"))  # text is text


def test_a_rendered_pause_streams_in_chunks_and_equals_the_whole_utterance(
    stateful_synth: Synthesizer, codec_tiny_dir: Path
) -> None:
    synth = stateful_synth
    assert (
        synth.spec.identity.release is None and synth.config.generation.pause_markers == "auto"
    )  # auto: silence, here
    stream = synth.stream(POEM, seed=1)
    chunks = list(stream)
    assert stream.report is not None and stream.report.codec_decode == "stateful stream"
    whole = synth.synthesize(POEM, seed=1)
    audio = np.concatenate([chunk.samples for chunk in chunks])
    np.testing.assert_allclose(audio, whole.audio, rtol=0, atol=1e-6)  # float32 round-off, 1e-2 peaks
    # independently: each piece is the request of its own text (piece n gets seed + n), the pause exact zeros
    before, after = synth.synthesize("它的名字是", seed=1), synth.synthesize("静夜思！", seed=2)
    np.testing.assert_array_equal(whole.codes, np.concatenate([before.codes, after.codes]))
    offline = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu")
    expected = np.concatenate([offline.decode(before.codes), np.zeros(HALF_SECOND), offline.decode(after.codes)])
    np.testing.assert_allclose(audio, expected, rtol=0, atol=1e-6)
    # the silence arrives in chunks of chunk_frames frames, the rest last, each in its place in the stream
    step = synth.config.audio.chunk_frames * SAMPLES_PER_FRAME
    starts = np.cumsum([0] + [c.samples.shape[0] for c in chunks[:-1]])
    silent = [
        c
        for c, start in zip(chunks, starts, strict=True)
        if before.audio.shape[0] <= start < len(before.audio) + HALF_SECOND
    ]
    assert [c.samples.shape[0] for c in silent] == [step] * (HALF_SECOND // step) + [HALF_SECOND % step]
    assert all(not c.samples.any() and not c.is_final for c in silent)
    assert [c.index for c in chunks] == list(range(len(chunks))) and chunks[-1].is_final
    assert whole.report.audio_seconds == pytest.approx(audio.shape[0] / SAMPLE_RATE)


def test_a_pause_may_open_or_close_the_utterance(synth: Synthesizer) -> None:
    opening = list(synth.stream("[pause 0.5s] Hello.", seed=1))
    assert not opening[0].samples.any() and opening[0].start_s == 0.0
    closing = list(synth.stream("Hello. [pause 0.5s]", seed=1))
    tail = np.concatenate([c.samples for c in closing])[-HALF_SECOND:]
    assert not tail.any() and closing[-1].is_final and not closing[-1].samples.any()
    assert [c.is_final for c in closing] == [False] * (len(closing) - 1) + [True]


def test_a_cancel_during_a_pause_stops_the_stream(synth: Synthesizer) -> None:
    cancel = threading.Event()
    stream = synth.stream("[pause 2s] Hello there.", seed=1, cancel=cancel)
    chunks = iter(stream)
    first = next(chunks)
    assert not first.samples.any()
    cancel.set()
    assert list(chunks) == []
    assert stream.cancelled and stream.report is not None and stream.report.steps == 0


def test_auto_passes_markers_to_a_checkpoint_converted_from_v1_5(demo_config: Path, tmp_path: Path) -> None:
    weights = demo_config.parent
    v15 = linked_copy(weights, tmp_path / "v15", skip=[CONFIG_FILE])
    recorded = {**json.loads((weights / CONFIG_FILE).read_text()), RECORD_KEY: {"release": V1_5, "evidence": "test"}}
    (v15 / CONFIG_FILE).write_text(json.dumps(recorded))
    with Synthesizer.from_config_file(demo_config, {"model.weights_dir": str(v15)}) as synth:
        assert synth.spec.identity.release == V1_5
        stream = synth.stream(POEM, seed=1)  # auto: the model makes the pause
        np.testing.assert_array_equal(stream.prompt, synth.prompts.build(PromptFields(text=POEM)))
        silenced = synth.stream(POEM, config=with_pauses(synth.config, "silence"))  # unless told otherwise
        np.testing.assert_array_equal(silenced.prompt, synth.prompts.build(PromptFields(text="它的名字是")))
