"""Text that arrives in fragments, spoken as one stream (``Synthesizer.stream_text``) on the demo model:
real llama.cpp and ONNX Runtime; threads checked by the order of events, never by timing."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, replace

import numpy as np
import pytest

from moss_tts_node.config import resolved_sampling
from moss_tts_node.errors import RequestError
from moss_tts_node.model.rates import SAMPLE_RATE
from moss_tts_node.model.sampling import SamplingParams
from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.pipeline import PlanSource
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesis.results import AudioChunk, AudioStream
from moss_tts_node.synthesis.text_stream import CutPieces
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.cutter import TextCutter
from moss_tts_node.text.pieces import Piece
from moss_tts_node.text.prompt import PromptFields

TEXT = "Hello there. I am a robot! 你好。How are you today?"
STEPS = 40  # per piece: short pieces keep the tests fast (each stops at max_new_tokens)
WAIT_S = 120  # a test that would wait longer has deadlocked: it fails instead of hanging


def words(text: str) -> list[str]:
    """``text`` as an LLM streams it: a word with the spaces before it per fragment, a CJK character each."""
    fragments = re.findall(r"\s*[^\s\u3000-\u9fff]+|\s*[\u3000-\u9fff]|\s+$", text)
    assert "".join(fragments) == text
    return fragments


def prompt_rows(synth: Synthesizer, *texts: str, language: str | None = None) -> int:
    """The prompt rows of pieces of these texts: what a stream's report counts for the pieces it ran."""
    return sum(synth.prompts.build(PromptFields(text=text, language=language)).shape[0] for text in texts)


