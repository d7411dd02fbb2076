"""The facade: ``Synthesizer`` loads a voice model once and turns text into streamed audio.

    synth = Synthesizer.from_config_file("config/cpu_only.yaml")
    stream = synth.stream("Hello there.", language="en")
    for chunk in stream:          # AudioChunk objects, as they are produced
        play(chunk.samples)
    print(stream.report.format())

It knows nothing of ROS or of command lines: the node and the CLI are thin layers over it.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from moss_tts_node.codec.audio_io import load_reference_audio
from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.factory import open_codec
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.codec.streaming import (
    OfflineDecoding,
    SegmentDecoder,
    SegmentDecoding,
    StatefulStreamDecoding,
    WindowedStreamDecoding,
)
from moss_tts_node.config import (
    AudioConfig,
    Config,
    GenerationConfig,
    SamplingConfig,
    backbone_path,
    load_config,
    stream_decoder_path,
)
from moss_tts_node.errors import Cancelled, CodecError, ConfigError, RequestError
from moss_tts_node.llama.backbone import Backbone, BackboneParams
from moss_tts_node.model.delay import DelayState, FrameAssembler
from moss_tts_node.model.embeddings import EmbeddingTables
from moss_tts_node.model.generation import generate_rows
from moss_tts_node.model.heads import AudioHeads, load_audio_heads
from moss_tts_node.model.layout import EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR
from moss_tts_node.model.sampling import Sampler
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.normalize import normalize_text
from moss_tts_node.text.pieces import Piece, PiecePlanner
from moss_tts_node.text.prompt import PromptBuilder, PromptFields
from moss_tts_node.timing import StageClock, StopReason, TimingReport

CancelFlag = threading.Event | Callable[[], bool] | None
Reference = str | Path | np.ndarray | None


@dataclass(frozen=True)
class AudioChunk:
    """A piece of the utterance: float32 mono samples in [-1, 1]."""

    samples: np.ndarray
    sample_rate: int
    index: int
    start_s: float  # offset of the first sample from the start of the utterance
    is_final: bool


@dataclass(frozen=True)
class Synthesis:
    """A whole utterance with what produced it (for ``--save-tokens`` and for tests)."""

    audio: np.ndarray
    sample_rate: int
    report: TimingReport
    prompt: np.ndarray  # (S, 1 + n_vq)
    generated: np.ndarray  # (N, 1 + n_vq)
    codes: np.ndarray  # (T, n_vq)


@dataclass(frozen=True)
class StreamResult:
    """What a stream produced besides its chunks: what its producer returns when it ends."""

    generated: np.ndarray  # (N, 1 + n_vq)
    codes: np.ndarray  # (T, n_vq)
    report: TimingReport
    clock: StageClock  # every stage call's timing, for per-step figures


class AudioStream:
    """Iterate for AudioChunks; ``report``, ``generated``, ``codes`` and ``clock`` are there once it ends.

    A text too long for one generation is spoken in pieces, still as one stream: ``prompt`` is
    then the first piece's, ``generated`` and ``codes`` are the pieces' one after the other.
    """

    def __init__(self, prompt: np.ndarray, chunks: Generator[AudioChunk, None, StreamResult]) -> None:
        self.prompt = prompt
        self.result: StreamResult | None = None
        self._chunks = self._run(chunks)

    def _run(self, chunks: Generator[AudioChunk, None, StreamResult]) -> Iterator[AudioChunk]:
        self.result = yield from chunks

    def __iter__(self) -> Iterator[AudioChunk]:
        return self._chunks

    @property
    def report(self) -> TimingReport | None:
        return None if self.result is None else self.result.report

    @property
    def generated(self) -> np.ndarray | None:
        return None if self.result is None else self.result.generated

    @property
    def codes(self) -> np.ndarray | None:
        return None if self.result is None else self.result.codes

    @property
    def clock(self) -> StageClock | None:
        return None if self.result is None else self.result.clock

    @property
    def cancelled(self) -> bool:
        return self.report is not None and self.report.stop_reason is StopReason.CANCELLED


class Generated(NamedTuple):
    """What generating one piece produced: the last item ``Synthesizer._frames`` yields."""

    rows: np.ndarray  # (N, 1 + n_vq)
    stop: StopReason


class Synthesizer:
    """One loaded model; one synthesis at a time (the backbone's KV cache is shared).

    The backbone keeps the last prompt in its KV cache, and a request whose prompt begins the same way
    (same voice, instruction and language: everything before the text) prefills only the rest;
    ``prepare_voice`` puts such a prefix there ahead of the first request.

    With ``model.low_memory`` (8 GB boards) the three stages take turns in memory: the codec's
    encoder (only to encode a reference clip), then the backbone with its embedding tables and
    heads, then the codec's decoder. Each request reloads them and decodes only once generation
    is over, so nothing streams; start-up loads each stage once so bad files still fail early. A
    reloaded backbone starts with an empty KV cache: low_memory cannot reuse a prompt prefix.

    Streams decode with the stream decoder graph that ``audio.stream_decoder`` selects, loaded here
    once (its state is one utterance's, reset between requests), or else with the windowed scheme.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        weights = Path(config.model.weights_dir)
        self.spec = ModelSpec.load(weights)
        self.prompts = PromptBuilder(weights / TOKENIZER_DIR, self.spec)
        self.backbone: Backbone | None = None
        self.embeddings: EmbeddingTables | None = None
        self.heads: AudioHeads | None = None
        self.codec: AudioCodec | None = None  # None between requests in low_memory mode
        self._load_generation()
        assert self.backbone is not None
        self.n_ctx = self.backbone.n_ctx  # what llama.cpp made of llama.n_ctx (it rounds up)
        self.planner = PiecePlanner(self.prompts, self.spec, self.n_ctx, config.audio.max_codec_seconds)
        if config.model.low_memory:
            self._unload_generation()
            open_codec(config).close()
        else:
            self.codec = open_codec(config)
        self.stream_decoding = _open_stream_decoding(config)  # None: streams use the windowed scheme
        self._default_voice: np.ndarray | None = None
        # prepare_voice may come from another thread than the one generating: it waits for the backbone
        # to be idle, and a generation waits for a preparation under way.
        self._backbone_use = threading.Condition()
        self._generating = 0
        self._preparing = False

    def _load_generation(self) -> None:
        """Load the generation stage: the llama.cpp backbone, the embedding tables and the audio heads."""
        config = self.config
        weights = Path(config.model.weights_dir)
        llama = config.llama
        self.backbone = Backbone(
            BackboneParams(
                gguf_path=backbone_path(config),
                n_ctx=llama.n_ctx,
                n_batch=llama.n_batch,
                n_threads=llama.n_threads,
                n_gpu_layers=llama.n_gpu_layers,
                kv_cache_type_k=llama.kv_cache_type_k,
                kv_cache_type_v=llama.kv_cache_type_v,
                flash_attn=llama.flash_attn,
            )
        )
        hidden = self.backbone.n_embd
        self.heads = load_audio_heads(
            config.audio.heads_backend,
            weights / HEADS_DIR,
            self.spec,
            hidden,
            backbone_path(config),
            threads=llama.n_threads,
            n_gpu_layers=llama.n_gpu_layers,
        )
        text_vocab = self.heads.text_vocab or self.backbone.n_vocab
        self.embeddings = EmbeddingTables(weights / EMBEDDINGS_DIR, self.spec, hidden, text_vocab)

    def _unload_generation(self) -> None:
        """Free the generation stage (llama.cpp's memory now; the NumPy tables once unreferenced)."""
        if self.backbone is not None:
            self.backbone.close()
        self.backbone = self.embeddings = self.heads = None

    @contextmanager
    def _generation_stage(self) -> Iterator[None]:
        """The generation stage loaded for the duration only (low_memory mode)."""
        self._load_generation()
        try:
            yield
        finally:
            self._unload_generation()

    @contextmanager
    def _codec_stage(self, *, encoder: bool) -> Iterator[AudioCodec]:
        """The resident codec; in low_memory mode one holding only the encoder or the decoder, for the duration."""
        if self.codec is not None:
            yield self.codec
            return
        with open_codec(self.config, encoder=encoder, decoder=not encoder) as codec:
            yield codec

    @classmethod
    def from_config_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Synthesizer:
        return cls(load_config(path, overrides))

    def close(self) -> None:
        self._unload_generation()
        self.stream_decoding = None  # its caches and graph go with it
        if self.codec is not None:
            self.codec.close()

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- voices ---------------------------------------------------------------------------

    def encode_reference(self, reference: str | Path | np.ndarray) -> np.ndarray:
        """A voice as (T, n_vq) codes: from a WAV/FLAC clip (encoded), a .npy of codes, or an array."""
        if isinstance(reference, np.ndarray):
            return self._checked_codes(reference, "reference codes")
        path = Path(reference)
        if not path.is_file():
            raise RequestError(f"reference audio not found: {path}")
        if path.suffix.lower() == ".npy":
            try:
                codes = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise RequestError(f"{path}: not a readable .npy of voice codes ({exc})") from exc
            return self._checked_codes(codes, str(path))
        samples = load_reference_audio(path)
        with self._codec_stage(encoder=True) as codec:
            return codec.encode(samples)

    def _checked_codes(self, codes: np.ndarray, what: str) -> np.ndarray:
        spec = self.spec
        if codes.ndim != 2 or codes.shape[1] != spec.n_vq or codes.shape[0] == 0:
            raise RequestError(
                f"{what}: shape {codes.shape}, expected (frames, {spec.n_vq}); make it with encode-voice"
            )
        if not np.issubdtype(codes.dtype, np.integer) or codes.min() < 0 or codes.max() >= spec.audio_vocab_size:
            raise RequestError(f"{what}: codes must be integers in 0..{spec.audio_vocab_size - 1}")
        return codes.astype(np.int64)

    def _voice(self, reference: Reference) -> list[np.ndarray]:
        if reference is None:
            default = self.config.generation.reference_audio
            if not default:
                return []
            if self._default_voice is None:
                self._default_voice = self.encode_reference(default)
            return [self._default_voice]
        if isinstance(reference, str | Path) and str(reference) == "":
            return []
        return [self.encode_reference(reference)]

    # -- synthesis ------------------------------------------------------------------------

    def stream(
        self,
        text: str,
        *,
        language: str | None = None,
        instruction: str | None = None,
        quality: str | None = None,
        tokens: int | None = None,
        reference: Reference = None,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingConfig | None = None,
        cancel: CancelFlag = None,
        streaming: bool = True,
        config: Config | None = None,
    ) -> AudioStream:
        """Validate the request now (errors raise here, not mid-stream), then stream its audio.

        ``reference=None`` uses the configured default voice, ``""`` none. Fields left ``None``
        take the config's generation defaults. ``streaming=False`` (for whole-utterance outputs)
        yields the codec's offline decode of each piece once it is generated, instead of chunks
        decoded as they are generated (by the stream decoder when one is loaded, which gives the same
        audio, else each with ``audio.left_context_frames`` of context). A text whose
        speech would not fit the context (or one codec window) is split at sentence boundaries and
        spoken piece by piece in the same stream. ``max_new_tokens`` applies to each piece and is
        clamped to what n_ctx leaves after its prompt; a prompt that leaves no room for one frame is
        refused.

        ``config`` holds the settings the request runs with (generation defaults, sampling, audio
        chunking), by default ``self.config`` now: they are read here once, so replacing
        ``self.config`` later does not change a stream already made (the node queues streams).
        """
        config = config if config is not None else self.config
        gen = config.generation
        fields = self._fields(gen, self._clean_text(text, gen.normalize_text), language, instruction, quality, tokens)
        pieces = self.planner.plan(fields, self._voice(reference), max_new_tokens or gen.max_new_tokens)
        sampling = sampling or config.sampling
        seed = seed if seed is not None and seed >= 0 else sampling.seed
        if seed < 0:
            seed = secrets.randbits(63)
        sampling = replace(sampling, seed=seed)
        return AudioStream(pieces[0].prompt, self._chunks(pieces, sampling, config.audio, _flag(cancel), streaming))

    def prepare_voice(
        self,
        *,
        language: str | None = None,
        instruction: str | None = None,
        quality: str | None = None,
        tokens: int | None = None,
        reference: Reference = None,
    ) -> int:
        """Prefill now the prompt prefix that requests with these fields will share, so that the first of
        them prefills only its text; returns the rows prefilled (0 if they already were in the KV cache).

        Fields as for ``stream`` (``None``: the config's generation defaults, the configured voice), so a
        bare call prepares what a request that gives only its text will use. Waits for a generation under
        way to end first. Does nothing in low_memory mode, whose backbone is reloaded per request.
        """
        if self.config.model.low_memory:
            return 0
        prefix = self.prompts.voice_prefix(
            self._fields(self.config.generation, "", language, instruction, quality, tokens), self._voice(reference)
        )
        with self._backbone_use:
            self._backbone_use.wait_for(lambda: self._generating == 0 and not self._preparing)
            self._preparing = True
        try:
            assert self.backbone is not None and self.embeddings is not None
            return self.backbone.prepare_prefix(prefix, self.embeddings.embed)
        finally:
            with self._backbone_use:
                self._preparing = False
                self._backbone_use.notify_all()

    @staticmethod
    def _fields(
        gen: GenerationConfig,
        text: str,
        language: str | None,
        instruction: str | None,
        quality: str | None,
        tokens: int | None,
    ) -> PromptFields:
        """A request's prompt fields, those left ``None`` taken from the generation defaults ``gen``."""
        return PromptFields(
            text=text,
            language=language if language is not None else gen.language or None,
            instruction=instruction if instruction is not None else gen.instruction or None,
            quality=quality if quality is not None else gen.quality or None,
            tokens=tokens,
        )

    def synthesize(self, text: str, **request: Any) -> Synthesis:
        """The whole utterance at once, as the codec decodes it; raises ``Cancelled`` if the cancel flag was set."""
        stream = self.stream(text, streaming=False, **request)
        chunks = [chunk.samples for chunk in stream]
        if stream.cancelled:
            raise Cancelled("synthesis cancelled")
        assert stream.report is not None and stream.generated is not None and stream.codes is not None
        audio = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.float32)
        return Synthesis(
            audio,
            self.spec.sampling_rate,
            stream.report,
            prompt=stream.prompt,
            generated=stream.generated,
            codes=stream.codes,
        )

    def _clean_text(self, text: str, normalize: bool) -> str:
        if not isinstance(text, str) or not text.strip():
            raise RequestError("the text is empty: give at least one word to speak")
        if normalize:
            text = normalize_text(text)
            if not text.strip():
                raise RequestError("the text is empty after normalization (only markup or control characters)")
        return text

    def _chunks(
        self,
        pieces: list[Piece],
        sampling: SamplingConfig,
        audio: AudioConfig,
        cancelled: Callable[[], bool],
        streaming: bool,
    ) -> Generator[AudioChunk, None, StreamResult]:
        """Generate and decode every piece as one stream: indices and offsets run on, one final chunk."""
        spec = self.spec
        clock = StageClock()
        emitted = 0  # samples so far
        index = 0

        def chunk(samples: np.ndarray, final: bool) -> AudioChunk:
            nonlocal emitted, index
            out = AudioChunk(samples, spec.sampling_rate, index, emitted / spec.sampling_rate, final)
            emitted += samples.shape[0]
            index += 1
            clock.mark_first_audio()
            return out

        # Each piece gets its own seed, derived from the request's, so a request replays exactly.
        generated: Iterator[Iterator[np.ndarray | Generated | None]] = (
            self._frames(piece, replace(sampling, seed=(sampling.seed + number) % 2**63), cancelled, clock)
            for number, piece in enumerate(pieces)
        )
        if self.codec is None:  # low_memory: generate every piece, then load the decoder
            generated = iter(self._generate_staged(generated))
            streaming = False  # nothing left to stream
        codes: list[np.ndarray] = []
        done: list[Generated] = []
        with self._codec_stage(encoder=False) as codec, self._segment_decoding(codec, audio, streaming) as decoding:
            for piece, frames in zip(pieces, generated, strict=False):
                decoder = SegmentDecoder(decoding, audio.chunk_frames, spec.n_vq)
                for frame in frames:
                    if isinstance(frame, Generated):
                        done.append(frame)
                        continue
                    with clock.stage("codec"):
                        samples = decoder.end_segment() if frame is None else decoder.push(frame)
                    if samples is not None:
                        yield chunk(samples, final=False)
                codes.append(decoder.codes())
                if done[-1].stop is StopReason.CANCELLED:
                    break
                with clock.stage("codec"):
                    rest = decoder.end_segment()
                if piece is pieces[-1]:
                    yield chunk(rest if rest is not None else np.empty(0, dtype=np.float32), final=True)
                elif rest is not None:
                    yield chunk(rest, final=False)
        generated_rows = np.concatenate([piece.rows for piece in done])
        all_codes = np.concatenate(codes)
        stops = {piece.stop for piece in done}
        report = TimingReport.from_clock(
            clock,
            seed=sampling.seed,
            prompt_rows=sum(piece.prompt.shape[0] for piece in pieces),
            max_new_tokens=sum(piece.max_steps for piece in pieces),
            steps=generated_rows.shape[0],
            frames=all_codes.shape[0],
            audio_seconds=emitted / spec.sampling_rate,
            codec_decode=decoding.name,
            streamed=decoding.streams,
            stop_reason=next(
                stop for stop in (StopReason.CANCELLED, StopReason.MAX_NEW_TOKENS, StopReason.END) if stop in stops
            ),
        )
        return StreamResult(generated_rows, all_codes, report, clock)

    @contextmanager
    def _segment_decoding(self, codec: AudioCodec, audio: AudioConfig, streaming: bool) -> Iterator[SegmentDecoding]:
        """How this request's segments become samples. The stream decoder's state is reset before and after
        the request, however it ends (cancelled, failed, or its stream dropped unfinished), so no request
        starts from another's."""
        if not streaming:
            yield OfflineDecoding(codec)
        elif self.stream_decoding is None:
            yield WindowedStreamDecoding(codec, audio.left_context_frames)
        else:
            self.stream_decoding.reset()
            try:
                yield self.stream_decoding
            finally:
                self.stream_decoding.reset()

    def _frames(
        self, piece: Piece, sampling: SamplingConfig, cancelled: Callable[[], bool], clock: StageClock
    ) -> Iterator[np.ndarray | Generated | None]:
        """Generate ``piece``: each frame as it completes, None for a gap (an all-pad frame), and last
        what the generation produced (``Generated``)."""
        assert self.backbone is not None and self.embeddings is not None and self.heads is not None
        spec = self.spec
        state = DelayState(spec, piece.prompt)
        sampler = Sampler(sampling, spec, piece.prompt)
        frames = FrameAssembler(spec.n_vq, spec.audio_pad_code, capacity=piece.max_steps)
        rows: list[np.ndarray] = []
        with self._backbone_use:
            self._backbone_use.wait_for(lambda: not self._preparing)
            self._generating += 1
        try:
            generation = generate_rows(
                self.backbone,
                self.embeddings,
                self.heads,
                piece.prompt,
                state,
                sampler,
                piece.max_steps,
                cancelled,
                clock,
            )
            while True:
                try:
                    row = next(generation)
                except StopIteration as end:
                    stop = end.value
                    break
                rows.append(row)
                frame = frames.push(row[1:])
                if frame is not None:
                    yield None if frames.is_gap(frame) else frame
        finally:
            with self._backbone_use:
                self._generating -= 1
                self._backbone_use.notify_all()
        generated = np.stack(rows) if rows else np.empty((0, spec.channels), dtype=np.int64)
        yield Generated(generated, stop)

    def _generate_staged(
        self, generated: Iterator[Iterator[np.ndarray | Generated | None]]
    ) -> list[list[np.ndarray | Generated | None]]:
        """Run the pieces' generation with the backbone loaded only meanwhile; their frames, in order."""
        done: list[list[np.ndarray | Generated | None]] = []
        with self._generation_stage():
            for frames in generated:
                done.append(list(frames))
                end = done[-1][-1]
                assert isinstance(end, Generated)
                if end.stop is StopReason.CANCELLED:
                    break
        return done


def _open_stream_decoding(config: Config) -> StatefulStreamDecoding | None:
    """The stream decoder ``audio.stream_decoder`` selects, loaded and checked now; None for the windowed scheme."""
    path = stream_decoder_path(config)
    if path is None:
        return None
    try:
        decoder = StreamDecoder(path, threads=config.audio.codec_threads)
    except CodecError as error:
        raise ConfigError(
            f"'audio.stream_decoder' {config.audio.stream_decoder} selects a graph that cannot be used: {error}; "
            "or set 'audio.stream_decoder' to off"
        ) from error
    return StatefulStreamDecoding(decoder)


def _flag(cancel: CancelFlag) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel
