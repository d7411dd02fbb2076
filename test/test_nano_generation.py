"""MOSS-TTS-Nano's prompt and greedy frames against upstream's PyTorch (test/data/nano-tiny, its README).

The fixture is upstream's own model code on tiny random weights with sharp attention; ``convert`` takes its
checkpoint (safetensors, SentencePiece's tokenizer.model) as it would take the release, and the frame loop
(``model/nano.py``) runs the converted global transformer in llama.cpp, the local one in ONNX Runtime. Prompts must
equal upstream's rows, frames its greedy frames, in both of upstream's modes: voice clone (English, Chinese) and
continuation (text only, and after a recording with its transcript).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from qwen3_reference import exact_backbone

from moss_tts_node.model.embeddings import EmbeddingTables
from moss_tts_node.model.family import MOSS_TTS_NANO
from moss_tts_node.model.identity import RECORD_KEY
from moss_tts_node.model.layout import CONFIG_FILE, EMBEDDINGS_DIR, TOKENIZER_DIR, nano_local_gguf_name
from moss_tts_node.model.nano import NanoHeads, NanoSampler, generate_nano_frames
from moss_tts_node.model.nano_local import OnnxLocalTransformer
from moss_tts_node.model.sampling import SamplingParams
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.nano_prompt import NanoPromptBuilder
from moss_tts_node.text.prompt import PromptFields
from moss_tts_node.timing import StageClock
from moss_tts_node.tools.prepare.conversion import ConversionError
from moss_tts_node.tools.prepare.convert import convert_checkpoint

FIXTURE = Path(__file__).parent / "data" / "nano-tiny"
REFERENCE = dict(np.load(FIXTURE / "reference.npz"))
CASES = [str(case) for case in REFERENCE["cases"]]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nano-f32")
    convert_checkpoint(FIXTURE, out, "F32")
    return out


class Frames:
    """The global transformer in llama.cpp (F32, F32 KV cache), the local one in ONNX Runtime (float32), the tables
    and the heads: the generation stage's parts."""

    def __init__(self, weights: Path) -> None:
        self.spec = ModelSpec.load(weights)
        self.builder = NanoPromptBuilder(weights / TOKENIZER_DIR, self.spec)
        gguf = next(weights.glob("MOSS_TTS_NANO_F32.gguf"))
        self.global_backbone = exact_backbone(gguf)
        self.local = OnnxLocalTransformer(gguf.with_name(nano_local_gguf_name(gguf.name)), self.spec.n_vq + 1)
        self.embeddings = EmbeddingTables(
            weights / EMBEDDINGS_DIR, self.spec, self.global_backbone.n_embd, self.spec.text_vocab_size
        )
        self.heads = NanoHeads(self.embeddings, self.spec)

    def prompt(self, case: str) -> np.ndarray:
        text = str(REFERENCE[f"{case}_text"])
        codes = REFERENCE.get(f"{case}_prompt_codes")
        if case.startswith("clone"):
            return self.builder.build(PromptFields(text=text), [codes])
        if codes is not None:  # continuation after a recording: its transcript, then the text, as one string
            return self.builder.build(PromptFields(text=str(REFERENCE[f"{case}_prompt_text"]) + text), prefix=codes)
        return self.builder.build(PromptFields(text=text))

    def greedy(self, prompt: np.ndarray, penalty: float) -> np.ndarray:
        self.global_backbone.clear()
        sampling = SamplingParams(0.0, 0, 1.0, 0.0, 0, 1.0, penalty, seed=0)
        frames = generate_nano_frames(
            self.global_backbone,
            self.local,
            self.embeddings,
            self.heads,
            prompt,
            NanoSampler(sampling, self.spec),
            int(REFERENCE["max_new_frames"]),
            lambda: False,
            StageClock(),
            shared_rows=0,  # from an empty cache: nothing to reuse
        )
        return np.array(list(frames), dtype=np.int64).reshape(-1, self.spec.n_vq)

    def close(self) -> None:
        self.local.close()
        self.global_backbone.close()


@pytest.fixture(scope="module")
def frames(weights: Path) -> Frames:
    runner = Frames(weights)
    yield runner
    runner.close()


@pytest.mark.parametrize("case", CASES)
def test_prompts_are_upstreams_rows(frames: Frames, case: str) -> None:
    np.testing.assert_array_equal(frames.prompt(case), REFERENCE[f"{case}_prompt"])


