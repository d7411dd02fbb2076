"""The audio heads backends and the text-head skip, against plain float64 NumPy references."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import small_spec
from qwen3_reference import exact_backbone

from moss_tts_node.errors import BridgeError, WeightsError
from moss_tts_node.llama.backbone import Backbone
from moss_tts_node.llama.gguf import GgufHeadsInfo
from moss_tts_node.model.delay import TextRule
from moss_tts_node.model.generation import step_logits
from moss_tts_node.model.heads import NumpyAudioHeads, OnnxAudioHeads, load_audio_heads
from moss_tts_node.model.layout import HEADS_DIR, audio_head_file
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.tools.prepare.attach_heads import append_audio_heads_to_gguf
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, random_qwen3_tensors, write_qwen3_gguf

SHAPE = Qwen3Shape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=128, vocab=300)
SPEC = small_spec(290)
GEN, DELAY = SPEC.audio_assistant_gen_slot_token_id, SPEC.audio_assistant_delay_slot_token_id
AUDIO_RULE = TextRule(allowed=(GEN, DELAY), banned=(SPEC.im_end_token_id,))
ALL = np.ones(SPEC.n_vq, dtype=bool)


@dataclass(frozen=True)
class HeadsModel:
    """A tiny F32 backbone, its float16 heads, and the same GGUF with the heads appended."""

    root: Path
    plain: Path  # the backbone GGUF
    carrying: Path  # the backbone GGUF with the audio heads in its output matrix
    heads: np.ndarray  # (n_vq, audio_rows, hidden) float16, as written to heads_dir

    @property
    def heads_dir(self) -> Path:
        return self.root / HEADS_DIR


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> HeadsModel:
    root = tmp_path_factory.mktemp("heads")
    plain = root / "plain.gguf"
    write_qwen3_gguf(plain, SHAPE, random_qwen3_tensors(SHAPE, seed=3).items())
    rng = np.random.default_rng(4)
    heads = rng.standard_normal((SPEC.n_vq, SPEC.audio_rows, SHAPE.hidden)) / np.sqrt(SHAPE.hidden)
    model = HeadsModel(root, plain, root / "with_heads.gguf", heads.astype(np.float16))
    model.heads_dir.mkdir()
    for k in range(SPEC.n_vq):
        np.save(model.heads_dir / audio_head_file(k), model.heads[k])
    append_audio_heads_to_gguf(plain, model.heads_dir, model.carrying, SPEC)
    return model


@pytest.fixture(scope="module")
def plain_backbone(model: HeadsModel) -> Iterator[Backbone]:
    with exact_backbone(model.plain) as backbone:
        yield backbone


def _decode_some(backbone: Backbone, text_logits: bool = True, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    backbone.clear()
    backbone.prefill(rng.standard_normal((5, SHAPE.hidden)).astype(np.float32))
    backbone.decode(rng.standard_normal(SHAPE.hidden).astype(np.float32), text_logits=text_logits)
    return backbone.hidden().copy()


def _reference(heads: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    return np.einsum("crh,h->cr", heads.astype(np.float64), hidden.astype(np.float64))


def test_numpy_heads_are_exact_and_compute_only_the_sampled_span(model: HeadsModel, plain_backbone: Backbone) -> None:
    hidden = _decode_some(plain_backbone)
    reference = _reference(model.heads, hidden)
    heads = NumpyAudioHeads(model.heads_dir, SPEC, SHAPE.hidden)
    np.testing.assert_allclose(
        step_logits(plain_backbone, heads, TextRule(forced=GEN), ALL).audio, reference, atol=1e-5
    )
    for channels in (np.arange(SPEC.n_vq) < 3, np.arange(SPEC.n_vq) >= 29):
        heads._logits[:] = np.nan
        audio = step_logits(plain_backbone, heads, TextRule(forced=DELAY), channels).audio
        np.testing.assert_allclose(audio[channels], reference[channels], atol=1e-5)
        assert np.isnan(audio[~channels]).all()  # the others were not computed


def test_onnx_heads_match_within_8_bit_rounding(model: HeadsModel, plain_backbone: Backbone) -> None:
    hidden = _decode_some(plain_backbone, seed=1)
    reference = _reference(model.heads, hidden)
    heads = OnnxAudioHeads(model.heads_dir, SPEC, SHAPE.hidden, threads=2)
    audio = step_logits(plain_backbone, heads, TextRule(forced=GEN), ALL).audio
    error = np.abs(audio - reference) / reference.std()  # 8-bit weights and activations, blocks of 32
    assert error.max() < 0.05 and error.mean() < 0.01
    top = np.argsort(-reference, axis=1)[:, :5]
    assert np.mean(np.argmax(audio, axis=1) == top[:, 0]) > 0.9


def test_gguf_heads_come_out_of_llama_cpp(model: HeadsModel, plain_backbone: Backbone) -> None:
    info = GgufHeadsInfo(model.carrying)
    assert (info.audio_heads, info.text_vocab) == (SPEC.n_vq, SHAPE.vocab)
    with exact_backbone(model.carrying) as backbone:
        assert backbone.n_vocab == SHAPE.vocab + SPEC.n_vq * SPEC.audio_rows
        hidden = _decode_some(backbone, seed=2)
        heads = load_audio_heads("gguf", model.heads_dir, SPEC, SHAPE.hidden, model.carrying)
        assert heads.name == "gguf" and heads.text_vocab == SHAPE.vocab
        assert heads.wants_text_head(AUDIO_RULE)
        step = step_logits(backbone, heads, TextRule(), ALL)
        np.testing.assert_allclose(step.audio, _reference(model.heads, hidden), atol=1e-4)
        assert step.text is not None and step.text.shape == (SHAPE.vocab,) and step.text_ids is None
    # the text logits are the plain model's, bit for bit: the appended rows change nothing before them
    _decode_some(plain_backbone, seed=2)
    np.testing.assert_array_equal(step.text, plain_backbone.text_logits())


def test_text_head_skip_keeps_the_hidden_state_and_refuses_the_text_logits(plain_backbone: Backbone) -> None:
    with_head = _decode_some(plain_backbone, text_logits=True, seed=5)
    without = _decode_some(plain_backbone, text_logits=False, seed=5)
    np.testing.assert_array_equal(with_head, without)
    with pytest.raises(BridgeError, match="text head was switched off"):
        plain_backbone.text_logits()
    _decode_some(plain_backbone, text_logits=True, seed=5)
    assert plain_backbone.text_logits().shape == (SHAPE.vocab,)


def test_audio_phase_text_logits_from_the_gguf_rows_match_llama_cpp(
    model: HeadsModel, plain_backbone: Backbone
) -> None:
    heads = load_audio_heads("numpy", model.heads_dir, SPEC, SHAPE.hidden, model.plain)
    assert heads.text_ids == (GEN, DELAY)
    _decode_some(plain_backbone, seed=6)
    full = plain_backbone.text_logits().copy()
    step = step_logits(plain_backbone, heads, AUDIO_RULE, ALL)
    assert step.text_ids == (GEN, DELAY)
    np.testing.assert_allclose(step.text, full[[GEN, DELAY]], atol=1e-4)


def test_which_steps_need_llama_cpps_text_head(model: HeadsModel) -> None:
    heads = load_audio_heads("onnx", model.heads_dir, SPEC, SHAPE.hidden, model.plain)
    assert not heads.wants_text_head(TextRule(forced=DELAY))
    assert not heads.wants_text_head(AUDIO_RULE)
    assert not heads.wants_text_head(TextRule(allowed=(GEN, DELAY), banned=(DELAY,)))
    assert heads.wants_text_head(TextRule(banned=(SPEC.pad_token_id,)))  # the whole vocabulary
    assert heads.wants_text_head(TextRule(allowed=(GEN, SPEC.im_end_token_id)))


def test_auto_takes_the_gguf_heads_only_with_layers_on_a_gpu(
    model: HeadsModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moss_tts_node.model.heads as weights

    def auto(path: Path, gpu_layers: int) -> str:
        return load_audio_heads("auto", model.heads_dir, SPEC, SHAPE.hidden, path, n_gpu_layers=gpu_layers).name

    assert auto(model.carrying, -1) == ("gguf" if weights.llama_supports_gpu_offload() else "onnx")
    monkeypatch.setattr(weights, "llama_supports_gpu_offload", lambda: True)
    assert auto(model.carrying, -1) == "gguf"
    assert auto(model.carrying, 0) == "onnx"
    assert auto(model.plain, -1) == "onnx"


def test_gguf_backend_needs_a_gguf_that_carries_the_heads(model: HeadsModel) -> None:
    with pytest.raises(WeightsError, match="does not"):
        load_audio_heads("gguf", model.heads_dir, SPEC, SHAPE.hidden, model.plain)
    assert load_audio_heads("auto", model.heads_dir, SPEC, SHAPE.hidden, model.plain).name == "onnx"
    with pytest.raises(WeightsError, match="already carries"):
        append_audio_heads_to_gguf(model.carrying, model.heads_dir, model.root / "x.gguf", SPEC)


def test_one_row_embedding_equals_the_batched_path(synth: Synthesizer) -> None:
    with synth.stages.generation() as stage:
        embeddings = stage.embeddings
    rng = np.random.default_rng(0)
    rows = np.concatenate(
        [rng.integers(0, 200, (3, 1)), rng.integers(0, 1025, (3, embeddings.spec.n_vq))], axis=1
    ).astype(np.int64)
    batched = embeddings.embed(rows)
    for i in range(3):
        np.testing.assert_allclose(embeddings.embed(rows[i : i + 1])[0], batched[i], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def carrying_demo_gguf(demo_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo backbone with the audio heads appended (what attach-heads writes)."""
    from moss_tts_node.config import load_config

    weights = demo_config.parent
    source = weights / load_config(demo_config).model.backbone_gguf
    target = tmp_path_factory.mktemp("carrying") / "heads.gguf"
    append_audio_heads_to_gguf(source, weights / "lm_heads", target, ModelSpec.load(weights))
    return target


