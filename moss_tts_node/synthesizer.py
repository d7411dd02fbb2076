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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .audio_io import load_reference_audio
from .backbone import Backbone, BackboneParams
from .codec import AudioCodec, OnnxCodec
from .config import Config, SamplingConfig, backbone_path, load_config
from .delay import DelayState
from .errors import Cancelled, RequestError
from .generation import generate_rows
from .model_spec import ModelSpec
from .normalize import normalize_text
from .prompt import PromptBuilder, PromptFields
from .sampling import Sampler
from .streaming import FrameAssembler, StreamingDecoder
from .timing import StageClock, TimingReport
from .weights import AudioHeads, EmbeddingTables

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


class AudioStream:
    """Iterate for AudioChunks; ``report``, ``generated`` and ``codes`` are set once it ends."""

    def __init__(self, prompt: np.ndarray, produce: Callable[[AudioStream], Iterator[AudioChunk]]) -> None:
        self.prompt = prompt
        self.report: TimingReport | None = None
        self.generated: np.ndarray | None = None
        self.codes: np.ndarray | None = None
        self._chunks = produce(self)

    def __iter__(self) -> Iterator[AudioChunk]:
        return self._chunks

    @property
    def cancelled(self) -> bool:
        return self.report is not None and self.report.stop_reason == "cancelled"


class Synthesizer:
    """One loaded model; one synthesis at a time (the backbone's KV cache is shared)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        weights = Path(config.model.weights_dir)
        codec_dir = Path(config.model.codec_dir)
        self.spec = ModelSpec.load(weights)
        self.prompts = PromptBuilder(weights / "tokenizer", self.spec)
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
        self.embeddings = EmbeddingTables(weights / "embeddings", self.spec, hidden, self.backbone.n_vocab)
        self.heads = AudioHeads(weights / "lm_heads", self.spec, hidden)
        encoder = codec_dir / "encoder.onnx"
        self.codec: AudioCodec = OnnxCodec(
            codec_dir / "decoder.onnx",
            encoder if encoder.is_file() else None,
            provider=config.audio.onnx_provider,
            threads=config.audio.codec_threads,
        )
        self._default_voice: np.ndarray | None = None

    @classmethod
    def from_config_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Synthesizer:
        return cls(load_config(path, overrides))

    def close(self) -> None:
        self.backbone.close()
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
        return self.codec.encode(load_reference_audio(path))

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
    ) -> AudioStream:
        """Validate the request now (errors raise here, not mid-stream), then stream its audio.

        ``reference=None`` uses the configured default voice, ``""`` none. Fields left ``None``
        take the config's generation defaults. ``max_new_tokens`` is clamped to what n_ctx
        leaves after the prompt; a prompt that leaves no room for one frame is refused.
        """
        gen = self.config.generation
        fields = PromptFields(
            text=self._clean_text(text),
            language=language if language is not None else gen.language or None,
            instruction=instruction if instruction is not None else gen.instruction or None,
            quality=quality if quality is not None else gen.quality or None,
            tokens=tokens,
        )
        prompt = self.prompts.build(fields, self._voice(reference))
        steps = self._step_budget(prompt, max_new_tokens or gen.max_new_tokens)
        sampling = sampling or self.config.sampling
        seed = seed if seed is not None and seed >= 0 else sampling.seed
        if seed < 0:
            seed = secrets.randbits(63)
        sampling = replace(sampling, seed=seed)
        return AudioStream(prompt, lambda stream: self._chunks(stream, steps, sampling, _flag(cancel)))

    def synthesize(self, text: str, **request: Any) -> Synthesis:
        """The whole utterance at once; raises ``Cancelled`` if the cancel flag was set."""
        stream = self.stream(text, **request)
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

    def _clean_text(self, text: str) -> str:
        if not isinstance(text, str) or not text.strip():
            raise RequestError("the text is empty: give at least one word to speak")
        if self.config.generation.normalize_text:
            text = normalize_text(text)
            if not text.strip():
                raise RequestError("the text is empty after normalization (only markup or control characters)")
        return text

    def _step_budget(self, prompt: np.ndarray, requested: int) -> int:
        room = self.backbone.n_ctx - prompt.shape[0]
        needed = self.spec.n_vq + 1  # the ramp-up plus one complete frame
        if room < needed:
            raise RequestError(
                f"the prompt takes {prompt.shape[0]} rows of the {self.backbone.n_ctx}-row context and leaves "
                f"{max(room, 0)} steps, fewer than the {needed} needed for one frame: shorten the text or "
                f"the reference clip, or raise llama.n_ctx"
            )
        return min(requested, room)

    def _chunks(
        self, stream: AudioStream, max_steps: int, sampling: SamplingConfig, cancelled: Callable[[], bool]
    ) -> Iterator[AudioChunk]:
        spec, audio, prompt = self.spec, self.config.audio, stream.prompt
        clock = StageClock()
        state = DelayState(spec, prompt)
        sampler = Sampler(sampling, spec, prompt)
        frames = FrameAssembler(spec.n_vq, spec.audio_pad_code, capacity=max_steps)
        decoder = StreamingDecoder(self.codec, audio.chunk_frames, audio.left_context_frames)
        rows: list[np.ndarray] = []
        emitted = 0  # samples so far
        index = 0

        def chunk(samples: np.ndarray, final: bool) -> AudioChunk:
            nonlocal emitted, index
            out = AudioChunk(samples, spec.sampling_rate, index, emitted / spec.sampling_rate, final)
            emitted += samples.shape[0]
            index += 1
            clock.mark_first_audio()
            return out

        for row in generate_rows(
            self.backbone, self.embeddings, self.heads, prompt, state, sampler, max_steps, cancelled, clock
        ):
            rows.append(row)
            frame = frames.push(row[1:])
            if frame is None:
                continue
            with clock.stage("codec"):
                samples = decoder.end_segment() if frames.is_gap(frame) else decoder.push(frame)
            if samples is not None:
                yield chunk(samples, final=False)
        stop = "end" if state.is_stopping else "max_new_tokens" if len(rows) == max_steps else "cancelled"
        if stop != "cancelled":
            with clock.stage("codec"):
                rest = decoder.end_segment()
            yield chunk(rest if rest is not None else np.empty(0, dtype=np.float32), final=True)
        stream.generated = np.stack(rows) if rows else np.empty((0, spec.channels), dtype=np.int64)
        stream.codes = decoder.codes()
        stream.report = TimingReport.from_clock(
            clock,
            seed=sampling.seed,
            prompt_rows=prompt.shape[0],
            max_new_tokens=max_steps,
            steps=len(rows),
            frames=stream.codes.shape[0],
            audio_seconds=emitted / spec.sampling_rate,
            stop_reason=stop,
        )


def _flag(cancel: CancelFlag) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel
