"""The command line in a separate process, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import soundfile as sf
from conftest import bad_input_message, run_cli

from moss_tts_node.codec.audio_io import load_reference_audio, write_wav
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.pcm import float_to_pcm16
from moss_tts_node.tools.overrides import parse_overrides

if TYPE_CHECKING:
    from conftest import NullSink


def test_synth_writes_a_24khz_mono_wav_of_whole_frames(demo_config: Path, tmp_path: Path) -> None:
    out, tokens = tmp_path / "out.wav", tmp_path / "tokens.npz"
    done = run_cli(
        "synth",
        "--config",
        demo_config,
        "--text",
        "Hello robot.",
        "--output",
        out,
        "--seed",
        "3",
        "--save-tokens",
        tokens,
        "--profile",
        "--language",
        "en",
    )
    assert done.returncode == 0, done.stderr
    assert "steps/s" in done.stdout and "time to 1st audio" in done.stdout
    # where llama.cpp put the weights, and why: the demo's F16 GGUF stays in plain CPU memory
    assert re.search(r"^weights +CPU [0-9.]+ MiB \(.+\)$", done.stdout, re.MULTILINE), done.stdout
    info = sf.info(out)
    assert (info.samplerate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16")
    saved = np.load(tokens)
    assert {k: saved[k].dtype for k in saved} == {k: np.dtype(np.int64) for k in ("prompt", "generated", "codes")}
    assert saved["prompt"].shape[1] == 33 and saved["generated"].shape[1] == 33 and saved["codes"].shape[1] == 32
    assert info.frames == SAMPLES_PER_FRAME * saved["codes"].shape[0] > 0


def test_encode_voice_then_clone_it(demo_config: Path, tmp_path: Path) -> None:
    clip, voice = tmp_path / "ref.wav", tmp_path / "voice.npy"
    write_wav(clip, 0.2 * np.sin(np.arange(44100) * 0.05), 44100)
    done = run_cli("encode-voice", "--config", demo_config, clip, voice)
    assert done.returncode == 0, done.stderr
    assert np.load(voice).shape == (13, 32)
    out = tmp_path / "out.wav"
    done = run_cli(
        "synth", "--config", demo_config, "--text", "Hi.", "--output", out, "--reference", voice, "--seed", "1"
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file()


def test_encode_voice_takes_set_and_synth_writes_the_offline_decode_on_codec_tiny(
    demo_config: Path, codec_tiny_dir: Path, tmp_path: Path
) -> None:
    codec = OnnxCodec(codec_tiny_dir / "decoder.onnx", codec_tiny_dir / "encoder.onnx", provider="cpu")
    tiny = f"model.codec_dir={codec_tiny_dir}"
    clip, voice = tmp_path / "ref.wav", tmp_path / "voice.npy"
    write_wav(clip, 0.2 * np.sin(np.arange(24000) * 0.05), 24000)
    done = run_cli("encode-voice", "--config", demo_config, "--set", tiny, clip, voice)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(voice), codec.encode(load_reference_audio(clip)))
    out, tokens = tmp_path / "out.wav", tmp_path / "tokens.npz"
    args = ("--text", "Hello robot.", "--seed", "3", "--reference", voice, "--save-tokens", tokens)
    done = run_cli("synth", "--config", demo_config, "--set", tiny, "--output", out, *args)
    assert done.returncode == 0, done.stderr
    written, _ = sf.read(out, dtype="int16")
    expected = float_to_pcm16(codec.decode(np.load(tokens)["codes"]))
    np.testing.assert_allclose(written, np.frombuffer(expected, "<i2"), atol=1)  # one LSB of rounding


def test_bad_inputs_exit_2_with_one_line(demo_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    base = ("synth", "--config", demo_config, "--output", out)
    assert "text is empty" in bad_input_message(*base, "--text", "  ")
    assert "unknown config key 'llama.gpu_layers'" in bad_input_message(
        *base, "--text", "Hi", "--set", "llama.gpu_layers=3"
    )
    fake = tmp_path / "ref.wav"
    fake.write_text("plain text")
    assert "ref.wav" in bad_input_message(*base, "--text", "Hi", "--reference", fake)
    assert "config file not found" in bad_input_message(
        "synth", "--config", tmp_path / "none.yaml", "--text", "Hi", "--output", out
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("model", "sink"),
    [("demo_config", "null_sink"), ("nano_demo_config", "stereo_sink")],
    ids=["delay-24k-mono", "nano-48k-stereo"],
)
def test_synth_play_sounds_like_the_wav_it_writes(
    model: str, sink: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Played as it is made, at the model's rate and channels (Nano's stereo into a stereo sink), and written."""
    demo_config: Path = request.getfixturevalue(model)
    null_sink: NullSink = request.getfixturevalue(sink)
    out = tmp_path / "out.wav"
    play = ("--seed", "3", "--output", str(out), "--play", "--prebuffer", "60")
    with null_sink.recording(tmp_path / "sink.raw") as captured:
        # A prebuffer longer than the utterance: playback starts once it is whole, however slow synthesis is.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "moss_tts_node",
                "synth",
                "--config",
                str(demo_config),
                "--text",
                "Hello robot.",
                *play,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=null_sink.env,
        )
    assert done.returncode == 0, done.stderr
    written, rate = sf.read(out, dtype="float32", always_2d=True)
    assert (rate, written.shape[1]) == (null_sink.rate, null_sink.channels)
    assert np.abs(written).max() > 0.01  # sound, not silence: zeros played as zeros would compare as equal
    # Played whole at one offset: about 88 dB (16-bit WAV against float playback); a gap mid-way leaves
    # about 3 dB. A few lost milliseconds (a starved sound server on a loaded 2-core machine) cost 20-30 dB.
    # Interleaved, both channels at once: a channel swapped or lost costs as much.
    assert null_sink.snr_db(written.reshape(-1), captured[0]) > 15