@pytest.mark.parametrize("backend", ["numpy", "onnx", "gguf"])
def test_synthesis_runs_on_each_heads_backend(demo_config: Path, carrying_demo_gguf: Path, backend: str) -> None:
    overrides: dict[str, object] = {"audio.heads_backend": backend}
    if backend == "gguf":
        overrides["model.backbone_gguf"] = str(carrying_demo_gguf)
    with Synthesizer.from_config_file(demo_config, overrides) as synth:
        with synth.stages.generation() as stage:
            assert stage.heads.name == backend
        result = synth.synthesize("Hello! I am a robot.", seed=3, max_new_tokens=60)
        assert result.codes.shape[0] > 0 and np.isfinite(result.audio).all()


@pytest.mark.parametrize("backend", ["numpy", "onnx"])
def test_a_gguf_carrying_the_heads_speaks_the_same_on_the_other_backends(
    demo_config: Path, carrying_demo_gguf: Path, backend: str
) -> None:
    """A Jetson config (carrying GGUF) on a CPU-only build: auto picks onnx, and the text logits must not
    include the appended audio rows."""
    results = []
    for gguf in (None, str(carrying_demo_gguf)):
        overrides: dict[str, object] = {"audio.heads_backend": backend}
        if gguf:
            overrides["model.backbone_gguf"] = gguf
        with Synthesizer.from_config_file(demo_config, overrides) as synth:
            results.append(synth.synthesize("Hello! I am a robot.", seed=5, max_new_tokens=80))
    plain, carrying = results
    np.testing.assert_array_equal(carrying.generated, plain.generated)


