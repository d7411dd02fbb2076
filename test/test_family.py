"""The MossTTSDelay family: which model a checkpoint is (convert), what its weights record, the 16-codebook path
from conversion to audio (the VoiceGenerator demo), and each model's recommended sampling where the config
leaves it (docs/family.md)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import run_cli

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.config import SamplingConfig, load_config, resolved_sampling
from moss_tts_node.errors import ConfigError, RequestError, WeightsError
from moss_tts_node.llama.gguf import GgufHeadsInfo
from moss_tts_node.model.family import DELAY_FAMILY, FAMILY, MOSS_TTS, MOSS_TTSD, SOUND_EFFECT, VOICE_GENERATOR
from moss_tts_node.model.identity import RECORD_KEY, UNRECORDED, ModelIdentity
from moss_tts_node.model.layout import CONFIG_FILE, EMBEDDINGS_DIR, HEADS_DIR
from moss_tts_node.model.rates import SAMPLES_PER_FRAME
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.model.template import MOSS_TTS_TEMPLATE
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.tools.cli.doctor import diagnose
from moss_tts_node.tools.dev.demo_weights import (
    DIALOGUE_TEMPLATE,
    PROCESSING_FILE,
    demo_checkpoint,
    processing_source,
    write_checkpoint,
)
from moss_tts_node.tools.prepare.attach_heads import append_audio_heads_to_gguf
from moss_tts_node.tools.prepare.conversion import ConversionError
from moss_tts_node.tools.prepare.convert import convert_checkpoint
from moss_tts_node.tools.prepare.identify import IdentityError, identify
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape

TEXT = "Hello! I am a robot."
# What every request sampled with before the family (config.py's old defaults): MOSS-TTS's recommendation.
MOSS_TTS_SAMPLING = SamplingConfig(
    text_temperature=1.5,
    text_top_k=50,
    text_top_p=1.0,
    audio_temperature=1.7,
    audio_top_k=25,
    audio_top_p=0.8,
    audio_repetition_penalty=1.0,
)
VOICE_GENERATOR_SAMPLING = dataclasses.replace(
    MOSS_TTS_SAMPLING, audio_temperature=1.5, audio_top_k=50, audio_top_p=0.6, audio_repetition_penalty=1.1
)


# -- convert: which model, and what it records -----------------------------------------------------


def _checkpoint(directory: Path, n_vq: int, processing: str | None = None) -> Path:
    path = write_checkpoint(directory, demo_checkpoint(seed=1, hidden=64, layers=1, n_vq=n_vq))
    if processing is not None:
        (path / PROCESSING_FILE).write_text(processing)
    return path


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small checkpoint of 16 codebooks that ships no processing code."""
    return _checkpoint(tmp_path_factory.mktemp("sixteen"), 16)


