"""The delay pattern: codebook k of frame t is generated at step t + k.

``DelayState`` is the per-request state machine of docs/model.md ("Delay state machine"): it says which
text token is forced or allowed, which audio channels are sampled, and advances on each row.
Sampling itself lives in ``sampling.py``; this module only decides what may be sampled.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from moss_tts_node.model.spec import ModelSpec

NOT_FLUSHING = sys.maxsize  # delayed_length while no delay flush is under way


def apply_delay(codes: np.ndarray, pad_code: int) -> np.ndarray:
    """(T, n_vq) codes -> (T + n_vq - 1, n_vq) rows with ``delayed[t + k, k] = codes[t, k]``."""
    frames, n_vq = codes.shape
    delayed = np.full((frames + n_vq - 1, n_vq), pad_code, dtype=np.int64)
    for k in range(n_vq):
        delayed[k : k + frames, k] = codes[:, k]
    return delayed


def remove_delay(delayed: np.ndarray) -> np.ndarray:
    """(N, n_vq) delayed rows -> (N - n_vq + 1, n_vq) codes, ``codes[t, k] = delayed[t + k, k]``."""
    rows, n_vq = delayed.shape
    frames = max(rows - n_vq + 1, 0)
    codes = np.empty((frames, n_vq), dtype=np.int64)
    for k in range(n_vq):
        codes[:, k] = delayed[k : k + frames, k]
    return codes


@dataclass(frozen=True)
class TextRule:
    """What the text channel may be this step: forced, or sampled among ``allowed`` minus ``banned``."""

    forced: int | None = None
    allowed: tuple[int, ...] | None = None  # None: the whole vocabulary
    banned: tuple[int, ...] = ()


class DelayState:
    """Delay state machine for one request (batch 1)."""

    def __init__(self, spec: ModelSpec, prompt: np.ndarray) -> None:
        self.spec = spec
        self.audio_length = 0
        self.delayed_length = NOT_FLUSHING
        self.is_audio = False
        self.is_stopping = False
        self.time_step = 0
        text = prompt[:, 0]
        if text[-1] in (spec.audio_start_token_id, spec.audio_assistant_gen_slot_token_id):
            starts = np.flatnonzero(text == spec.audio_start_token_id)
            if starts.size:
                self.audio_length = len(text) - int(starts[-1])
                self.is_audio = True
        self._channel = np.arange(spec.n_vq)

    def text_rule(self) -> TextRule:
        spec = self.spec
        if self.delayed_length < spec.n_vq:
            return TextRule(forced=spec.audio_assistant_delay_slot_token_id)
        if self.delayed_length == spec.n_vq:
            return TextRule(forced=spec.audio_end_token_id)
        banned = []
        if self.time_step == 0:
            banned.append(spec.audio_assistant_delay_slot_token_id)
        if self.time_step <= spec.n_vq:
            banned.append(spec.im_end_token_id)
        if self.is_audio:
            allowed = (spec.audio_assistant_gen_slot_token_id, spec.audio_assistant_delay_slot_token_id)
            return TextRule(allowed=allowed, banned=tuple(banned))
        banned += [
            spec.pad_token_id,
            spec.audio_assistant_gen_slot_token_id,
            spec.audio_assistant_delay_slot_token_id,
            spec.audio_end_token_id,
        ]
        return TextRule(banned=tuple(banned))

    def audio_channels(self) -> np.ndarray:
        """Boolean (n_vq,): the channels sampled this step; the others hold the pad code."""
        sampled = self._channel < self.audio_length
        if self.delayed_length != NOT_FLUSHING:
            sampled &= self._channel >= self.delayed_length
        return sampled

    def advance(self, text_token: int) -> None:
        """Update the state with the text token of the row just produced."""
        spec = self.spec
        if text_token == spec.audio_start_token_id:
            self.is_audio = True
        elif text_token == spec.audio_end_token_id:
            self.is_audio = False
        elif text_token == spec.im_end_token_id:
            self.is_stopping = True
        if text_token in (
            spec.audio_start_token_id,
            spec.audio_assistant_gen_slot_token_id,
            spec.audio_assistant_delay_slot_token_id,
        ):
            self.audio_length += 1
        elif text_token == spec.audio_end_token_id:
            self.audio_length = 0
        if self.delayed_length == NOT_FLUSHING and text_token == spec.audio_assistant_delay_slot_token_id:
            self.delayed_length = 0
        if self.delayed_length != NOT_FLUSHING:
            self.delayed_length += 1
            if self.delayed_length > spec.n_vq:
                self.delayed_length = NOT_FLUSHING
        self.time_step += 1


class FrameAssembler:
    """Collects the audio columns of generated rows; hands out frames as they complete."""

    def __init__(self, spec: ModelSpec, capacity: int) -> None:
        self.spec = spec
        self.rows = np.empty((max(capacity, 1), spec.n_vq), dtype=np.int64)
        self.count = 0
        self._diagonal = np.arange(spec.n_vq)

    def push(self, audio: np.ndarray) -> np.ndarray | None:
        """Add one row's (n_vq,) codes; returns the frame this row completes, if any."""
        self.rows[self.count] = audio
        self.count += 1
        t = self.frames - 1
        if t < 0:
            return None
        return self.rows[t + self._diagonal, self._diagonal]

    @property
    def frames(self) -> int:
        """Frames completed so far."""
        return self.spec.frames_after(self.count)

    def is_gap(self, frame: np.ndarray) -> bool:
        """All-pad frames separate audio segments (the ramp-up, the flush, text turns)."""
        return bool(np.all(frame == self.spec.audio_pad_code))

    def generated(self) -> np.ndarray:
        return self.rows[: self.count]
