"""The delay pattern and its state machine, rule by rule (docs/model.md, "Delay state machine")."""

from __future__ import annotations

import numpy as np
import pytest

from moss_tts_node.model.delay import NOT_FLUSHING, DelayState, FrameAssembler, apply_delay, remove_delay
from moss_tts_node.model.spec import ModelSpec

SPEC = ModelSpec()  # the published ids
N = SPEC.n_vq


def standard_prompt(extra_rows: int = 5) -> np.ndarray:
    rows = np.full((extra_rows + 1, SPEC.channels), SPEC.audio_pad_code, dtype=np.int64)
    rows[:-1, 0] = 100
    rows[-1, 0] = SPEC.audio_start_token_id
    return rows


@pytest.mark.parametrize("frames", [1, 2, 31, 32, 33, 100])
def test_delay_then_remove_is_identity(frames: int) -> None:
    codes = np.random.default_rng(frames).integers(0, 1024, size=(frames, N))
    delayed = apply_delay(codes, SPEC.audio_pad_code)
    assert delayed.shape == (frames + N - 1, N)
    for t, k in [(0, 0), (frames - 1, N - 1), (frames // 2, 7)]:
        assert delayed[t + k, k] == codes[t, k]
    assert np.array_equal(remove_delay(delayed), codes)


def test_delay_pads_outside_the_staircase() -> None:
    delayed = apply_delay(np.zeros((3, N), dtype=np.int64), SPEC.audio_pad_code)
    assert delayed[0, 1] == SPEC.audio_pad_code  # codebook 1 starts one row late
    assert delayed[2, N - 1] == SPEC.audio_pad_code
    assert delayed[-1, 0] == SPEC.audio_pad_code  # codebook 0 ends early
    assert (delayed != SPEC.audio_pad_code).sum() == 3 * N


def test_remove_delay_with_too_few_rows_gives_no_frames() -> None:
    assert remove_delay(np.zeros((N - 1, N), dtype=np.int64)).shape == (0, N)


def test_init_from_standard_prompt() -> None:
    state = DelayState(SPEC, standard_prompt())
    assert state.audio_length == 1 and state.is_audio and not state.is_stopping
    assert state.delayed_length == NOT_FLUSHING and state.time_step == 0


def test_init_from_text_prompt_is_not_audio() -> None:
    prompt = standard_prompt()
    prompt[-1, 0] = 100
    state = DelayState(SPEC, prompt)
    assert state.audio_length == 0 and not state.is_audio


def test_first_step_bans_delay_slot_and_im_end() -> None:
    rule = DelayState(SPEC, standard_prompt()).text_rule()
    assert rule.forced is None
    assert rule.allowed == (SPEC.audio_assistant_gen_slot_token_id, SPEC.audio_assistant_delay_slot_token_id)
    assert SPEC.audio_assistant_delay_slot_token_id in rule.banned
    assert SPEC.im_end_token_id in rule.banned


def test_im_end_banned_through_step_32_only() -> None:
    prompt = standard_prompt()
    prompt[-1, 0] = 100  # text phase, so im_end would otherwise be allowed
    state = DelayState(SPEC, prompt)
    for _ in range(N + 1):
        assert SPEC.im_end_token_id in state.text_rule().banned
        state.advance(100)
    assert state.time_step == N + 1
    assert SPEC.im_end_token_id not in state.text_rule().banned


def test_text_phase_bans_audio_controls() -> None:
    prompt = standard_prompt()
    prompt[-1, 0] = 100
    rule = DelayState(SPEC, prompt).text_rule()
    assert rule.allowed is None
    for token in (
        SPEC.pad_token_id,
        SPEC.audio_assistant_gen_slot_token_id,
        SPEC.audio_assistant_delay_slot_token_id,
        SPEC.audio_end_token_id,
    ):
        assert token in rule.banned


def test_ramp_up_samples_one_more_channel_per_step() -> None:
    state = DelayState(SPEC, standard_prompt())
    for step in range(N + 3):
        channels = state.audio_channels()
        assert channels.sum() == min(step + 1, N)
        assert channels[: min(step + 1, N)].all()
        state.advance(SPEC.audio_assistant_gen_slot_token_id)


def test_flush_forces_delay_slots_then_audio_end() -> None:
    state = DelayState(SPEC, standard_prompt())
    for _ in range(40):
        state.advance(SPEC.audio_assistant_gen_slot_token_id)
    assert state.audio_channels().all()
    state.advance(SPEC.audio_assistant_delay_slot_token_id)  # sampled: the flush begins
    for j in range(1, N):
        rule = state.text_rule()
        assert rule.forced == SPEC.audio_assistant_delay_slot_token_id
        channels = state.audio_channels()
        assert not channels[:j].any() and channels[j:].all(), j
        state.advance(rule.forced)
    assert state.text_rule().forced == SPEC.audio_end_token_id
    assert not state.audio_channels().any()
    state.advance(SPEC.audio_end_token_id)
    assert not state.is_audio and state.audio_length == 0 and state.delayed_length == NOT_FLUSHING
    assert state.text_rule().forced is None


def test_audio_start_and_im_end_flags() -> None:
    prompt = standard_prompt()
    prompt[-1, 0] = 100
    state = DelayState(SPEC, prompt)
    state.advance(SPEC.audio_start_token_id)
    assert state.is_audio and state.audio_length == 1
    state.advance(SPEC.im_end_token_id)
    assert state.is_stopping


def test_a_scripted_utterance_de_delays_to_its_frames() -> None:
    """Drive the machine through a whole utterance; the sampled channels must form whole frames."""
    state = DelayState(SPEC, standard_prompt())
    rng = np.random.default_rng(0)
    rows = []
    gen_steps = 10
    while not state.is_stopping:
        rule = state.text_rule()
        if rule.forced is not None:
            text = rule.forced
        elif state.is_audio:
            text = (
                SPEC.audio_assistant_gen_slot_token_id
                if state.time_step < gen_steps
                else (SPEC.audio_assistant_delay_slot_token_id)
            )
        else:
            text = SPEC.im_end_token_id
        audio = np.where(state.audio_channels(), rng.integers(0, 1024, N), SPEC.audio_pad_code)
        rows.append(audio)
        state.advance(text)
    codes = remove_delay(np.array(rows))
    full = ~np.all(codes == SPEC.audio_pad_code, axis=1)
    assert full.sum() == gen_steps + 1  # one frame per gen step, plus the one begun at the first delay slot
    assert not np.any(codes[full] == SPEC.audio_pad_code)  # no frame is partial
    assert len(rows) == gen_steps + 1 + (N - 1) + 1 + 1  # gen steps, delay step, forced slots, audio_end, im_end


@pytest.mark.parametrize("n_vq", [16, 32])
def test_the_specs_geometry_is_the_delay_patterns(n_vq: int) -> None:
    """ModelSpec's rows, first-frame steps and frames-after agree with apply_delay, remove_delay and the state
    machine, for both codebook counts of the family."""
    spec = ModelSpec(n_vq=n_vq)
    for frames in (1, 2, n_vq - 1, n_vq, 3 * n_vq):
        delayed = apply_delay(np.zeros((frames, n_vq), dtype=np.int64), spec.audio_pad_code)
        assert spec.delayed_rows(frames) == delayed.shape[0]
        assert spec.frames_after(delayed.shape[0]) == remove_delay(delayed).shape[0] == frames
    assert spec.frames_after(n_vq - 1) == remove_delay(np.zeros((n_vq - 1, n_vq), dtype=np.int64)).shape[0] == 0
    prompt = np.full((2, spec.channels), spec.audio_pad_code, dtype=np.int64)
    prompt[:, 0] = (100, spec.audio_start_token_id)
    state = DelayState(spec, prompt)
    steps = 1  # the step sampling the first frame's last codebook completes it
    while not state.audio_channels()[-1]:
        state.advance(spec.audio_assistant_gen_slot_token_id)
        steps += 1
    assert spec.first_frame_steps == steps


def test_the_frame_assembler_hands_out_frames_as_the_rows_complete_them() -> None:
    rows = np.random.default_rng(1).integers(0, 1024, size=(N + 4, N))
    assembler = FrameAssembler(SPEC, capacity=rows.shape[0])
    handed = [(count, assembler.push(row)) for count, row in enumerate(rows, start=1)]
    frames = [(count, frame) for count, frame in handed if frame is not None]
    assert [count for count, _ in frames] == list(range(SPEC.first_frame_steps, rows.shape[0] + 1))
    np.testing.assert_array_equal(np.array([frame for _, frame in frames]), remove_delay(rows))
    assert assembler.frames == remove_delay(rows).shape[0]