def test_a_16_codebook_checkpoint_converts_with_its_model_named(sixteen: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_checkpoint(sixteen, out, "F16", model="sound-effect")
    assert sorted(p.name for p in (out / EMBEDDINGS_DIR).glob("emb_ext_*.npy"))[-1] == "emb_ext_15.npy"
    assert len(list((out / HEADS_DIR).glob("lm_head_audio_*.npy"))) == 16
    record = json.loads((out / CONFIG_FILE).read_text())[RECORD_KEY]
    assert {key: record[key] for key in ("model", "release", "n_vq", "evidence")} == {
        "model": "sound-effect",
        "release": None,
        "n_vq": 16,
        "evidence": "convert --model sound-effect",
    }
    spec = ModelSpec.load(out)
    assert (spec.n_vq, spec.identity.model, spec.identity.template) == (16, SOUND_EFFECT, MOSS_TTS_TEMPLATE)


@pytest.mark.parametrize(
    ("n_vq", "processing", "model", "message"),
    [
        (
            16,
            None,
            None,
            r"n_vq is 16, and nothing in the checkpoint tells.*--model moss-ttsd or --model voice-generator",
        ),
        (16, None, "moss-tts", r"n_vq is 16, but MOSS-TTS has 32 codebooks \(convert --model moss-tts\)"),
        (32, None, "sound-effect", r"n_vq is 32, but MOSS-SoundEffect has 16 codebooks"),
        (8, None, None, r"no model of the family has 8 codebooks: MOSS-TTS 32, MOSS-TTSD 16"),
        (
            16,
            processing_source(DIALOGUE_TEMPLATE),
            "voice-generator",
            r"--model voice-generator says MOSS-VoiceGenerator, but its processing code \(processing_moss_tts\.py\) "
            r"has a Scene field, as only MOSS-TTSD's",
        ),
        (16, "x = (\n", None, r"processing_moss_tts\.py: not Python this reader can parse"),
    ],
    ids=["untold", "moss-tts-16", "sound-effect-32", "8-codebooks", "scene-vs-option", "unreadable-processing"],
)
def test_what_the_checkpoint_contradicts_or_cannot_tell_is_refused(
    tmp_path: Path, n_vq: int, processing: str | None, model: str | None, message: str
) -> None:
    checkpoint = _checkpoint(tmp_path / "checkpoint", n_vq, processing)
    with pytest.raises(ConversionError, match=message):
        convert_checkpoint(checkpoint, tmp_path / "out", "F16", model=model)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_checkpoint_tells_its_model_where_it_can(tmp_path: Path) -> None:
    dialogue = _checkpoint(tmp_path / "dialogue", 16, processing_source(DIALOGUE_TEMPLATE))
    convert_checkpoint(dialogue, tmp_path / "out", "F16")
    identity = ModelSpec.load(tmp_path / "out").identity
    assert identity.model is MOSS_TTSD and identity.template.has_scene and "Scene field" in identity.evidence
    assert identity.template.absent_speaker == "[S{n}]: None" and identity.template.source == PROCESSING_FILE
    # Qwen3-1.7B's shape: only MOSS-VoiceGenerator has it in the family (a checkpoint that size is too big here).
    shape = Qwen3Shape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151936)
    assert identify(tmp_path, shape, 16, MOSS_TTS_TEMPLATE).model is VOICE_GENERATOR
    assert (
        identify(tmp_path, shape, 16, MOSS_TTS_TEMPLATE, "voice-generator").evidence
        == "convert --model voice-generator"
    )
    with pytest.raises(IdentityError, match=r"signs of two models .*Scene field.*Qwen3-1\.7B's shape"):
        identify(tmp_path, shape, 16, DIALOGUE_TEMPLATE)
    small = dataclasses.replace(shape, hidden=256, layers=2)
    assert identify(tmp_path, small, 32, MOSS_TTS_TEMPLATE).model is MOSS_TTS


def test_the_weights_record_is_read_back_and_a_wrong_one_refused(tmp_path: Path) -> None:
    # No record: the published MOSS-TTS-GGUF (1.0, its card not read), or weights nothing says anything of.
    assert ModelIdentity.from_config({}, 32, tmp_path).name == "MOSS-TTS (release unknown)"
    assert ModelIdentity.from_config({}, 16, tmp_path).name == UNRECORDED
    legacy = {RECORD_KEY: {"release": "1.5", "evidence": "its card"}}  # written before the family
    assert ModelIdentity.from_config(legacy, 32, tmp_path) == ModelIdentity(MOSS_TTS, "1.5", evidence="its card")
    record = ModelIdentity(VOICE_GENERATOR, evidence="convert --model voice-generator").to_record(16)
    assert ModelIdentity.from_config({RECORD_KEY: record}, 16, tmp_path).model is VOICE_GENERATOR
    for wrong, message in (
        ({**record, "n_vq": 32}, r"records 32 codebooks for MOSS-VoiceGenerator, but config\.json's n_vq is 16"),
        ({**record, "model": "moss-tts-9"}, r"unknown model 'moss-tts-9'.*newer moss_tts_node"),
        ({**record, "template": {"fields": []}}, r"template is not a prompt template that convert wrote"),
        ({**record, "release": "2.0"}, r"unknown release '2\.0'"),
    ):
        with pytest.raises(WeightsError, match=message):
            ModelIdentity.from_config({RECORD_KEY: wrong}, 16, tmp_path)


def test_the_demo_processing_module_prints_what_the_template_renders() -> None:
    """The demo checkpoints' processing code, run (it is ours), against ``PromptTemplate.user_content``: two
    writings of one template."""
    for template in (MOSS_TTS_TEMPLATE, DIALOGUE_TEMPLATE):
        module: dict[str, object] = {}
        exec(compile(processing_source(template), PROCESSING_FILE, "exec"), module)
        fields = {"text": "[S1] Hi.", "language": "en", **({"scene": "a lab"} if template.has_scene else {})}
        clips = ["clip", None, "clip"]
        assert module["user_content"](fields, clips) == template.user_content(fields, [True, False, True])
        assert module["user_content"]({"text": "Hi."}) == template.user_content({"text": "Hi."})


# -- sampling: the model's recommendation where nothing else is set ----------------------------------


def test_every_model_has_the_recommended_sampling_of_its_card() -> None:
    """The numbers of upstream's model cards (docs/family.md, "Sampling"), audio temperature / top-p / top-k /
    repetition penalty; text sampling is upstream's generate() defaults for all."""
    cards = {"moss-tts": (1.7, 0.8, 25, 1.0), "moss-ttsd": (1.1, 0.9, 50, 1.1)}
    cards |= {"voice-generator": (1.5, 0.6, 50, 1.1), "sound-effect": (1.5, 0.6, 50, 1.2)}
    for key, model in DELAY_FAMILY.items():
        s = model.sampling
        assert (s.audio_temperature, s.audio_top_p, s.audio_top_k, s.audio_repetition_penalty) == cards[key], key
        assert (s.text_temperature, s.text_top_p, s.text_top_k) == (1.5, 1.0, 50), key


def test_nano_samples_as_upstreams_runtimes_default() -> None:
    """MOSS-TTS-Nano's numbers are its runtimes' defaults (ort_cpu_runtime.py, moss_tts_nano_runtime.py: docs/nano.md,
    "Sampling"): text 1.0 / 1.0 / 50, audio 0.8 / 0.95 / 25 with a repetition penalty of 1.2."""
    s = FAMILY["nano"].sampling
    assert (s.text_temperature, s.text_top_p, s.text_top_k) == (1.0, 1.0, 50)
    assert (s.audio_temperature, s.audio_top_p, s.audio_top_k, s.audio_repetition_penalty) == (0.8, 0.95, 25, 1.2)
    assert set(FAMILY) - set(DELAY_FAMILY) == {"nano"}


def test_sampling_keys_default_to_the_models_recommendation_and_explicit_values_win() -> None:
    unset = SamplingConfig()
    assert resolved_sampling(MOSS_TTS.sampling, unset) == MOSS_TTS_SAMPLING  # today's defaults, bit for bit
    assert resolved_sampling(VOICE_GENERATOR.sampling, unset) == VOICE_GENERATOR_SAMPLING
    config = dataclasses.replace(unset, audio_top_k=40, seed=9)
    request = dataclasses.replace(unset, audio_temperature=0.0, audio_top_k=7)
    both = resolved_sampling(VOICE_GENERATOR.sampling, request, config)
    assert (both.audio_temperature, both.audio_top_k, both.audio_top_p, both.seed) == (0.0, 7, 0.6, 9)
    assert resolved_sampling(VOICE_GENERATOR.sampling, config).audio_top_k == 40


def test_a_config_takes_minus_one_and_refuses_what_lies_below_a_keys_range(demo_config: Path) -> None:
    assert load_config(demo_config, {"sampling.audio_top_p": -1}).sampling.audio_top_p == -1.0
    with pytest.raises(ConfigError, match=r"'sampling\.audio_top_p' must be >= 0\.0 \(or -1\.0 for the model's"):
        load_config(demo_config, {"sampling.audio_top_p": -0.5})
    with pytest.raises(ConfigError, match=r"'sampling\.audio_top_k' must be >= 0"):
        load_config(demo_config, {"sampling.audio_top_k": -2})


def test_moss_tts_samples_as_it_did_before_bit_for_bit(synth: Synthesizer) -> None:
    """The demo (MOSS-TTS) with every sampling key left to the model gives the audio of the old explicit defaults."""
    assert synth.config.sampling == SamplingConfig()  # the demo's config leaves sampling to the model
    explicit = dataclasses.replace(synth.config, sampling=MOSS_TTS_SAMPLING)
    left, old = synth.synthesize(TEXT, seed=4), synth.synthesize(TEXT, seed=4, config=explicit)
    np.testing.assert_array_equal(left.generated, old.generated)
    np.testing.assert_array_equal(left.audio, old.audio)


# -- the 16-codebook demo, end to end ---------------------------------------------------------------


@pytest.fixture(scope="module")
def voice_generator_config(family_demo: Callable[[str], Path]) -> Path:
    return family_demo("voice-generator")


@pytest.fixture(scope="module")
def voice_generator(voice_generator_config: Path) -> Iterator[Synthesizer]:
    with Synthesizer.from_config_file(voice_generator_config) as loaded:
        yield loaded


def test_the_voice_generator_demo_speaks_16_codebooks_decoded_with_16_quantizers(
    voice_generator: Synthesizer,
    voice_generator_config: Path,
) -> None:
    synth = voice_generator
    assert (synth.spec.n_vq, synth.spec.identity.name) == (16, "MOSS-VoiceGenerator")
    result = synth.synthesize(TEXT, seed=2, instruction="a calm, low voice")
    assert result.prompt.shape[1] == result.generated.shape[1] == 17 and result.codes.shape[1] == 16
    assert result.codes.shape[0] > 0 and result.audio.shape[0] == SAMPLES_PER_FRAME * result.codes.shape[0]
    assert result.report.model == "MOSS-VoiceGenerator"
    assert result.report.format().startswith("model              MOSS-VoiceGenerator\n")
    # The audio is the demo decoder's with n_quantizers 16, whatever fills the 16 rows it must not read.
    decoder = ort.InferenceSession(str(voice_generator_config.parent / "codec" / "decoder.onnx"))
    upper = np.random.default_rng(0).integers(0, 1024, result.codes.shape)
    graph_codes = np.concatenate([result.codes, upper], axis=1).T[:, None, :]
    audio = decoder.run(None, {"audio_codes": graph_codes, "n_quantizers": np.array(16)})[0].reshape(-1)
    np.testing.assert_allclose(result.audio, audio, atol=1e-6)


def test_the_voice_generator_samples_as_its_card_recommends(voice_generator: Synthesizer) -> None:
    synth = voice_generator
    left = synth.synthesize(TEXT, seed=3)
    theirs = synth.synthesize(TEXT, seed=3, config=dataclasses.replace(synth.config, sampling=VOICE_GENERATOR_SAMPLING))
    moss_tts = synth.synthesize(TEXT, seed=3, config=dataclasses.replace(synth.config, sampling=MOSS_TTS_SAMPLING))
    np.testing.assert_array_equal(left.generated, theirs.generated)
    assert not np.array_equal(left.generated, moss_tts.generated)


@pytest.mark.parametrize("heads", ["numpy", "gguf"])
def test_every_heads_backend_runs_the_16_codebook_model(
    voice_generator_config: Path, tmp_path: Path, heads: str
) -> None:
    """The onnx heads run above; the exact ones and the GGUF's (attach-heads appends the model's 16)."""
    weights = voice_generator_config.parent
    overrides = {"audio.heads_backend": heads}
    if heads == "gguf":
        gguf = tmp_path / "with_heads.gguf"
        append_audio_heads_to_gguf(weights / "MOSS_TTS_F16.gguf", weights / HEADS_DIR, gguf, ModelSpec.load(weights))
        assert GgufHeadsInfo(gguf).audio_heads == 16
        overrides["model.backbone_gguf"] = str(gguf)
    with Synthesizer.from_config_file(voice_generator_config, overrides) as synth:
        result = synth.synthesize(TEXT, seed=2)
    assert result.codes.shape[1] == 16 and result.codes.shape[0] > 0 and np.isfinite(result.audio).all()


def test_a_voice_for_the_16_codebook_model_has_16_codebooks(
    voice_generator: Synthesizer,
    tmp_path: Path,
) -> None:
    synth = voice_generator
    clip = tmp_path / "clip.wav"
    write_wav(clip, 0.2 * np.sin(np.arange(24000) * 0.05), 24000)
    assert synth.encode_reference(clip).shape == (13, 16)
    np.save(tmp_path / "moss_tts.npy", np.zeros((5, 32), dtype=np.int64))
    with pytest.raises(RequestError, match=r"codes of 32 codebooks, but this model has 16.*re-encode.*encode-voice"):
        synth.stream(TEXT, voice=tmp_path / "moss_tts.npy")
    with pytest.raises(RequestError, match=r"codes of 32 codebooks, but this model has 16"):
        synth.stream(TEXT, voice=np.zeros((5, 32), dtype=np.int64))


