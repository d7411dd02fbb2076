"""MOSS-TTS-Nano through the Synthesizer: the whole request line on upstream's tiny model and tiny codec.

The weights are test/data/nano-tiny converted by ``convert``; the codec is test/data/nano-codec-tiny (upstream's
exported graphs). Greedy synthesis must give upstream's frames for the same text (its PyTorch reference), and audio
that is the codec's decode of exactly those frames, at 48 kHz in two channels; a stream must equal the whole; a
voice must be cloned from a clip; what Nano's prompt has no place for must be refused, on requests and at load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import run_cli

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.codec.nano import NanoOnnxCodec
from moss_tts_node.errors import CodecError, ConfigError, RequestError
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.tools.prepare.conversion import ConversionError
from moss_tts_node.tools.prepare.convert import convert_checkpoint
from moss_tts_node.tools.prepare.nano_convert import VOICES_DIR

DATA = Path(__file__).parent / "data"
CODEC = DATA / "nano-codec-tiny"
REFERENCE = dict(np.load(DATA / "nano-tiny" / "reference.npz"))


def _config(directory: Path, weights: Path, gguf: str, voices: Path | None = None, **generation: object) -> Path:
    params = {
        "model": {"weights_dir": str(weights), "backbone_gguf": gguf, "codec_dir": str(CODEC)},
        "voices": {"directories": [str(voices)] if voices else []},
        "llama": {"kv_cache_type_k": "f32", "kv_cache_type_v": "f32"},
        "audio": {"heads_backend": "numpy"},  # the exact path: upstream's frames
        "sampling": {"text_temperature": 0.0, "audio_temperature": 0.0},
        "generation": generation,
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump({"moss_tts_node": {"ros__parameters": params}}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_checkpoint(DATA / "nano-tiny", tmp_path_factory.mktemp("nano-f32"), "F32")


@pytest.fixture(scope="module")
def synth(weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesizer]:
    synthesizer = Synthesizer.from_config_file(_config(tmp_path_factory.mktemp("cfg"), weights.parent, weights.name))
    yield synthesizer
    synthesizer.close()


def test_greedy_speech_is_upstreams_frames_decoded(synth: Synthesizer) -> None:
    result = synth.synthesize(str(REFERENCE["cont_plain_text"]))
    np.testing.assert_array_equal(result.codes, REFERENCE["cont_plain_frames"])
    codec = NanoOnnxCodec(CODEC, provider="cpu", threads=1, encoder=False)
    expected = codec.decode(REFERENCE["cont_plain_frames"])
    assert result.sample_rate == 48000 and result.audio.shape == expected.shape
    assert result.audio.shape == (len(REFERENCE["cont_plain_frames"]) * 3840, 2)
    np.testing.assert_allclose(result.audio, expected, atol=1e-5)


def test_a_stream_is_the_whole_utterance(synth: Synthesizer) -> None:
    text = str(REFERENCE["clone_en_text"])
    whole = synth.synthesize(text).audio
    chunks = list(synth.stream(text))
    assert len(chunks) > 1 and chunks[-1].is_final
    np.testing.assert_allclose(np.concatenate([chunk.samples for chunk in chunks]), whole, atol=1e-6)


def test_a_voice_is_cloned_from_a_clip(synth: Synthesizer, tmp_path: Path) -> None:
    clip = tmp_path / "voice.wav"
    seconds = 0.5
    t = np.arange(int(48000 * seconds)) / 48000
    write_wav(clip, 0.3 * np.sin(2 * np.pi * 220 * t), 48000)
    codes = synth.encode_reference(clip)
    assert codes.shape == (round(seconds * 12.5), 16)
    result = synth.synthesize("Hello there.", voice=str(clip))
    slots = result.prompt[:, 0] == synth.spec.audio_user_slot_token_id
    np.testing.assert_array_equal(result.prompt[slots, 1:], codes)  # the clip's frames, one user-slot row each


@pytest.mark.parametrize(
    ("field", "value"), [("language", "en"), ("instruction", "calm"), ("quality", "studio"), ("tokens", 50)]
)
def test_fields_nano_has_no_place_for_are_refused(synth: Synthesizer, field: str, value: object) -> None:
    with pytest.raises(RequestError, match=f"MOSS-TTS-Nano's prompt has no {field} field"):
        synth.stream("Hello.", **{field: value})


def test_a_config_default_nano_refuses_fails_at_load(weights: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'generation\.language' is 'en'.*leave generation\.language empty"):
        Synthesizer.from_config_file(_config(tmp_path, weights.parent, weights.name, language="en"))


def test_the_heads_backend_gguf_is_refused_at_load_and_auto_is_8_bit(weights: Path, tmp_path: Path) -> None:
    """Nano's audio heads are its tables, not a GGUF output matrix: ``gguf`` is refused with the choices that work;
    ``auto`` takes the 8-bit onnx heads, which still speak (their frames are not upstream's float ones)."""
    config = _config(tmp_path, weights.parent, weights.name)
    with pytest.raises(ConfigError, match=r"'gguf' does not apply to MOSS-TTS-Nano.*auto, onnx \(8-bit\) or numpy"):
        Synthesizer.from_config_file(config, {"audio.heads_backend": "gguf"})
    with Synthesizer.from_config_file(config, {"audio.heads_backend": "auto"}) as synth:
        with synth.stages.generation() as stage:
            assert stage.heads.name == "onnx"
        result = synth.synthesize(str(REFERENCE["cont_plain_text"]))
    assert result.codes.shape[0] > 0 and result.audio.shape == (result.codes.shape[0] * 3840, 2)


def test_demo_weights_for_nano_speak_through_the_cli(tmp_path: Path) -> None:
    """``demo-weights --model nano`` (upstream's release layout, converted) then ``synth``: a 48 kHz stereo WAV;
    ``encode-voice`` and ``synth --reference`` clone a voice."""
    made = run_cli("demo-weights", tmp_path / "demo", "--model", "nano")
    assert made.returncode == 0, made.stderr
    out = tmp_path / "hello.wav"
    said = run_cli(
        "synth", "--config", tmp_path / "demo" / "config.yaml", "--text", "Hello there, robot.", "--out", out
    )
    assert said.returncode == 0, said.stderr
    audio, rate = sf.read(out)
    assert rate == 48000 and audio.ndim == 2 and audio.shape[1] == 2 and audio.shape[0] % 3840 == 0
    # A voice from a 24 kHz mono clip (converted to the codec's 48 kHz stereo), encoded once, then cloned.
    clip, codes = tmp_path / "voice.wav", tmp_path / "voice.npy"
    write_wav(clip, 0.3 * np.sin(2 * np.pi * 200 * np.arange(24000) / 24000), 24000)
    encoded = run_cli("encode-voice", "--config", tmp_path / "demo" / "config.yaml", clip, codes)
    assert encoded.returncode == 0, encoded.stderr
    assert np.load(codes).shape == (12, 16)  # 1 s at 12.5 frames a second, the partial frame dropped
    config = tmp_path / "demo" / "config.yaml"
    cloned = run_cli("synth", "--config", config, "--text", "Hi.", "--reference", codes, "--out", tmp_path / "v.wav")
    assert cloned.returncode == 0, cloned.stderr


def test_builtin_voices_convert_and_speak_by_name(tmp_path: Path) -> None:
    """Upstream's built-in voices (the ONNX release's manifest) become voices of the library, usable by name."""
    codes = REFERENCE["clone_en_prompt_codes"]
    manifest = tmp_path / "browser_poc_manifest.json"
    voices = [
        {"voice": "Junhao", "prompt_audio_codes": codes.tolist()},
        {"voice": "Ava", "prompt_audio_codes": [[7] * 16]},
    ]
    manifest.write_text(json.dumps({"builtin_voices": voices}), encoding="utf-8")
    gguf = convert_checkpoint(DATA / "nano-tiny", tmp_path / "weights", "F32", builtin_voices=tmp_path)
    config = _config(tmp_path, gguf.parent, gguf.name, voices=gguf.parent / VOICES_DIR)
    with Synthesizer.from_config_file(config) as synth:
        assert synth.voices.names == ["Ava", "Junhao"]
        result = synth.synthesize("Hello there.", voice=synth.voices["Junhao"])  # what a name resolves to
    slots = result.prompt[:, 0] == synth.spec.audio_user_slot_token_id  # one row per frame of the voice
    np.testing.assert_array_equal(result.prompt[slots, 1:], codes)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"voice": "../evil", "prompt_audio_codes": [[0] * 16]}, "not a name this converter writes"),
        ({"voice": "short", "prompt_audio_codes": [[0] * 15]}, "frames of 16 codes"),
        ({"voice": "big", "prompt_audio_codes": [[1024] * 16]}, "not below 1024"),
    ],
)
def test_builtin_voices_are_checked_before_anything_is_written(tmp_path: Path, entry: dict, problem: str) -> None:
    (tmp_path / "browser_poc_manifest.json").write_text(json.dumps({"builtin_voices": [entry]}), encoding="utf-8")
    with pytest.raises(ConversionError, match=problem):
        convert_checkpoint(DATA / "nano-tiny", tmp_path / "weights", "F32", builtin_voices=tmp_path)
    assert not (tmp_path / "weights").exists()


def test_weights_and_a_codec_of_another_rate_are_refused_at_load(
    weights: Path, tmp_path: Path, demo_codec: tuple[Path, Path]
) -> None:
    """Nano's weights with MOSS-Audio-Tokenizer (24 kHz mono, which would decode 16 codebooks) are refused at load,
    not spoken wrong."""
    config = _config(tmp_path, weights.parent, weights.name)
    with pytest.raises(CodecError, match="is a 24000 Hz codec, but these weights speak at 48000 Hz"):
        Synthesizer.from_config_file(config, {"model.codec_dir": str(demo_codec[1].parent)})