@pytest.mark.parametrize("clone", [False, True])
def test_a_prompt_begins_with_its_voice_prefix_and_says_where_it_ends(frames: Frames, clone: bool) -> None:
    """The rows before the text are the backbone's first segment (``Prompt.shared_rows``): the voice prefix."""
    voice = [REFERENCE["clone_en_prompt_codes"]] if clone else []
    fields = PromptFields(text=str(REFERENCE["clone_en_text"]))
    prefix = frames.builder.voice_prefix(fields, voice)
    prompt = frames.builder.encode(fields, voice)
    assert 0 < prompt.shared_rows == prefix.shape[0] < prompt.rows.shape[0]
    np.testing.assert_array_equal(prompt.rows[: prefix.shape[0]], prefix)


@pytest.mark.parametrize("case", CASES)
def test_greedy_frames_are_upstreams(frames: Frames, case: str) -> None:
    got = frames.greedy(REFERENCE[f"{case}_prompt"], float(REFERENCE["audio_repetition_penalty"]))
    np.testing.assert_array_equal(got, REFERENCE[f"{case}_frames"])
    assert bool(REFERENCE[f"{case}_ended"])  # upstream stopped on audio end before the budget: so did we
    # The global transformer's last prompt hidden state (what the first frame starts from), as upstream's up to the
    # float16 rounding of the embedding tables (their published type): about 5e-4 on values of order 1.
    frames.global_backbone.clear()
    frames.global_backbone.prefill_prompt(REFERENCE[f"{case}_prompt"], frames.embeddings.embed, text_logits=False)
    np.testing.assert_allclose(frames.global_backbone.hidden(), REFERENCE[f"{case}_hidden0"], atol=2e-3)


def test_the_repetition_penalty_shapes_greedy_frames(frames: Frames) -> None:
    """The check can fail: without upstream's penalty the same prompt gives other frames."""
    case = CASES[0]
    assert not np.array_equal(frames.greedy(REFERENCE[f"{case}_prompt"], 1.0), REFERENCE[f"{case}_frames"])


@pytest.mark.parametrize(("backend", "spread"), [("numpy", 1e-6), ("onnx", 2e-2)])
def test_the_audio_heads_are_the_tied_tables(frames: Frames, backend: str, spread: float) -> None:
    """Each codebook's logits at a local position are its own audio table (less the pad row) times the hidden state,
    as float64 computes it: exact in float32, within the 8-bit rounding (under 2% of the logits' spread) in onnx."""
    heads = NanoHeads(frames.embeddings, frames.spec, backend)
    assert heads.name == backend and heads.n_vq == frames.spec.n_vq
    local = frames.local
    local.clear()
    local.decode(heads.slot_embedding)
    worst = []
    for codebook in range(heads.n_vq):
        local.decode(heads.code_embedding(codebook, codebook))  # a realistic hidden state
        hidden = local.hidden().copy()
        table = frames.embeddings.audio[codebook][: frames.spec.audio_vocab_size].astype(np.float64)
        expected = table @ hidden.astype(np.float64)
        got = heads.code_logits(codebook, hidden).astype(np.float64)
        worst.append(np.abs(got - expected).max() / np.ptp(expected))
    heads.close()
    assert max(worst) < spread, worst


def test_convert_records_nano_and_writes_the_published_tables(weights: Path) -> None:
    config = json.loads((weights / CONFIG_FILE).read_text())
    assert config[RECORD_KEY]["model"] == MOSS_TTS_NANO.key
    spec = ModelSpec.load(weights)
    assert spec.is_nano and spec.text_vocab_size == 600
    pad = np.load(weights / EMBEDDINGS_DIR / "emb_ext_00.npy")
    assert pad.shape == (spec.audio_rows, 32) and pad.dtype == np.float16 and not pad[-1].any()
    assert (weights / TOKENIZER_DIR / "tokenizer.json").is_file()


def test_convert_defaults_to_q8_0_for_nano(tmp_path: Path) -> None:
    gguf = convert_checkpoint(FIXTURE, tmp_path / "out")
    assert gguf.name == "MOSS_TTS_NANO_Q8_0.gguf"
    assert gguf.with_name(nano_local_gguf_name(gguf.name)).is_file()
    assert not list((tmp_path / "out").glob(".*"))  # the F16 intermediates are gone


def test_convert_refuses_what_it_cannot_convert(tmp_path: Path) -> None:
    broken = tmp_path / "checkpoint"
    shutil.copytree(FIXTURE, broken)
    with pytest.raises(ConversionError, match="--model moss-tts does not match"):
        convert_checkpoint(broken, tmp_path / "a", model="moss-tts")
    (broken / "tokenizer.model").unlink()
    with pytest.raises(ConversionError, match=r"no tokenizer\.model"):
        convert_checkpoint(broken, tmp_path / "b")
    config = json.loads((broken / CONFIG_FILE).read_text())
    config["gpt2_config"]["n_layer"] = 3
    (broken / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"missing \(transformer.h.2"):
        convert_checkpoint(broken, tmp_path / "c")
    assert not (tmp_path / "c").exists()  # refused before anything was written