def test_a_stream_decoder_for_another_codebook_count_is_refused_naming_both(
    voice_generator_config: Path, codec_tiny_streaming_dir: Path
) -> None:
    overrides = {"model.codec_dir": str(codec_tiny_streaming_dir), "audio.onnx_provider": "cpu"}
    with pytest.raises(ConfigError, match=r"decodes codes of 32 quantizers, but this model's codes have 16.*off"):
        Synthesizer.from_config_file(voice_generator_config, overrides)


def test_a_16_quantizer_stream_decoder_streams_the_offline_decode_of_16_codebooks(
    voice_generator_config: Path, codec_tiny_dir: Path, tmp_path: Path
) -> None:
    """The VoiceGenerator demo speaking through codec-tiny with a stream decoder built for 16 quantizers: the stream
    is the whole utterance, and both are codec-tiny's own decode.onnx at n_quantizers 16 (the graph ONNX exported
    from PyTorch), whatever fills the 16 rows it must not read."""
    from moss_tts_node.codec.layout import DECODER_FILE, STREAM_DECODER_FILE
    from moss_tts_node.tools.prepare.stream_decoder_build import build_stream_decoder

    codec_dir = tmp_path / "codec"
    shutil.copytree(codec_tiny_dir, codec_dir)
    build_stream_decoder(codec_tiny_dir, codec_dir / STREAM_DECODER_FILE, quantizers=16)
    overrides = {"model.codec_dir": str(codec_dir), "audio.onnx_provider": "cpu"}
    with Synthesizer.from_config_file(voice_generator_config, overrides) as synth:
        assert synth.stages.stream_decoding is not None
        whole = synth.synthesize(TEXT, seed=5)
        stream = synth.stream(TEXT, seed=5)
        streamed = np.concatenate([chunk.samples for chunk in stream])
    assert stream.report is not None and stream.report.codec_decode == "stateful stream"
    np.testing.assert_allclose(streamed, whole.audio, atol=1e-6)
    decoder = ort.InferenceSession(str(codec_tiny_dir / DECODER_FILE))
    upper = np.random.default_rng(1).integers(0, 1024, whole.codes.shape)
    graph_codes = np.concatenate([whole.codes, upper], axis=1).T[:, None, :]
    offline = decoder.run(None, {"audio_codes": graph_codes, "n_quantizers": np.array(16)})[0].reshape(-1)
    np.testing.assert_allclose(whole.audio, offline, atol=1e-6)


def test_the_cli_speaks_with_the_voice_generator_demo(voice_generator_config: Path, tmp_path: Path) -> None:
    clip, voice, out = tmp_path / "ref.wav", tmp_path / "voice.npy", tmp_path / "out.wav"
    write_wav(clip, 0.2 * np.sin(np.arange(24000) * 0.05), 24000)
    done = run_cli("encode-voice", "--config", voice_generator_config, clip, voice)
    assert done.returncode == 0, done.stderr
    assert np.load(voice).shape == (13, 16)
    done = run_cli("synth", "--config", voice_generator_config, "--text", TEXT, "--output", out, "--profile")
    assert done.returncode == 0, done.stderr
    assert "model              MOSS-VoiceGenerator" in done.stdout and out.stat().st_size > 44


def test_doctor_names_the_model_and_the_sampling_in_effect(voice_generator_config: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    shutil.copy(voice_generator_config, config)
    text = config.read_text().replace("ros__parameters:\n", "ros__parameters:\n    sampling:\n      audio_top_k: 40\n")
    config.write_text(
        text.replace("weights_dir: .", f"weights_dir: {voice_generator_config.parent}").replace(
            "codec_dir: codec", f"codec_dir: {voice_generator_config.parent / 'codec'}"
        )
    )
    checks = {check.what: check for check in diagnose(config)}
    assert checks["model"].status == "ok"
    assert checks["model"].detail.startswith("MOSS-VoiceGenerator, 16 codebooks (convert --model voice-generator)")
    sampling = checks["sampling"].detail
    assert "audio_temperature 1.5," in sampling and "audio_top_k 40 (config)" in sampling
    assert sampling.endswith("(unmarked: as MOSS-VoiceGenerator recommends)")
