"""Sampling semantics (docs/model.md, "Sampling") and seed determinism."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from conftest import small_spec

from moss_tts_node.model.delay import TextRule
from moss_tts_node.model.family import MOSS_TTS
from moss_tts_node.model.sampling import Sampler, SamplingParams, penalized, sample_rows

SPEC = small_spec(10)
N = SPEC.n_vq


def empty_prompt() -> np.ndarray:
    rows = np.full((2, SPEC.channels), SPEC.audio_pad_code, dtype=np.int64)
    rows[:, 0] = 1
    return rows


def sampler(seed: int = 0, **overrides: float) -> Sampler:
    recommended = asdict(MOSS_TTS.sampling)
    return Sampler(SamplingParams(**{**recommended, "seed": seed, **overrides}), SPEC, empty_prompt())


def frequencies(draws: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(draws, minlength=size) / draws.size


def test_top_k_keeps_only_the_k_best() -> None:
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3]]))
    rng = np.random.default_rng(0)
    draws = np.array([sample_rows(logits, 2, 1.0, rng)[0] for _ in range(4000)])
    freq = frequencies(draws, 4)
    assert freq[0] == 0 and freq[2] == 0
    assert freq[1] == pytest.approx(4 / 7, abs=0.03)


def test_top_p_keeps_the_first_token_that_crosses_p() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(1)
    draws = np.array([sample_rows(logits, 0, 0.6, rng)[0] for _ in range(4000)])
    freq = frequencies(draws, 4)
    assert freq[2] == 0 and freq[3] == 0  # 0.5 < 0.6, 0.8 crosses: tokens 0 and 1 stay
    assert freq[0] == pytest.approx(0.5 / 0.8, abs=0.03)


def test_top_p_applies_within_top_k() -> None:
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    rng = np.random.default_rng(2)
    # top-k 2 renormalizes to 4/7, 3/7; p = 0.5 is crossed by the first token alone
    draws = np.array([sample_rows(logits, 2, 0.5, rng)[0] for _ in range(500)])
    assert set(draws.tolist()) == {0}


def test_rows_are_sampled_independently() -> None:
    logits = np.full((3, 5), -np.inf)
    logits[0, 4] = logits[1, 0] = logits[2, 2] = 0.0
    assert sample_rows(logits, 0, 1.0, np.random.default_rng(0)).tolist() == [4, 0, 2]


def test_repetition_penalty_shrinks_seen_logits_towards_zero() -> None:
    logits = np.array([[2.0, -2.0, 2.0, -2.0]])
    seen = np.array([True, True, False, False])
    assert penalized(logits, seen, 2.0).tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_greedy_text_is_argmax_within_the_rule() -> None:
    logits = np.zeros(64, dtype=np.float32)
    logits[SPEC.audio_end_token_id] = 9.0  # banned below
    logits[30] = 5.0
    s = sampler(text_temperature=0.0)
    rule = TextRule(banned=(SPEC.audio_end_token_id,))
    assert s.sample_text(logits, rule) == 30


def test_forced_text_token_wins() -> None:
    assert sampler().sample_text(np.zeros(64), TextRule(forced=17)) == 17


def test_audio_phase_samples_only_allowed_ids() -> None:
    logits = np.random.default_rng(0).standard_normal(64).astype(np.float32) * 5
    s = sampler()
    rule = TextRule(allowed=(16, 17), banned=(17,))
    assert {s.sample_text(logits, rule) for _ in range(200)} == {16}
    rule = TextRule(allowed=(16, 17))
    assert {s.sample_text(logits, rule) for _ in range(400)} <= {16, 17}


def test_audio_pad_code_is_never_sampled_and_unsampled_channels_are_pad() -> None:
    logits = np.zeros((N, SPEC.audio_rows), dtype=np.float32)
    logits[:, SPEC.audio_pad_code] = 100.0  # the pad would win if it were not masked
    channels = np.zeros(N, dtype=bool)
    channels[:5] = True
    codes = sampler(audio_temperature=0.0).sample_audio(logits, channels)
    assert (codes[:5] != SPEC.audio_pad_code).all()
    assert (codes[5:] == SPEC.audio_pad_code).all()


def test_penalty_sets_channel_zero_own_column_rest_union() -> None:
    """Codebook 0 is penalized over its own history; 1..31 over the union of columns 1..31."""
    logits = np.zeros((N, SPEC.audio_rows), dtype=np.float32)
    logits[:, 7] = 1.0  # best code everywhere
    logits[:, 8] = 0.9
    s = sampler(audio_temperature=0.0, audio_repetition_penalty=2.0)
    history = np.full(N, SPEC.audio_pad_code)
    history[5] = 7  # code 7 seen in column 5 only
    s.observe(history)
    codes = s.sample_audio(logits, np.ones(N, dtype=bool))
    assert codes[0] == 7  # column 0 never held 7
    assert (codes[1:] == 8).all()  # every other codebook shares column 5's history


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    logits = np.random.default_rng(3).standard_normal((N, SPEC.audio_rows)).astype(np.float32)
    channels = np.ones(N, dtype=bool)

    def run(seed: int) -> list[int]:
        s = sampler(seed=seed)
        return [int(c) for _ in range(5) for c in s.sample_audio(logits, channels)]

    assert run(7) == run(7)
    assert run(7) != run(8)


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_a_temperature_too_small_to_divide_by_is_greedy(penalty: float) -> None:
    """1e-310 overflows a logit divided by it; the draw is then the argmax (the limit), with no NaN and no warning,
    in the text channel and in both audio paths (the top-k shortcut without a penalty, the general one with)."""
    rng = np.random.default_rng(4)
    text = rng.standard_normal(64).astype(np.float32) * 3 - 2  # negative and positive logits
    audio = rng.standard_normal((N, SPEC.audio_rows)).astype(np.float32) * 3 - 2
    audio[:, SPEC.audio_pad_code] = -100.0  # masked anyway; the argmax below is over the rest
    tiny = {"text_temperature": 1e-310, "audio_temperature": 1e-310, "audio_repetition_penalty": penalty}
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is the softmax working
        for seed in range(5):
            s = sampler(seed=seed, **tiny)
            assert s.sample_text(text, TextRule(allowed=tuple(range(64)))) == int(np.argmax(text))
            assert s.sample_audio(audio, np.ones(N, dtype=bool)).tolist() == np.argmax(audio, axis=1).tolist()
