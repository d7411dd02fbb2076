"""The pipeline: a request's planned pieces become one stream of ``AudioChunk``s (docs/design.md, "Data flow").

Each piece is generated row by row (``model/generation.py``), its rows become frames as the delay pattern
completes them (``FrameAssembler``), and frames become samples through one ``SegmentDecoding`` for the whole
request. A ``Pause`` between pieces (a pause marker rendered as silence, ``text/pieces.py``) becomes silence in
chunks of ``audio.chunk_frames`` frames, like speech; the segments around it are decoded on their own either way, so
the stream and the whole utterance carry the same silence. Every generator here hands its end marker back as its
return value: ``_frames`` returns what the piece generated (``Generated``), ``run`` the ``StreamResult``.

The plan comes from a ``PlanSource``: a list planned from a whole text, or pieces cut while their text still
arrives (``synthesis/text_stream.py``), which the pipeline takes one at a time, when it is ready for the next.

A piece that continues a recording (its prompt ends inside that recording's audio: docs/continuation.md) starts its
frames with the recording's: those its prompt completes, then those whose last codebooks the model generates in
its first steps. They are the decoder's left context, never emitted nor counted; the piece's audio starts at its
first new frame.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeVar

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.streaming import (
    OfflineDecoding,
    SegmentDecoder,
    SegmentDecoding,
    WindowedStreamDecoding,
)
from moss_tts_node.config import AudioConfig
from moss_tts_node.model.delay import DelayState, FrameAssembler
from moss_tts_node.model.generation import generate_rows
from moss_tts_node.model.nano import NanoSampler, generate_nano_frames
from moss_tts_node.model.sampling import Sampler, SamplingParams
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesis.decodes import AheadDecodes, Decodes, InlineDecodes
from moss_tts_node.synthesis.results import AudioChunk, StreamResult
from moss_tts_node.synthesis.stages import GenerationStage, NanoGenerationStage, Stages
from moss_tts_node.text.pieces import Pause, Piece
from moss_tts_node.timing import StageClock, StopReason, TimingReport

# A piece's frames as they complete: (n_vq,) codes, or None for a gap (an all-pad frame, which ends an
# audio segment), the frames of a recording it continues first; the generator's return value is what the piece
# generated.
Frames = Generator[np.ndarray | None, None, "Generated"]
# How a request's pieces get their frames: a piece and its number in the request (its seed derives from it).
FramesOf = Callable[["Piece", int], Frames]
_Item = TypeVar("_Item")
_End = TypeVar("_End")


class PlanSource(ABC):
    """A request's plan in order (pieces to speak, pauses to render), handed out one item at a time."""

    @abstractmethod
    def next_item(self) -> Piece | Pause | None:
        """The next item, waiting for it if need be; None after the last one (or once cancelled)."""

    @abstractmethod
    def more(self) -> bool | None:
        """Whether another item follows, where that is known without waiting; None where it is not yet."""

    @abstractmethod
    def close(self) -> None:
        """The request has ended (finished, cancelled, failed or dropped): no item will be asked for."""

    def spoken(self, piece: Piece, generated: Generated) -> None:  # noqa: B027 (most plans need not know)
        """``piece``, an item this source gave, has been generated: what it generated, which a plan whose next
        piece continues it needs (a dialogue's: ``synthesis/dialogue.py``). Told before the next item is asked for."""


class ListedPlan(PlanSource):
    """A plan known in advance (a whole text's)."""

    def __init__(self, plan: Sequence[Piece | Pause]) -> None:
        self._plan = list(plan)
        self._next = 0

    def next_item(self) -> Piece | Pause | None:
        if self._next == len(self._plan):
            return None
        self._next += 1
        return self._plan[self._next - 1]

    def more(self) -> bool:
        return self._next < len(self._plan)

    def close(self) -> None:
        pass  # nothing waits on a list