def test_fast_audio_sampling_draws_what_the_general_path_draws() -> None:
    """Top-k on the float32 logits, scaling only the candidates: the same codes as scaling everything."""
    from moss_tts_node.model.family import MOSS_TTS
    from moss_tts_node.model.sampling import Sampler, SamplingParams, sample_rows

    spec = ModelSpec()
    prompt = np.full((4, spec.channels), spec.audio_pad_code, dtype=np.int64)
    config = SamplingParams(**asdict(MOSS_TTS.sampling), seed=11)
    fast = Sampler(config, spec, prompt)
    general = np.random.default_rng(11)
    rng = np.random.default_rng(0)
    for step in range(20):
        logits = (3 * rng.standard_normal((spec.n_vq, spec.audio_rows))).astype(np.float32)
        channels = np.arange(spec.n_vq) <= step + 10
        codes = fast.sample_audio(logits, channels)
        scaled = logits[channels].astype(np.float64) / config.audio_temperature
        scaled[:, spec.audio_pad_code] = -np.inf
        expected = sample_rows(scaled, config.audio_top_k, config.audio_top_p, general)
        np.testing.assert_array_equal(codes[channels], expected)
        assert (codes[~channels] == spec.audio_pad_code).all()


def test_attach_heads_command_writes_the_carrying_gguf_and_refuses_what_it_cannot_do(
    model: HeadsModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from moss_tts_node.tools.cli.main import main

    weights = tmp_path / "weights"
    weights.mkdir()
    assert main(["attach-heads", str(weights)]) == 2
    assert "lm_heads not found" in capsys.readouterr().err
    (weights / HEADS_DIR).symlink_to(model.heads_dir)
    (weights / "model.gguf").write_bytes(model.plain.read_bytes())
    (weights / "config.json").write_text(json.dumps(SPEC.to_json()), encoding="utf-8")

    assert main(["attach-heads", str(weights)]) == 0
    target = weights / "model_audio_heads.gguf"
    assert "model.backbone_gguf: model_audio_heads.gguf" in capsys.readouterr().out
    assert target.read_bytes() == model.carrying.read_bytes()

    assert main(["attach-heads", str(weights)]) == 2  # the only plain GGUF's target exists now
    assert "pass --force" in capsys.readouterr().err
    assert main(["attach-heads", str(weights), "--gguf", target.name, "--output", "x.gguf"]) == 2
    assert "already carries" in capsys.readouterr().err
    (weights / "other.gguf").write_bytes(model.plain.read_bytes())
    assert main(["attach-heads", str(weights)]) == 2
    assert "2 GGUF files without the audio heads (model.gguf, other.gguf)" in capsys.readouterr().err
    assert main(["attach-heads", str(weights), "--gguf", "other.gguf", "--output", "other.gguf"]) == 2
    assert "is the source GGUF itself" in capsys.readouterr().err