def drain(stream: AudioStream) -> list[AudioChunk]:
    chunks = list(stream)
    assert stream.report is not None
    assert [chunk.index for chunk in chunks] == list(range(len(chunks)))
    assert [chunk.is_final for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    return chunks


def test_the_same_text_and_seed_give_the_same_audio_however_it_arrives(synth: Synthesizer) -> None:
    whole = synth.stream_text([TEXT], seed=4, max_new_tokens=STEPS)
    whole_audio = np.concatenate([chunk.samples for chunk in drain(whole)])
    feed = TextFeed()
    trickled = synth.stream_text(feed, seed=4, max_new_tokens=STEPS)

    def produce() -> None:  # from another thread, one word at a time, while the first pieces are spoken
        try:
            for fragment in words(TEXT):
                feed.put(fragment)
        finally:
            feed.close()

    threading.Thread(target=produce).start()
    trickled_audio = np.concatenate([chunk.samples for chunk in drain(trickled)])
    np.testing.assert_array_equal(trickled_audio, whole_audio)
    np.testing.assert_array_equal(trickled.codes, whole.codes)
    assert whole.report is not None and trickled.report is not None
    assert whole.report.prompt_rows == trickled.report.prompt_rows
    other = synth.stream_text([TEXT], seed=5, max_new_tokens=STEPS)
    list(other)
    assert not np.array_equal(other.codes, whole.codes)


def test_each_piece_prefills_only_its_text(synth: Synthesizer) -> None:
    """The first sentence alone, then the others packed (PACK_TOKENS: 25 tokens here): the voice's rows are
    prefilled once, the later piece only its text."""
    with synth.stages.generation() as stage:
        stage.backbone.clear()
    stream = synth.stream_text(words(TEXT), language="en", seed=1, max_new_tokens=STEPS)
    drain(stream)
    assert stream.report is not None
    sentences = ("Hello there.", "I am a robot! 你好。How are you today?")
    assert stream.report.prompt_rows == prompt_rows(synth, *sentences, language="en")
    prefix = synth.prompts.voice_prefix(PromptFields(text="", language="en"), []).shape[0]
    assert stream.report.prefilled_rows == stream.report.prompt_rows - prefix
    np.testing.assert_array_equal(stream.prompt, synth.prompts.build(PromptFields(text=sentences[0], language="en")))


def test_a_sentence_is_spoken_while_the_next_is_still_being_written(synth: Synthesizer) -> None:
    """The producer holds the rest of the text back until the first audio has come: a stream that waited
    for the whole text would never speak (and the test would fail on the timeout, not hang)."""
    first_audio = threading.Event()
    produced: list[str] = []

    def llm() -> Iterator[str]:
        yield from words("The first sentence is here. And so")
        produced.append("first")
        if not first_audio.wait(WAIT_S):
            raise TimeoutError("no audio came before the rest of the text")
        produced.append("rest")
        yield from words(" it goes on.")

    stream = synth.stream_text(llm(), seed=2, max_new_tokens=STEPS)
    chunks = iter(stream)
    next(chunks)
    assert produced == ["first"]
    first_audio.set()
    rest = list(chunks)
    assert produced == ["first", "rest"] and rest[-1].is_final
    assert stream.report is not None
    assert stream.report.prompt_rows == prompt_rows(synth, "The first sentence is here.", "And so it goes on.")


class _CancelledWhileWaiting(TextFeed):
    """A feed that sets the cancel the moment the synthesis waits on it for text that has not come.

    Set from a thread of the test's own, the cancel could come after the input's pause ran out and the synthesis
    spoke the unfinished sentence (seen under load); set here, under a pause longer than the test, it comes while
    the synthesis waits, whatever the machine's speed.
    """

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__()
        self.cancel = cancel

    def take(self, timeout: float) -> tuple[str, bool]:
        text, ended = super().take(timeout)
        if timeout > 0 and not text and not ended:
            self.cancel.set()
        return text, ended


def test_a_cancel_while_waiting_for_text_ends_the_stream_and_abandons_the_feed(synth: Synthesizer) -> None:
    cancel = threading.Event()
    feed = _CancelledWhileWaiting(cancel)
    feed.put("One sentence. Then a second that never ends")
    stream = synth.stream_text(feed, seed=1, max_new_tokens=STEPS, cancel=cancel, input_pause_s=WAIT_S)
    chunks = list(stream)
    assert stream.cancelled and stream.report is not None
    assert stream.report.prompt_rows == prompt_rows(synth, "One sentence.")  # the second never began
    assert chunks and not any(chunk.is_final for chunk in chunks)
    assert feed.abandoned
    feed.put(" more")  # ignored, not an error: the stream is over


def test_a_cancel_mid_sentence_stops_within_a_step(synth: Synthesizer) -> None:
    cancel = threading.Event()
    stream = synth.stream_text(["Hello there. I am here."], seed=1, cancel=cancel)
    chunks = iter(stream)
    next(chunks)
    cancel.set()
    assert list(chunks) == []
    assert stream.cancelled and stream.report is not None and stream.report.steps == 32


def test_a_pause_marker_in_streamed_text_is_exact_silence_between_its_sentences(synth: Synthesizer) -> None:
    config = replace(synth.config, generation=replace(synth.config.generation, pause_markers="silence"))
    stream = synth.stream_text(words("Hi there. [pause 0.5s] Bye now."), config=config, seed=1, max_new_tokens=STEPS)
    chunks = drain(stream)
    silent = [chunk for chunk in chunks if chunk.samples.size and not chunk.samples.any()]
    assert sum(chunk.samples.size for chunk in silent) == SAMPLE_RATE // 2
    assert silent[0].index > 0 and silent[-1].index < chunks[-1].index  # between the two sentences' audio
    assert stream.report is not None and stream.report.prompt_rows == prompt_rows(synth, "Hi there.", "Bye now.")


def test_nothing_speakable_gives_an_empty_final_chunk(synth: Synthesizer) -> None:
    stream = synth.stream_text(["  ", "\n", "**", "[pause 1s]"], seed=1)
    chunks = drain(stream)
    assert len(chunks) == 1 and chunks[0].samples.shape == (0,)
    assert stream.report is not None and stream.report.steps == 0 and stream.report.stop_reason == "end"


def test_bad_requests_are_refused_at_once_and_bad_fragments_where_they_come(synth: Synthesizer) -> None:
    with pytest.raises(RequestError, match="leave the request's text empty"):
        synth.stream_text([TEXT], SpeechRequest("hello"))
    with pytest.raises(RequestError, match="duration"):
        synth.stream_text([TEXT], tokens=50)
    with pytest.raises(RequestError, match="not found"):
        synth.stream_text([TEXT], voice="/nonexistent/voice.wav")
    with pytest.raises(RequestError, match="input_pause_s"):
        synth.stream_text([TEXT], input_pause_s=0)
    with pytest.raises(RequestError, match="must be a str, not int"):
        TextFeed().put(3)  # type: ignore[arg-type]
    stream = synth.stream_text(["Hello there. ", 3], seed=1, max_new_tokens=STEPS)  # type: ignore[list-item]
    with pytest.raises(RequestError, match="must be a str, not int"):
        list(stream)

    def failing() -> Iterator[str]:
        yield "Hello there. "
        raise OSError("the LLM's connection dropped")

    with pytest.raises(OSError, match="connection dropped"):
        list(synth.stream_text(failing(), seed=1, max_new_tokens=STEPS))
    feed = TextFeed()
    feed.close()
    with pytest.raises(RequestError, match="closed"):
        feed.put("late")


def test_a_pause_in_the_input_closes_the_piece_at_its_last_word(synth: Synthesizer) -> None:
    """A pause cut is the one thing timing decides: here the producer waits until the synthesis has waited
    a whole (short) pause, then sends the rest."""
    feed = TextFeed()
    stream = synth.stream_text(feed, seed=1, max_new_tokens=STEPS, input_pause_s=0.01)
    feed.put("I think that the ans")
    chunks = iter(stream)
    first = next(chunks)  # the pause cut "I think that the" and it is being spoken
    assert first.index == 0
    feed.put("wer is here.")
    feed.close()
    list(chunks)
    assert stream.report is not None
    assert stream.report.prompt_rows == prompt_rows(synth, "I think that the", "answer is here.")


class _ArrivingFeed(TextFeed):
    """A feed whose producer puts its next fragment just as the synthesis finds the input silent for a whole
    pause: right after that take, before anything the synthesis reads next."""

    def __init__(self, late: str) -> None:
        super().__init__()
        self.late = [late]

    def take(self, timeout: float) -> tuple[str, bool]:
        text, ended = super().take(timeout)
        if timeout == 0 and not text and not ended and self.late:  # a pause is being cut
            self.put(self.late.pop())
        return text, ended


def test_a_fragment_that_arrives_as_a_pause_is_cut_has_a_pause_of_its_own() -> None:
    """The pause cut is marked with the fragment count read with the silence it ends: a count read after the
    take took in the late fragment too, and the silence after that fragment never closed its piece."""
    feed = _ArrivingFeed("wer is here")
    feed.put("I think that the ans")
    deadline = time.monotonic() + WAIT_S
    pieces = CutPieces(
        feed, TextCutter(str, max_run=1000), lambda text: [text], lambda: time.monotonic() > deadline, 0.01
    )
    assert pieces.next_item() == "I think that the"
    assert pieces.next_item() == "answer is"  # closed at its last word by the pause after "wer is here"


class _Source(PlanSource):
    """Two pieces; whether the second is the last only becomes known after the first was spoken."""

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self.events: list[str] = []

    def next_item(self) -> Piece | None:
        self.events.append("next")
        return self.pieces.pop(0) if self.pieces else None

    def more(self) -> bool | None:
        self.events.append("more")
        return None

    def close(self) -> None:
        self.events.append("close")


def test_the_pipeline_sends_a_pieces_last_samples_at_once_and_an_empty_final_chunk_when_the_end_is_known(
    synth: Synthesizer,
) -> None:
    planned = synth.planner.plan(PromptFields(text="Hello there."), [], STEPS)
    source = _Source([*planned, *planned])
    in_effect = resolved_sampling(synth.spec.identity.sampling, synth.config.sampling)  # -1: the model's
    sampling = SamplingParams(**{**asdict(in_effect), "seed": 1})
    stream = AudioStream(None, synth.pipeline.run(source, sampling, synth.config.audio, lambda: False, True))
    chunks = drain(stream)
    assert chunks[-1].samples.shape == (0,) and chunks[-2].samples.shape[0] > 0
    assert source.events == ["next", "more", "next", "more", "next", "close"]
    assert stream.prompt is not None and np.array_equal(stream.prompt, planned[0].prompt)