class _FrameBudget:
    """The frames a request may still produce (None: no bound), spent as its pieces generate them and its pauses
    take them, in the order of the request.

    A piece of s steps completes at most ``spec.frames_after(s)`` frames (the first after
    ``spec.first_frame_steps``), so giving it the steps of the frames left (``spec.delayed_rows(left)``) keeps the
    request within the budget, however its pieces end; a pause is cut to the frames left.
    """

    def __init__(self, frames: int | None, spec: ModelSpec) -> None:
        self.left = frames
        self.spec = spec
        self.cut = False  # the request was cut short: a pause, or the items after the last

    @property
    def spent(self) -> bool:
        return self.left is not None and self.left <= 0

    def steps(self, piece: Piece) -> int:
        return piece.max_steps if self.left is None else min(piece.max_steps, self.spec.delayed_rows(self.left))

    def spend(self) -> None:
        """One frame completed."""
        if self.left is not None:
            self.left -= 1

    def pause(self, pause: Pause) -> Pause:
        """``pause``, cut to the frames left, which it takes."""
        if self.left is None:
            return pause
        per_frame = self.spec.samples_per_frame
        samples = min(pause.samples, self.left * per_frame)
        self.left -= -(-samples // per_frame)
        self.cut = self.cut or samples < pause.samples
        return Pause(samples)


class _BudgetedPlan(PlanSource):
    """``source`` within ``budget``: its pauses cut to the frames left, and no item once they are spent."""

    def __init__(self, source: PlanSource, budget: _FrameBudget) -> None:
        self._source = source
        self._budget = budget

    def next_item(self) -> Piece | Pause | None:
        if self._budget.spent:
            self._leave_out()
            return None
        item = self._source.next_item()
        return self._budget.pause(item) if isinstance(item, Pause) else item

    def more(self) -> bool | None:
        if self._budget.spent:
            self._leave_out()
            return False
        return self._source.more()  # asked only when the pipeline asks: a source may count its questions

    def _leave_out(self) -> None:
        """The budget is spent: the request was cut short if the source had anything more."""
        self._budget.cut = self._budget.cut or self._source.more() is not False

    def close(self) -> None:
        self._source.close()

    def spoken(self, piece: Piece, generated: Generated) -> None:
        self._source.spoken(piece, generated)


@dataclass(frozen=True)
class Generated:
    """What generating one piece produced: its rows, why it stopped, and its new frames (those after a recording it
    continues, gaps left out)."""

    rows: np.ndarray  # (N, 1 + n_vq)
    stop: StopReason
    frames: np.ndarray  # (F, n_vq)


@dataclass
class _Spoken:
    """What a request's items produced so far, in order."""

    done: list[tuple[Piece | Pause, Generated]] = field(default_factory=list)
    cancelled: bool = False

    @property
    def codes(self) -> list[np.ndarray]:
        """Each piece's new frames (a pause has none)."""
        return [generated.frames for item, generated in self.done if isinstance(item, Piece)]

    @property
    def pieces(self) -> int:
        return sum(isinstance(item, Piece) for item, _ in self.done)


class _ChunkMaker:
    """Numbers a request's chunks and keeps their offsets, across its pieces."""

    def __init__(self, sample_rate: int, clock: StageClock) -> None:
        self.sample_rate = sample_rate
        self.clock = clock
        self.samples = 0  # emitted so far
        self.index = 0

    def chunk(self, samples: np.ndarray, ended: StopReason | None = None) -> AudioChunk:
        """The next chunk; ``ended``, why the utterance ended, makes it the final one."""
        out = AudioChunk(samples, self.sample_rate, self.index, self.samples / self.sample_rate, ended)
        self.samples += samples.shape[0]
        self.index += 1
        self.clock.mark_first_audio()
        return out


class Pipeline:
    """Runs requests on ``stages``; streams decode with the stages' ``stream_decoding`` when they have one, else
    re-decode windows."""

    def __init__(self, spec: ModelSpec, stages: Stages) -> None:
        self.spec = spec
        self.stages = stages

    def run(
        self,
        plan: Sequence[Piece | Pause] | PlanSource,
        sampling: SamplingParams,
        audio: AudioConfig,
        cancelled: Callable[[], bool],
        streaming: bool,
        max_frames: int | None = None,
    ) -> Generator[AudioChunk, None, StreamResult]:
        """Generate and decode every piece, and render every pause, as one stream: indices and offsets run on,
        one final chunk.

        An item's last samples are the final chunk when no item is known to follow; where that is not known
        yet (text still arriving), they leave at once and the final chunk is an empty one, sent once the source
        has no more items. ``max_frames`` bounds the frames of the whole request: the piece or pause that
        reaches it stops there (stop reason max_new_tokens) and is the last. With stages that cannot decode
        while generating (low_memory), every piece is generated first and each decoded offline afterwards:
        nothing streams.
        """
        budget = _FrameBudget(max_frames, self.spec)
        source: PlanSource = _BudgetedPlan(plan if isinstance(plan, PlanSource) else ListedPlan(plan), budget)
        clock = StageClock()
        out = _ChunkMaker(self.spec.sampling_rate, clock)
        spoken = _Spoken()
        with ExitStack() as stack:
            stack.callback(source.close)
            source, frames_of = self._generation(stack, source, budget, sampling, cancelled, clock)
            codec = stack.enter_context(self.stages.decoder())
            decoding = stack.enter_context(self._decoding(codec, audio, streaming and self.stages.streams))
            # Entered after the decoding, so left first: no call still runs when its state is reset.
            decodes = self._decodes(stack, decoding, audio, clock)
            yield from self._speak(
                source, frames_of, decoding, decodes, audio.chunk_frames, out, cancelled, spoken, budget
            )
        return self._result(spoken, budget, decoding, sampling, out)

    def _generation(
        self,
        stack: ExitStack,
        source: PlanSource,
        budget: _FrameBudget,
        sampling: SamplingParams,
        cancelled: Callable[[], bool],
        clock: StageClock,
    ) -> tuple[PlanSource, FramesOf]:
        """The plan to speak and how a piece's frames come: generated as they are decoded, on the generation
        stage held for the request (entered on ``stack``); or, where the stages cannot decode while generating,
        every piece generated first and its frames replayed."""
        if not self.stages.streams:
            return self._generated_first(source, budget, sampling, cancelled, clock)
        stage = stack.enter_context(self.stages.generation())
        return source, lambda piece, number: self._frames(
            stage, piece, budget, _seeded(sampling, number), cancelled, clock
        )

    @staticmethod
    def _decodes(stack: ExitStack, decoding: SegmentDecoding, audio: AudioConfig, clock: StageClock) -> Decodes:
        """Where the codec calls run: ahead, on a thread of their own, when the audio streams and the owner left
        ``audio.decode_ahead`` on; else between the steps. An offline decode has nothing to overlap."""
        if decoding.streams and audio.decode_ahead:
            return stack.enter_context(AheadDecodes(clock, audio.chunk_frames))
        return InlineDecodes(clock)

    def _speak(
        self,
        source: PlanSource,
        frames_of: FramesOf,
        decoding: SegmentDecoding,
        decodes: Decodes,
        chunk_frames: int,
        out: _ChunkMaker,
        cancelled: Callable[[], bool],
        spoken: _Spoken,
        budget: _FrameBudget,
    ) -> Generator[AudioChunk, None, None]:
        """Every item of ``source`` as chunks, in order, recorded in ``spoken``; one final chunk, with why the
        request ended, unless it was cancelled."""
        final_sent = False
        while (item := source.next_item()) is not None:
            if isinstance(item, Pause):
                final_sent = source.more() is False
                ended = _ended(spoken, budget) if final_sent else None
                generated = yield from self._silence(item, chunk_frames, out, ended, cancelled)
                spoken.done.append((item, generated))
            else:
                decoder = SegmentDecoder(decoding, chunk_frames)
                frames = frames_of(item, spoken.pieces)
                generated = yield from self._decoded(frames, item.prefix_frames, decoder, decodes, out)
                spoken.done.append((item, generated))
                source.spoken(item, generated)
                if generated.stop is not StopReason.CANCELLED:
                    earlier, rest = decodes.finish(decoder.end_segment)
                    for samples in earlier:  # out before waiting for the source, which may wait for text
                        yield out.chunk(samples)
                    final_sent = source.more() is False
                    if final_sent or rest is not None:
                        ended = _ended(spoken, budget) if final_sent else None
                        yield out.chunk(rest if rest is not None else self.spec.silence(0), ended)
            if generated.stop is StopReason.CANCELLED:
                break
        # A source also ends when the request is cancelled while it waits for text.
        stopped = any(result.stop is StopReason.CANCELLED for _, result in spoken.done)
        spoken.cancelled = stopped or (not final_sent and cancelled())
        if not spoken.cancelled and not final_sent:
            # the end became known after the last samples left
            yield out.chunk(self.spec.silence(0), _ended(spoken, budget))

    def _result(
        self,
        spoken: _Spoken,
        budget: _FrameBudget,
        decoding: SegmentDecoding,
        sampling: SamplingParams,
        out: _ChunkMaker,
    ) -> StreamResult:
        """What the request produced, and its timing report."""
        stop = StopReason.CANCELLED if spoken.cancelled else _ended(spoken, budget)
        pieces = [item for item, _ in spoken.done if isinstance(item, Piece)]
        rows = [generated.rows for _, generated in spoken.done]
        codes = np.concatenate(spoken.codes) if spoken.codes else self._no_frames()
        report = TimingReport.from_clock(
            out.clock,
            model=self.spec.identity.name,
            weights=self.stages.weight_layout,
            seed=sampling.seed,
            prompt_rows=sum(piece.prompt.shape[0] for piece in pieces),
            max_new_tokens=sum(piece.max_steps for piece in pieces),
            steps=sum(piece_rows.shape[0] for piece_rows in rows),
            frames=codes.shape[0],
            audio_seconds=out.samples / self.spec.sampling_rate,
            codec_decode=decoding.name,
            streamed=decoding.streams,
            stop_reason=stop,
        )
        return StreamResult(
            np.concatenate(rows) if rows else np.empty((0, self.spec.channels), dtype=np.int64),
            codes,
            report,
            out.clock,
            prompt=pieces[0].prompt if pieces else None,
        )

    def _silence(
        self,
        pause: Pause,
        chunk_frames: int,
        out: _ChunkMaker,
        ended: StopReason | None,
        cancelled: Callable[[], bool],
    ) -> Generator[AudioChunk, None, Generated]:
        """``pause`` as chunks of zeros, ``chunk_frames`` frames each and the rest last (the final chunk, when
        ``ended`` says why the request ends with it); returns what it "generated": no rows, and whether it was
        cancelled."""
        step = chunk_frames * self.spec.samples_per_frame
        stop = StopReason.END
        for start in range(0, pause.samples, step):
            if cancelled():
                stop = StopReason.CANCELLED
                break
            end = min(start + step, pause.samples)
            yield out.chunk(self.spec.silence(end - start), ended if end == pause.samples else None)
        return Generated(np.empty((0, self.spec.channels), dtype=np.int64), stop, self._no_frames())

    def _no_frames(self) -> np.ndarray:
        return np.empty((0, self.spec.n_vq), dtype=np.int64)

    @staticmethod
    def _decoded(
        frames: Frames, context: int, decoder: SegmentDecoder, decodes: Decodes, out: _ChunkMaker
    ) -> Generator[AudioChunk, None, Generated]:
        """A chunk whenever the frames so far make one due and ``decodes`` has it, the first ``context`` frames (a
        continued recording's) taken as left context only; returns what the piece generated. The request's first
        chunk is waited for, so that the first audio leaves as early as it can."""
        while True:
            try:
                frame = next(frames)
            except StopIteration as end:
                return end.value
            if context:  # never a gap: a recording's codes are codes
                assert frame is not None
                decodes.run(partial(decoder.push_context, frame))
                context -= 1
                continue
            call = decoder.end_segment if frame is None else partial(decoder.push, frame)
            for samples in decodes.run(call, wait=out.index == 0):
                yield out.chunk(samples)

    @contextmanager
    def _decoding(self, codec: AudioCodec, audio: AudioConfig, streaming: bool) -> Iterator[SegmentDecoding]:
        """How this request's segments become samples. The stream decoder's state is reset before and after
        the request, however it ends (cancelled, failed, or its stream dropped unfinished), so no request
        starts from another's."""
        stateful = self.stages.stream_decoding
        if not streaming:
            yield OfflineDecoding(codec)
        elif stateful is None:
            yield WindowedStreamDecoding(codec, audio.left_context_frames)
        else:
            stateful.reset()
            try:
                yield stateful
            finally:
                stateful.reset()

    def _frames(
        self,
        stage: GenerationStage | NanoGenerationStage,
        piece: Piece,
        budget: _FrameBudget,
        sampling: SamplingParams,
        cancelled: Callable[[], bool],
        clock: StageClock,
    ) -> Frames:
        """Generate ``piece`` within what ``budget`` leaves: each frame as it completes, None for a gap, the frames of
        a recording it continues first (not counted in the budget); returns what it generated."""
        if isinstance(stage, NanoGenerationStage):
            return (yield from self._nano_frames(stage, piece, budget, sampling, cancelled, clock))
        spec = self.spec
        steps = budget.steps(piece)
        state = DelayState(spec, piece.prompt)
        sampler = Sampler(sampling, spec, piece.prompt)
        context = piece.prefix_frames
        assembler = FrameAssembler(spec, capacity=context + steps)
        # The recording's rows as the prompt holds them, delayed: its frames complete here, or in the first steps.
        for row in piece.prompt[piece.prompt.shape[0] - context :, 1:]:
            frame = assembler.push(row)
            if frame is not None:
                yield frame
        rows: list[np.ndarray] = []
        new: list[np.ndarray] = []  # the frames after the recording's
        generation = generate_rows(
            stage.backbone,
            stage.embeddings,
            stage.heads,
            piece.prompt,
            state,
            sampler,
            steps,
            cancelled,
            clock,
            shared_rows=piece.shared_rows,
        )
        while True:
            try:
                row = next(generation)
            except StopIteration as end:
                stop: StopReason = end.value
                break
            rows.append(row)
            frame = assembler.push(row[1:])
            if frame is not None:
                gap = assembler.is_gap(frame)
                if assembler.frames > context:
                    budget.spend()
                    if not gap:
                        new.append(frame)
                yield None if gap else frame
        return Generated(
            np.stack(rows) if rows else np.empty((0, spec.channels), dtype=np.int64),
            stop,
            np.stack(new) if new else self._no_frames(),
        )

    def _nano_frames(
        self,
        stage: NanoGenerationStage,
        piece: Piece,
        budget: _FrameBudget,
        sampling: SamplingParams,
        cancelled: Callable[[], bool],
        clock: StageClock,
    ) -> Frames:
        """``_frames`` for MOSS-TTS-Nano: no delay, so each generated row is a frame (never a gap), and a recording
        the piece continues is the prompt's last ``prefix_frames`` rows as they stand."""
        spec = self.spec
        yield from piece.prompt[piece.prompt.shape[0] - piece.prefix_frames :, 1:]
        rows: list[np.ndarray] = []
        generation = generate_nano_frames(
            stage.backbone,
            stage.local,
            stage.embeddings,
            stage.heads,
            piece.prompt,
            NanoSampler(sampling, spec),
            budget.steps(piece),
            cancelled,
            clock,
            shared_rows=piece.shared_rows,
        )
        while True:
            try:
                frame = next(generation)
            except StopIteration as end:
                stop: StopReason = end.value
                break
            rows.append(np.concatenate([[spec.audio_assistant_gen_slot_token_id], frame]))
            budget.spend()
            yield frame
        generated = np.stack(rows) if rows else np.empty((0, spec.channels), dtype=np.int64)
        return Generated(generated, stop, generated[:, 1:])

    def _generated_first(
        self,
        source: PlanSource,
        budget: _FrameBudget,
        sampling: SamplingParams,
        cancelled: Callable[[], bool],
        clock: StageClock,
    ) -> tuple[PlanSource, FramesOf]:
        """Generate the pieces with the generation stage loaded for that time only (until one is cancelled, or
        ``budget``, which ``source`` keeps to, is spent): the plan's items, and a replay of each piece's frames,
        for the decoder to load after. What is left to decode is within the budget already."""
        items: list[Piece | Pause] = []
        replays: list[Frames] = []
        with self.stages.generation() as stage:
            while (item := source.next_item()) is not None:
                items.append(item)
                if isinstance(item, Pause):
                    continue
                piece_frames = self._frames(stage, item, budget, _seeded(sampling, len(replays)), cancelled, clock)
                frames, generated = _run_to_end(piece_frames)
                replays.append(_replay(frames, generated))
                source.spoken(item, generated)
                if generated.stop is StopReason.CANCELLED:
                    break
        return ListedPlan(items), lambda piece, number: replays[number]


def _ended(spoken: _Spoken, budget: _FrameBudget) -> StopReason:
    """Why a request that was not cancelled ended: its frame budget or a piece's steps ran out, or the model
    ended every piece."""
    if budget.cut or any(generated.stop is StopReason.MAX_NEW_TOKENS for _, generated in spoken.done):
        return StopReason.MAX_NEW_TOKENS
    return StopReason.END


def _seeded(sampling: SamplingParams, piece_number: int) -> SamplingParams:
    """Each piece gets its own seed, derived from the request's, so a request replays exactly."""
    return replace(sampling, seed=(sampling.seed + piece_number) % 2**63)


def _run_to_end(generator: Generator[_Item, None, _End]) -> tuple[list[_Item], _End]:
    """What ``generator`` yields, and what it returns."""
    items = []
    while True:
        try:
            items.append(next(generator))
        except StopIteration as end:
            return items, end.value


def _replay(items: list[_Item], end: _End) -> Generator[_Item, None, _End]:
    yield from items
    return end
