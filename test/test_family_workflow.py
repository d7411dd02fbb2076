"""The robot's workflow on the demo weights, through the command line (docs/family.md, "A voice designed, then
kept"): design a voice with MOSS-VoiceGenerator from a description, keep it as a named voice encoded by MOSS-TTS's
codec (32 quantizers) with its transcript, and speak with it through MOSS-TTS as a reference and as a prefix; the
designer's own 16-codebook codes are refused by MOSS-TTS, naming both counts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import bad_input_message, run_cli

from moss_tts_node.model.delay import apply_delay
from moss_tts_node.model.spec import ModelSpec

DESCRIPTION = "a warm, low voice of an old man"
SAID = "Good evening. I am the butler of this house."
TEXT = "Dinner is served in the east wing."


@pytest.fixture(scope="module")
def designer(family_demo: Callable[[str], Path]) -> Path:
    return family_demo("voice-generator")


def cli(*args: str | Path) -> str:
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def design(designer: Path, out: Path) -> None:
    """A voice designed from its description: ``synth --config voicegen.yaml --instruction ... --text ...``."""
    cli("synth", "--config", designer, "--instruction", DESCRIPTION, "--text", SAID, "--output", out, "--seed", "3")


def test_a_designed_voice_is_kept_and_spoken_with_by_moss_tts(
    designer: Path, demo_config: Path, tmp_path: Path
) -> None:
    designed, voices = tmp_path / "designed.wav", tmp_path / "voices"
    voices.mkdir()
    design(designer, designed)
    samples, rate = sf.read(designed, dtype="int16")
    assert rate == 24000 and samples.shape[0] > 0
    # Kept for MOSS-TTS: encoded by its codec at its 32 quantizers, with what it says beside it.
    cli("encode-voice", "--config", demo_config, designed, voices / "butler.npy")
    (voices / "butler.txt").write_text(SAID, encoding="utf-8")
    codes = np.load(voices / "butler.npy")
    assert codes.shape[1] == 32 and codes.shape[0] == -(-samples.shape[0] // 1920)
    speak = ("synth", "--config", demo_config, "--set", f"voices.directories=[{voices}]", "--text", TEXT)
    # As the [S1] reference: its codes in the prompt's user turn.
    tokens = tmp_path / "reference.npz"
    cli(*speak, "--reference", "butler", "--output", tmp_path / "a.wav", "--save-tokens", tokens)
    prompt = np.load(tokens)["prompt"]
    slots = prompt[:, 0] == ModelSpec.load(demo_config.parent).audio_user_slot_token_id
    np.testing.assert_array_equal(prompt[slots, 1:], apply_delay(codes, 1024))
    # As the prefix the speech continues, its transcript from butler.txt: its codes end the prompt.
    tokens = tmp_path / "prefix.npz"
    cli(*speak, "--prefix", "butler", "--output", tmp_path / "b.wav", "--save-tokens", tokens)
    prompt = np.load(tokens)["prompt"]
    np.testing.assert_array_equal(prompt[-codes.shape[0] :, 1:], apply_delay(codes, 1024)[: codes.shape[0]])
    assert sf.info(tmp_path / "b.wav").frames > 0


def test_the_designers_own_codes_are_refused_by_moss_tts_naming_both_counts(
    designer: Path, demo_config: Path, tmp_path: Path
) -> None:
    designed, sixteen = tmp_path / "designed.wav", tmp_path / "designed16.npy"
    design(designer, designed)
    cli("encode-voice", "--config", designer, designed, sixteen)
    assert np.load(sixteen).shape[1] == 16
    for role in ("--reference", "--prefix"):
        message = bad_input_message(
            "synth", "--config", demo_config, role, sixteen, "--text", TEXT, "--output", "a.wav"
        )
        assert "codes of 16 codebooks, but this model has 32" in message and "re-encode the clip" in message