def test_synth_play_without_a_sound_output_says_so(demo_config: Path, tmp_path: Path) -> None:
    # No sound server to reach, and no ALSA card in a container: PortAudio has no output device.
    message = bad_input_message(
        "synth", "--config", demo_config, "--text", "Hi", "--play", "--set", f"model.weights_dir={tmp_path}"
    )
    assert "sound" in message


STDIN_TEXT = "Hello there, robot. 你好！How are you?"


def synth_reading_stdin(demo_config: Path, *flags: str | Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``synth --text -`` in a child process, its standard input a pipe the test writes to as an LLM would."""
    return subprocess.Popen(
        [sys.executable, "-m", "moss_tts_node", "synth", "--config", str(demo_config), "--text", "-", *map(str, flags)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def write_slowly(process: subprocess.Popen, fragments: list[str]) -> None:
    """One write and flush per fragment, as a program printing tokens does."""
    assert process.stdin is not None
    for fragment in fragments:
        process.stdin.write(fragment.encode())
        process.stdin.flush()
        time.sleep(0.01)  # the reads see the fragments apart; nothing is asserted on time


def test_synth_text_dash_speaks_standard_input_and_the_file_holds_the_whole_stream(
    demo_config: Path, tmp_path: Path
) -> None:
    from moss_tts_node.synthesizer import Synthesizer

    out = tmp_path / "out.wav"
    child = synth_reading_stdin(demo_config, "--output", out, "--seed", "3", "--max-new-tokens", "40")
    stdout, stderr = child.communicate(STDIN_TEXT.encode(), timeout=120)  # how it is read: the test below
    assert child.returncode == 0, stderr.decode()
    assert f"wrote {out}" in stdout.decode()
    written, _ = sf.read(out, dtype="int16")
    with Synthesizer.from_config_file(demo_config, {"generation.max_new_tokens": 40}) as synth:
        chunks = [chunk.samples for chunk in synth.stream_text([STDIN_TEXT], seed=3, streaming=False)]
    expected = np.frombuffer(float_to_pcm16(np.concatenate(chunks)), "<i2")
    np.testing.assert_allclose(written, expected, atol=1)  # the same audio, one LSB of rounding


def test_standard_input_yields_what_each_read_brings_and_holds_a_split_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """synth --text -'s reader, on a pipe the test fills between reads: each read returns what was written before
    it, so every cut, one inside a character's UTF-8 included, is seen as it was made."""
    from moss_tts_node.tools.cli.main import standard_input

    encoded = STDIN_TEXT.encode()
    cjk = encoded.index("你".encode())
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reading:
        monkeypatch.setattr(sys, "stdin", reading)
        fragments = standard_input()
        os.write(write_end, encoded[:3])
        assert next(fragments) == "Hel"
        os.write(write_end, encoded[3 : cjk + 1])  # the cut inside 你's three bytes: its first is held back
        assert next(fragments) == "lo there, robot. "
        os.write(write_end, encoded[cjk + 1 :])
        os.close(write_end)  # the end of input
        assert list(fragments) == ["你好！How are you?"]


def test_synth_text_dash_refuses_empty_or_broken_standard_input(demo_config: Path, tmp_path: Path) -> None:
    for data, reason in ((b"  \n", "held nothing to speak"), (b"Hello \xff there.", "not UTF-8")):
        child = synth_reading_stdin(demo_config, "--output", tmp_path / "out.wav")
        _, stderr = child.communicate(data, timeout=120)
        assert child.returncode == 2 and reason in stderr.decode(), stderr.decode()
        assert not (tmp_path / "out.wav").exists()


def test_synth_text_dash_play_speaks_while_the_writer_is_still_writing(
    demo_config: Path, tmp_path: Path, null_sink: NullSink
) -> None:
    """The writer holds the end of its text back until the sound output has played something: a synth that
    waited for the whole text would play nothing (and the test fails on the deadline instead of hanging)."""
    recorded = tmp_path / "sink.raw"
    with null_sink.recording(recorded):
        child = synth_reading_stdin(demo_config, "--play", "--prebuffer", "0.1", "--seed", "3", env=null_sink.env)
        write_slowly(child, ["The first", " sentence", " is", " here.", " And", " so"])
        deadline = time.monotonic() + 120
        while not np.fromfile(recorded, dtype="<f4").any():  # the sink records silence until the player plays
            assert child.poll() is None and time.monotonic() < deadline, "nothing played before the text ended"
            time.sleep(0.05)
        assert child.poll() is None  # still reading: its standard input is open
        write_slowly(child, [" it", " goes"])
        _, stderr = child.communicate(b" on.", timeout=120)
    assert child.returncode == 0, stderr.decode()


def test_synth_continues_a_prefix_with_several_speakers_and_every_field(demo_config: Path, tmp_path: Path) -> None:
    """The flags of docs/continuation.md, as a user types them."""
    rng = np.random.default_rng(7)
    alice, bob, butler = tmp_path / "alice.npy", tmp_path / "bob.npy", tmp_path / "butler.npy"
    for path, frames in ((alice, 6), (bob, 9), (butler, 40)):
        np.save(path, rng.integers(0, 1024, size=(frames, 32)))
    out, tokens = tmp_path / "out.wav", tmp_path / "tokens.npz"
    fields = ("--quality", "high", "--tokens", "30", "--sound-event", "a bell", "--ambient-sound", "wind")
    done = run_cli(
        "synth", "--config", demo_config, "--text", "[S1]Hello. [S2]Hi.", "--output", out, "--save-tokens", tokens,
        "--reference", alice, "--reference", bob, "--prefix", butler, "--prefix-text", "Good evening.", *fields,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    saved = np.load(tokens)
    prompt = saved["prompt"]
    assert prompt.shape[0] > 40 and (prompt[-40:, 1] != 1024).sum() == 40  # the prefix's 40 frames close the prompt
    assert sf.info(out).frames == saved["codes"].shape[0] * SAMPLES_PER_FRAME  # only the new speech
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(demo_config.parent / "tokenizer" / "tokenizer.json"))
    text = tokenizer.decode(prompt[:, 0].tolist(), skip_special_tokens=False)
    assert "[S1]:\n<|audio_start|>" in text and "[S2]:\n<|audio_start|>" in text
    assert "- Tokens:\n30\n- Quality:\nhigh\n- Sound Event:\na bell\n- Ambient Sound:\nwind\n" in text
    assert "- Text:\nGood evening. [S1]Hello. [S2]Hi.\n" in text


def test_synth_continues_a_voice_of_the_config_by_its_name_with_its_transcript(
    demo_config: Path, tmp_path: Path
) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    np.save(voices / "butler.npy", np.random.default_rng(8).integers(0, 1024, size=(20, 32)))
    (voices / "butler.txt").write_text("Good evening, sir.", encoding="utf-8")
    tokens = tmp_path / "tokens.npz"
    done = run_cli(
        "synth", "--config", demo_config, "--set", f"voices.directories=[{voices}]", "--text", "Dinner is served.",
        "--prefix", "butler", "--output", tmp_path / "out.wav", "--save-tokens", tokens,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    prompt = np.load(tokens)["prompt"]
    codes = np.load(voices / "butler.npy")  # the prompt ends on its last frame's row: code (19 - k, k), k < 20
    assert prompt[-1, 1:].tolist() == [codes[19 - k, k] for k in range(20)] + [1024] * 12
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(demo_config.parent / "tokenizer" / "tokenizer.json"))
    text = tokenizer.decode(prompt[:, 0].tolist(), skip_special_tokens=False)
    assert "- Text:\nGood evening, sir. Dinner is served.\n" in text


def test_synth_refuses_six_references_and_a_transcript_without_a_prefix(demo_config: Path, tmp_path: Path) -> None:
    voice = tmp_path / "v.npy"
    np.save(voice, np.zeros((5, 32), dtype=np.int64))
    six = [arg for _ in range(6) for arg in ("--reference", voice)]
    args = ("synth", "--config", demo_config, "--text", "Hi.", "--output", tmp_path / "out.wav")
    assert "gives 6 voices: give 1 to 5" in bad_input_message(*args, *six)
    assert "prefix_text but no prefix" in bad_input_message(*args, "--prefix-text", "Hello.")
    assert not (tmp_path / "out.wav").exists()


def test_set_reads_yaml_but_gives_a_string_key_the_word_typed() -> None:
    """YAML reads off/no as False: a key that takes a string (flash_attn's off, Norwegian's tag no) gets the word."""
    assert parse_overrides(["llama.flash_attn=off", "generation.language=no"]) == {
        "llama.flash_attn": "off",
        "generation.language": "no",
    }
    assert parse_overrides(["llama.repack=off", "llama.n_threads=2", "voices.directories=[a, b]"]) == {
        "llama.repack": False,
        "llama.n_threads": 2,
        "voices.directories": ["a", "b"],
    }
