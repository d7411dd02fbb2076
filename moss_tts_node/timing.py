"""Where a synthesis spends its time, in the figures a robot integrator asks for."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from enum import Enum


class StopReason(str, Enum):
    """Why a generation ended. A ``str``, so reports, JSON and ROS messages carry its value."""

    END = "end"  # the model sampled im_end
    MAX_NEW_TOKENS = "max_new_tokens"  # the step budget ran out first
    CANCELLED = "cancelled"  # the cancel flag was set

    def __str__(self) -> str:
        return self.value


class StageClock:
    """Wall time per named stage of the step loop: the total, and every call's start and duration (for
    per-step figures such as medians, which ``bench`` reads)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (perf_counter start, seconds)
        self.first_audio: float | None = None
        self.prefilled_rows = 0  # prompt rows run through the backbone (the rest were reused from its KV cache)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.seconds[name] += seconds
            self.calls[name].append((start, seconds))

    def mark_first_audio(self) -> None:
        if self.first_audio is None:
            self.first_audio = time.perf_counter() - self.started

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class TimingReport:
    """One request's figures. real_time_factor = wall time / audio time (below 1 is faster than real time).

    ``model`` names the model that made them (``ModelIdentity.name``), ``weights`` where llama.cpp keeps its
    backbone's weights and why (``Backbone.weight_layout``): the layout sets the speed of a CPU's steps.

    ``codec_decode`` names how the audio was decoded (``SegmentDecoding.name``: "offline", or a
    streaming strategy) and ``codec_rtf`` = codec time / audio time. ``codec_stalls``: the audio
    was streamed and ``codec_rtf`` is above 1, so the codec alone cannot keep up with playback on
    this machine; ``format`` says so.
    """

    model: str
    weights: str
    seed: int
    prompt_rows: int
    prefilled_rows: int  # of prompt_rows; the others were a prefix kept in the KV cache from the last request
    max_new_tokens: int
    steps: int
    frames: int
    audio_seconds: float
    prefill_ms: float
    backbone_ms_per_step: float
    heads_ms_per_step: float
    sampling_ms_per_step: float
    codec_ms: float
    codec_decode: str
    codec_rtf: float | None
    codec_stalls: bool
    steps_per_second: float
    time_to_first_audio_s: float | None
    wall_s: float
    real_time_factor: float | None
    stop_reason: StopReason

    @classmethod
    def from_clock(
        cls,
        clock: StageClock,
        *,
        model: str,
        weights: str,
        seed: int,
        prompt_rows: int,
        max_new_tokens: int,
        steps: int,
        frames: int,
        audio_seconds: float,
        codec_decode: str,
        streamed: bool,
        stop_reason: StopReason,
    ) -> TimingReport:
        wall = clock.elapsed()
        codec_rtf = clock.seconds["codec"] / audio_seconds if audio_seconds > 0 else None
        per_step = 1000.0 / max(steps, 1)
        loop_s = sum(clock.seconds[s] for s in ("backbone", "heads", "sampling"))
        return cls(
            model=model,
            weights=weights,
            seed=seed,
            prompt_rows=prompt_rows,
            prefilled_rows=clock.prefilled_rows,
            max_new_tokens=max_new_tokens,
            steps=steps,
            frames=frames,
            audio_seconds=audio_seconds,
            prefill_ms=clock.seconds["prefill"] * 1000.0,
            backbone_ms_per_step=clock.seconds["backbone"] * per_step,
            heads_ms_per_step=clock.seconds["heads"] * per_step,
            sampling_ms_per_step=clock.seconds["sampling"] * per_step,
            codec_ms=clock.seconds["codec"] * 1000.0,
            codec_decode=codec_decode,
            codec_rtf=codec_rtf,
            codec_stalls=streamed and codec_rtf is not None and codec_rtf > 1.0,
            steps_per_second=steps / loop_s if loop_s > 0 else 0.0,
            time_to_first_audio_s=clock.first_audio,
            wall_s=wall,
            real_time_factor=wall / audio_seconds if audio_seconds > 0 else None,
            stop_reason=stop_reason,
        )

    def to_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)

    def summary(self) -> str:
        """One line: the audio, the time it took, the real-time factor and why it stopped (a server's log line)."""
        rtf = "-" if self.real_time_factor is None else f"{self.real_time_factor:.2f}"
        seconds = f"{self.audio_seconds:.2f} s of audio in {self.wall_s:.2f} s"
        return f"{seconds} (real-time factor {rtf}, stop: {self.stop_reason})"

    def format(self) -> str:
        ttfa = "-" if self.time_to_first_audio_s is None else f"{self.time_to_first_audio_s * 1000:.0f} ms"
        rtf = "-" if self.real_time_factor is None else f"{self.real_time_factor:.2f}"
        codec_rtf = "-" if self.codec_rtf is None else f"{self.codec_rtf:.2f}"
        warning = (
            [
                f"warning            the codec streams at {codec_rtf}x real time on this machine: playback will "
                "stall; raise audio.chunk_frames, and with the windowed scheme lower audio.left_context_frames or "
                'build a stream decoder (docs/stream-decoder.md, "Building a stream decoder")'
            ]
            if self.codec_stalls
            else []
        )
        return "\n".join(
            [
                f"model              {self.model}",
                f"weights            {self.weights}",
                f"prompt rows        {self.prompt_rows} ({self.prefilled_rows} prefilled, the rest reused)",
                f"steps              {self.steps} of {self.max_new_tokens} (stop: {self.stop_reason})",
                f"audio              {self.frames} frames, {self.audio_seconds:.2f} s",
                f"prefill            {self.prefill_ms:.1f} ms",
                f"steps/s            {self.steps_per_second:.2f}",
                f"ms per step        backbone {self.backbone_ms_per_step:.2f} | heads {self.heads_ms_per_step:.2f}"
                f" | sampling {self.sampling_ms_per_step:.2f}",
                f"codec              {self.codec_ms:.1f} ms ({self.codec_decode}, real-time factor {codec_rtf})",
                *warning,
                f"time to 1st audio  {ttfa}",
                f"wall               {self.wall_s:.2f} s (real-time factor {rtf})",
                f"seed               {self.seed}",
            ]
        )
