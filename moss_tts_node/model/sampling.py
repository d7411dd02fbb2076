"""Token sampling for the text channel and the audio channels, seedable.

Order (docs/model.md, "Sampling"): divide by temperature; phase masks and the audio pad column at
-inf; repetition penalty; top-k; top-p within the top-k (the first token that crosses p is
kept); softmax; multinomial draw. Temperature <= 0 is greedy: argmax after the penalty. The penalty is applied
first here: it scales a logit by its sign, which a positive temperature keeps, so the two commute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moss_tts_node.model.delay import TextRule
from moss_tts_node.model.spec import ModelSpec


def tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Float64 logits (C, V) over a positive ``temperature``, each row shifted so its maximum is 0: the same softmax,
    and a temperature so small that the division overflows (1e-310) gives the greedy limit (0 at the maximum, -inf
    elsewhere) instead of inf - inf."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    with np.errstate(over="ignore"):
        return shifted / temperature


def sample_rows(scaled: np.ndarray, top_k: int, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """Draw one index per row of already-scaled, already-masked logits (C, V)."""
    n_rows, vocab = scaled.shape
    if 0 < top_k < vocab:
        candidates = np.argpartition(scaled, vocab - top_k, axis=1)[:, vocab - top_k :]
    else:
        candidates = np.broadcast_to(np.arange(vocab), (n_rows, vocab))
    return sample_candidates(candidates, scaled[np.arange(n_rows)[:, None], candidates], top_p, rng)


def sample_candidates(candidates: np.ndarray, values: np.ndarray, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """Draw one of each row's top-k ``candidates`` (C, k) by their scaled float64 logits ``values``."""
    n_rows = candidates.shape[0]
    order = np.argsort(-values, axis=1, kind="stable")
    # Row-wise gathers by plain indexing: take_along_axis gathers the same, with 3 us of Python a call, and a frame
    # of MOSS-TTS-Nano samples 17 single rows.
    rows = np.arange(n_rows)[:, None]
    candidates = candidates[rows, order]
    values = values[rows, order]
    probs = np.exp(values - values[:, :1])
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p < 1.0:
        before = np.cumsum(probs, axis=1) - probs  # mass of the better tokens
        probs = np.where(before <= top_p, probs, 0.0)
    cumulative = np.cumsum(probs, axis=1)
    draws = rng.random(n_rows) * cumulative[:, -1]
    picks = (cumulative < draws[:, None]).sum(axis=1)
    picks = np.minimum(picks, candidates.shape[1] - 1)  # guards the rounding of the last cumulative sum
    return candidates[rows[:, 0], picks]


def penalized(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """Logits (C, V) with the tokens already seen pushed down (positive / p, negative * p)."""
    return np.where(seen & (logits > 0), logits / penalty, np.where(seen, logits * penalty, logits))


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; the user-facing values are checked once, by the config (``sampling.*``), whose
    keys left at -1 take the model's recommendation (``model/family.py``): no defaults here, so no second copy."""

    text_temperature: float  # <= 0 is greedy
    text_top_k: int  # 0 disables
    text_top_p: float
    audio_temperature: float
    audio_top_k: int
    audio_top_p: float
    audio_repetition_penalty: float  # 1.0 disables
    seed: int  # the request's, already drawn when the config said -1


class Sampler:
    """Samples one row of tokens per step; owns the request's random generator."""

    def __init__(self, config: SamplingParams, spec: ModelSpec, prompt: np.ndarray) -> None:
        self.config = config
        self.spec = spec
        self.rng = np.random.default_rng(config.seed)
        # Repetition penalty sets, as the original model keeps them: codebook 0 over its own
        # column; codebooks 1 to n_vq - 1 over the union of their columns, prompt rows included.
        self._seen_first = np.zeros(spec.audio_rows, dtype=bool)
        self._seen_rest = np.zeros(spec.audio_rows, dtype=bool)
        self.observe(prompt[:, 1:])

    def observe(self, audio_rows: np.ndarray) -> None:
        """Record the audio columns of rows that are now part of the sequence: (N, n_vq) or (n_vq,)."""
        audio_rows = np.atleast_2d(audio_rows)
        self._seen_first[audio_rows[:, 0]] = True
        self._seen_rest[audio_rows[:, 1:].ravel()] = True

    def sample_text(self, logits: np.ndarray | None, rule: TextRule, logit_ids: Sequence[int] | None = None) -> int:
        """The text token. ``logits`` is indexed by token id, or, with ``logit_ids``, holds the logits of
        those ids only (enough when ``rule`` allows a few ids, as in the audio phase); unused when forced."""
        if rule.forced is not None:
            return rule.forced
        assert logits is not None
        config = self.config
        if rule.allowed is not None:
            # Only a few ids may be sampled (the audio phase): work on those alone.
            ids = np.array([i for i in rule.allowed if i not in rule.banned], dtype=np.int64)
            where = ids if logit_ids is None else [list(logit_ids).index(i) for i in ids]
            scaled = logits[where].astype(np.float64)[None, :]
        else:
            assert logit_ids is None, "sampling the whole vocabulary needs all the text logits"
            ids = None
            scaled = logits.astype(np.float64)[None, :]
            scaled[0, list(rule.banned)] = -np.inf
        if config.text_temperature <= 0:
            pick = int(np.argmax(scaled[0]))
        else:
            scaled = tempered(scaled, config.text_temperature)
            pick = int(sample_rows(scaled, config.text_top_k, config.text_top_p, self.rng)[0])
        return int(ids[pick]) if ids is not None else pick

    def sample_audio(self, logits: np.ndarray, channels: np.ndarray) -> np.ndarray:
        """(n_vq,) codes: sampled where ``channels`` is set, the pad code elsewhere.

        ``logits`` is (n_vq, audio_rows); only the rows of sampled channels are read.
        """
        spec, config = self.spec, self.config
        codes = np.full(spec.n_vq, spec.audio_pad_code, dtype=np.int64)
        index = np.flatnonzero(channels)
        if index.size == 0:
            return codes
        rows = logits[index] if index.size < spec.n_vq else np.array(logits, dtype=np.float32)
        rows[:, spec.audio_pad_code] = -np.inf
        top_k, vocab = config.audio_top_k, rows.shape[1]
        if config.audio_repetition_penalty == 1.0 and config.audio_temperature > 0 and 0 < top_k < vocab:
            # The common case, made cheap: dividing by the temperature keeps the order, so the top-k is
            # selected on the float32 logits and only the k candidates are widened and scaled.
            candidates = np.argpartition(rows, vocab - top_k, axis=1)[:, vocab - top_k :]
            values = tempered(np.take_along_axis(rows, candidates, axis=1).astype(np.float64), config.audio_temperature)
            codes[index] = sample_candidates(candidates, values, config.audio_top_p, self.rng)
            return codes
        scaled = rows.astype(np.float64)
        if config.audio_repetition_penalty != 1.0:
            first = index == 0
            seen = np.where(first[:, None], self._seen_first, self._seen_rest)
            scaled = penalized(scaled, seen, config.audio_repetition_penalty)
        if config.audio_temperature <= 0:
            codes[index] = np.argmax(scaled, axis=1)
        else:
            codes[index] = sample_rows(tempered(scaled, config.audio_temperature), top_k, config.audio_top_p, self.rng)
        return codes
