"""``convert``: an original-format (bfloat16, sharded) checkpoint into the published weights layout.

The checkpoint is the demo's (``demo_checkpoint``) written the way Hugging Face writes one; everything
converted is compared with what the checkpoint itself holds: the tables bit for bit, the backbone
through llama.cpp against the float64 NumPy Qwen3 of ``qwen3_reference`` run on the checkpoint's own
tensors.
"""

from __future__ import annotations

import io
import json
import shutil
from collections import namedtuple
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from qwen3_reference import exact_backbone, qwen3_forward

from moss_tts_node.errors import BridgeError
from moss_tts_node.model.layout import gguf_name
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.tools.cli.main import main
from moss_tts_node.tools.dev.demo_weights import DemoCheckpoint, demo_checkpoint, write_checkpoint
from moss_tts_node.tools.prepare import conversion
from moss_tts_node.tools.prepare.conversion import ConversionError, quantize_gguf
from moss_tts_node.tools.prepare.convert import (
    checkpoint_tensor_name,
    convert_checkpoint,
    estimate_output_bytes,
    read_checkpoint_config,
    table_files,
)
from moss_tts_node.tools.prepare.identify import release_from_model_card
from moss_tts_node.tools.prepare.qwen3_gguf import qwen3_tensor_shapes
from moss_tts_node.tools.prepare.safetensors_io import (
    SafetensorsCheckpoint,
    SafetensorsError,
    bfloat16_to_float32,
    float32_to_bfloat16,
    write_safetensors,
)

PREFILL, STEPS = 12, 2
LLAMA_FTYPE = {"Q8_0": 7, "Q4_K_M": 15}  # general.file_type written by llama_model_quantize


@pytest.fixture(scope="module")
def source() -> DemoCheckpoint:
    return demo_checkpoint(seed=3)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory, source: DemoCheckpoint) -> Path:
    """bfloat16 in two shards plus the index, as the published checkpoint is stored."""
    return write_checkpoint(tmp_path_factory.mktemp("checkpoint"), source)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> Callable[[str], Path]:
    """Output directory of the checkpoint converted to a type, converted once per module."""
    done: dict[str, Path] = {}

    def get(gguf_type: str) -> Path:
        if gguf_type not in done:
            out = tmp_path_factory.mktemp(gguf_type)
            convert_checkpoint(checkpoint_dir, out, gguf_type)
            done[gguf_type] = out
        return done[gguf_type]

    return get


@pytest.fixture(scope="module")
def reference(checkpoint_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input rows, hidden states, text logits) of the float64 forward over the checkpoint's tensors."""
    config = read_checkpoint_config(checkpoint_dir)
    reader = SafetensorsCheckpoint(checkpoint_dir)
    tensors = {name: reader.read(checkpoint_tensor_name(name)) for name in qwen3_tensor_shapes(config.shape)}
    rows = np.random.default_rng(1).standard_normal((PREFILL + STEPS, config.shape.hidden)).astype(np.float32)
    hidden, logits = qwen3_forward(tensors, config.shape, rows)
    return rows, hidden, logits


def _run_backbone(gguf_path: Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states and text logits of the last prefill row and of each decoded row."""
    hidden, logits = [], []
    with exact_backbone(gguf_path) as backbone:
        backbone.prefill(rows[:PREFILL])
        hidden.append(backbone.hidden().copy())
        logits.append(backbone.text_logits().copy())
        for row in rows[PREFILL:]:
            backbone.decode(row)
            hidden.append(backbone.hidden().copy())
            logits.append(backbone.text_logits().copy())
    return np.array(hidden), np.array(logits)


# ---- bfloat16 and the safetensors reader ------------------------------------------------------------


def test_bfloat16_rounds_to_nearest_even_and_widens_exactly() -> None:
    values = np.array([1.0, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, np.inf, np.nan, 3.0e38], dtype=np.float32)
    words = float32_to_bfloat16(values)
    # 1 + 2^-8 is halfway between 0x3F80 and 0x3F81: ties go to the even word; 1 + 3 * 2^-8 rounds up to 0x3F82
    assert words.tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F80, 0x7FC0, 0x7F62]
    every = np.arange(1 << 16, dtype=np.uint16)
    widened = bfloat16_to_float32(every)
    finite = np.isfinite(widened)
    assert np.array_equal(float32_to_bfloat16(widened[finite]), every[finite])  # widening is exact


def test_reader_reads_what_the_safetensors_package_writes(tmp_path: Path) -> None:
    numpy_api = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    arrays = {
        "a": rng.standard_normal((3, 5)).astype(np.float16),
        "b": rng.standard_normal(7).astype(np.float32),
        "c": rng.standard_normal((2, 2, 2)).astype(np.float32),
    }
    numpy_api.save_file(arrays, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    reader = SafetensorsCheckpoint(tmp_path)
    assert {n: (i.dtype, i.shape) for n, i in reader.tensors.items()} == {
        "a": ("F16", (3, 5)),
        "b": ("F32", (7,)),
        "c": ("F32", (2, 2, 2)),
    }
    for name, array in arrays.items():
        assert np.array_equal(reader.read(name, array.dtype), array)


def test_safetensors_package_reads_what_we_write(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    arrays = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.ones(5, dtype=np.float32)}
    for dtype in ("F32", "F16", "BF16"):
        path = tmp_path / dtype / "model.safetensors"
        path.parent.mkdir()
        write_safetensors(path, arrays, dtype)
        with safetensors.safe_open(str(path), framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}
            for name, array in arrays.items():
                assert (f.get_slice(name).get_dtype(), f.get_slice(name).get_shape()) == (dtype, list(array.shape))
                if dtype != "BF16":  # the package's NumPy mode has no bfloat16
                    assert np.array_equal(f.get_tensor(name), array)
        reader = SafetensorsCheckpoint(path.parent)  # small integers: exact in every dtype
        assert all(np.array_equal(reader.read(name), array) for name, array in arrays.items())


# ---- what the conversion produces -------------------------------------------------------------------


def test_output_has_the_published_layout(converted: Callable[[str], Path], source: DemoCheckpoint) -> None:
    out = converted("F16")
    spec = ModelSpec.load(out)
    expected = {gguf_name("F16"), "config.json", "tokenizer/tokenizer.json", *table_files(spec)}
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == expected
    assert len([n for n in expected if n.startswith("embeddings/")]) == 33
    assert len([n for n in expected if n.startswith("lm_heads/")]) == 33
    assert spec.to_json() == {k: source.config[k] for k in spec.to_json()}
    assert json.loads((out / "config.json").read_text())["language_config"] == source.config["language_config"]


def test_tables_are_the_checkpoint_rounded_to_float16(converted: Callable[[str], Path], source: DemoCheckpoint) -> None:
    out = converted("F16")
    tables = table_files(ModelSpec.load(out))
    # the published names, spelled out: lm_heads.0 is the text head, so audio head k is lm_heads.(k + 1)
    assert tables["lm_heads/lm_head_audio_00.npy"] == "lm_heads.1.weight"
    assert tables["lm_heads/lm_head_audio_31.npy"] == "lm_heads.32.weight"
    assert tables["embeddings/emb_ext_31.npy"] == "emb_ext.31.weight"
    assert tables["lm_heads/lm_head_text.npy"] == "lm_heads.0.weight"
    for relative, name in tables.items():
        table = np.load(out / relative)
        expected = bfloat16_to_float32(float32_to_bfloat16(source.tensors[name])).astype(np.float16)
        assert table.dtype == np.float16, relative
        assert np.array_equal(table, expected), relative


def test_bfloat16_source_is_widened_not_reinterpreted(checkpoint_dir: Path, source: DemoCheckpoint) -> None:
    reader = SafetensorsCheckpoint(checkpoint_dir)
    assert {info.dtype for info in reader.tensors.values()} == {"BF16"}
    for name in ("emb_ext.7.weight", "language_model.layers.1.mlp.down_proj.weight"):
        original = source.tensors[name]
        np.testing.assert_allclose(reader.read(name), original, rtol=2**-8, atol=0)  # bf16: 8 significant bits


def test_f32_backbone_matches_the_reference(
    converted: Callable[[str], Path], reference: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> None:
    # F32 weights hold the bf16-widened values exactly: only float32 arithmetic differs (measured ~5e-7)
    rows, hidden_ref, logits_ref = reference
    hidden, logits = _run_backbone(converted("F32") / gguf_name("F32"), rows)
    np.testing.assert_allclose(hidden, hidden_ref[PREFILL - 1 :], rtol=0, atol=1e-4)
    np.testing.assert_allclose(logits, logits_ref[PREFILL - 1 :], rtol=0, atol=1e-4)


def test_f16_backbone_matches_the_reference(
    converted: Callable[[str], Path], reference: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> None:
    # The weights are still exact (bf16's 8-bit significand fits float16's 11 bits), but llama.cpp rounds the
    # activations to float16 for F16 matmuls: ~2^-11 relative on O(1) hidden states, measured 5e-4 max.
    rows, hidden_ref, logits_ref = reference
    hidden, logits = _run_backbone(converted("F16") / gguf_name("F16"), rows)
    np.testing.assert_allclose(hidden, hidden_ref[PREFILL - 1 :], rtol=0, atol=5e-3)
    np.testing.assert_allclose(logits, logits_ref[PREFILL - 1 :], rtol=0, atol=1e-2)


@pytest.mark.parametrize(("gguf_type", "min_correlation"), [("Q8_0", 0.999), ("Q4_K_M", 0.99)])
def test_quantized_backbone_loads_and_tracks_the_reference(
    converted: Callable[[str], Path],
    reference: tuple[np.ndarray, np.ndarray, np.ndarray],
    gguf_type: str,
    min_correlation: float,
) -> None:
    # random weights are quantization's worst case; measured correlations: Q8_0 0.99997, Q4_K_M 0.998
    out = converted(gguf_type)
    path = out / gguf_name(gguf_type)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [path.name, "config.json", "embeddings", "lm_heads", "tokenizer"]
    )
    assert gguf.GGUFReader(path).fields["general.file_type"].parts[-1][0] == LLAMA_FTYPE[gguf_type]
    rows, hidden_ref, _ = reference
    hidden, _ = _run_backbone(path, rows)
    for actual, expected in zip(hidden, hidden_ref[PREFILL - 1 :], strict=True):
        assert np.corrcoef(actual, expected)[0, 1] > min_correlation


@pytest.mark.parametrize("dtype", ["F16", "F32"])
def test_float16_and_float32_checkpoints_convert(tmp_path: Path, source: DemoCheckpoint, dtype: str) -> None:
    numpy_api = pytest.importorskip("safetensors.numpy")
    directory = tmp_path / "checkpoint"
    write_checkpoint(directory, source, shards=1)
    stored = {n: t.astype(np.float16 if dtype == "F16" else np.float32) for n, t in source.tensors.items()}
    numpy_api.save_file(stored, str(directory / "model.safetensors"))  # the package's own writer
    convert_checkpoint(directory, tmp_path / "out", "F16")
    for relative, name in table_files(ModelSpec.load(tmp_path / "out")).items():
        assert np.array_equal(np.load(tmp_path / "out" / relative), stored[name].astype(np.float16)), relative


def test_estimated_size_is_close_to_the_written_size(converted: Callable[[str], Path], checkpoint_dir: Path) -> None:
    config = read_checkpoint_config(checkpoint_dir)
    for gguf_type in ("F16", "Q8_0"):
        out = converted(gguf_type)
        written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        tokenizer = (out / "tokenizer" / "tokenizer.json").stat().st_size
        final, peak = estimate_output_bytes(config, gguf_type, tokenizer)
        assert written <= final < written * 1.15, gguf_type  # the metadata allowance dominates a tiny model
        assert peak > final if gguf_type == "Q8_0" else peak == final


def test_command_line(checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(checkpoint_dir), str(tmp_path / "out"), "--quantize", "F16"]) == 0
    assert "model.backbone_gguf: MOSS_TTS_F16.gguf" in capsys.readouterr().out
    assert main(["convert", str(checkpoint_dir), str(tmp_path / "out"), "--quantize", "F16"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "--force" in error and error.count("\n") == 1
    assert main(["convert", str(checkpoint_dir), str(tmp_path / "out"), "--quantize", "F16", "--force"]) == 0


# ---- refusals ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small() -> DemoCheckpoint:
    """A smaller model for the refusal tests: hidden 64 (too narrow for K-quants), one layer."""
    return demo_checkpoint(seed=1, hidden=64, layers=1)


def _variant(
    directory: Path, base: DemoCheckpoint, tensors: dict[str, np.ndarray] | None = None, **config: object
) -> Path:
    checkpoint = DemoCheckpoint({**base.config, **config}, tensors or base.tensors, base.tokenizer)
    return write_checkpoint(directory / "checkpoint", checkpoint, shards=1)


def _refused(checkpoint: Path, out: Path, match: str, gguf_type: str = "F16", **kwargs: object) -> None:
    with pytest.raises((ConversionError, SafetensorsError), match=match):
        convert_checkpoint(checkpoint, out, gguf_type, **kwargs)  # type: ignore[arg-type]
    assert not out.exists() or not any(out.iterdir()), "a refused conversion must write nothing"


def test_missing_tensor_is_refused(tmp_path: Path, small: DemoCheckpoint) -> None:
    tensors = {n: t for n, t in small.tensors.items() if n != "emb_ext.5.weight"}
    _refused(_variant(tmp_path, small, tensors), tmp_path / "out", r"1 tensor\(s\) missing \(emb_ext\.5\.weight\)")


def test_wrong_shape_is_refused(tmp_path: Path, small: DemoCheckpoint) -> None:
    tensors = {**small.tensors, "lm_heads.3.weight": np.zeros((1024, 64), dtype=np.float32)}
    match = r"lm_heads\.3\.weight is \[1024, 64\], expected \[1025, 64\].*config\.json and the weights disagree"
    _refused(_variant(tmp_path, small, tensors), tmp_path / "out", match)


def test_unexpected_tensor_is_refused(tmp_path: Path, small: DemoCheckpoint) -> None:
    tensors = {**small.tensors, "language_model.layers.0.self_attn.q_proj.bias": np.zeros(256, dtype=np.float32)}
    _refused(_variant(tmp_path, small, tensors), tmp_path / "out", r"unexpected tensor\(s\) \(language_model\.layers")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "qwen3"}, r"model_type is 'qwen3', not 'moss_tts_delay'"),
        ({"language_config": None}, r"language_config must be an object, got NoneType"),
        ({"language_config": {"hidden_size": 64}}, r"language_config\.num_attention_heads is missing"),
        ({"audio_start_token_id": 5000}, r"audio_start_token_id 5000 .* different models"),
    ],
    ids=["qwen3", "no-language-config", "incomplete-language-config", "unknown-special-token"],
)
def test_config_that_is_not_moss_tts_delay_is_refused(
    tmp_path: Path, small: DemoCheckpoint, config: dict[str, object], match: str
) -> None:
    _refused(_variant(tmp_path, small, **config), tmp_path / "out", match)


def test_rope_scaling_is_refused(tmp_path: Path, small: DemoCheckpoint) -> None:
    language = {**small.config["language_config"], "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}
    _refused(_variant(tmp_path, small, language_config=language), tmp_path / "out", r"'yarn' rope scaling")


def test_existing_output_needs_force(tmp_path: Path, small: DemoCheckpoint) -> None:
    checkpoint, out = _variant(tmp_path, small), tmp_path / "out"
    convert_checkpoint(checkpoint, out, "F16")
    before = (out / "embeddings" / "emb_ext_00.npy").stat().st_mtime_ns
    with pytest.raises(ConversionError, match=r"already holds MOSS-TTS weights \(MOSS_TTS_F16\.gguf, config\.json"):
        convert_checkpoint(checkpoint, out, "F32")
    assert not (out / gguf_name("F32")).exists()
    assert (out / "embeddings" / "emb_ext_00.npy").stat().st_mtime_ns == before
    convert_checkpoint(checkpoint, out, "F32", force=True)
    assert (out / gguf_name("F32")).is_file()


def test_leftovers_of_a_killed_conversion_are_removed(tmp_path: Path, small: DemoCheckpoint) -> None:
    out = tmp_path / "out"
    out.mkdir()
    leftovers = [out / ".MOSS_TTS_F16.gguf.for-Q8_0.tmp", out / ".MOSS_TTS_Q8_0.gguf.partial"]
    for path in leftovers:
        path.write_bytes(b"half a model")
    convert_checkpoint(_variant(tmp_path, small), out, "F16")
    assert not any(path.exists() for path in leftovers)


def test_checkpoint_directory_is_never_the_output(tmp_path: Path, small: DemoCheckpoint) -> None:
    checkpoint = _variant(tmp_path, small)
    with pytest.raises(ConversionError, match="is the checkpoint directory itself"):
        convert_checkpoint(checkpoint, checkpoint, "F16", force=True)


def test_too_little_disk_is_refused(tmp_path: Path, small: DemoCheckpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(conversion.shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 10**6, 10**6))
    _refused(_variant(tmp_path, small), tmp_path / "out", r"needs about [\d.]+ MB free in .*only 1\.0 MB is free")


def test_k_quant_needs_rows_of_256(tmp_path: Path, small: DemoCheckpoint) -> None:
    match = r"Q4_K_M needs every weight row to be a multiple of 256 values, .*hidden_size 64.*choose Q8_0 or F16 or F32"
    _refused(_variant(tmp_path, small), tmp_path / "out", match, gguf_type="Q4_K_M")


def test_damaged_shards_are_refused(tmp_path: Path, source: DemoCheckpoint) -> None:
    checkpoint = write_checkpoint(tmp_path / "checkpoint", source)
    second = checkpoint / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:-100])
    _refused(checkpoint, tmp_path / "out", r"model-00002-of-00002\.safetensors: tensor .* damaged or truncated")
    second.unlink()
    _refused(checkpoint, tmp_path / "out", r"names the shard model-00002-of-00002\.safetensors, which is missing")
    shutil.rmtree(checkpoint)
    checkpoint.mkdir()
    _refused(checkpoint, tmp_path / "out", r"config\.json not found; point at the original")


def test_unsupported_dtypes_and_float16_overflow_are_refused(tmp_path: Path, small: DemoCheckpoint) -> None:
    numpy_api = pytest.importorskip("safetensors.numpy")
    checkpoint = _variant(tmp_path, small)
    as_int = {n: t.astype(np.int32) if n == "emb_ext.0.weight" else t for n, t in small.tensors.items()}
    numpy_api.save_file(as_int, str(checkpoint / "model.safetensors"))
    _refused(checkpoint, tmp_path / "out", r"emb_ext\.0\.weight is I32; only BF16, F16 and F32")
    huge = {**small.tensors, "emb_ext.0.weight": np.full_like(small.tensors["emb_ext.0.weight"], 1e6)}
    numpy_api.save_file(huge, str(checkpoint / "model.safetensors"))
    with pytest.raises(SafetensorsError, match=r"emb_ext\.0\.weight holds values up to 1e\+06, beyond float16"):
        convert_checkpoint(checkpoint, tmp_path / "out", "F16")


def test_quantizing_a_file_that_is_not_gguf_reports_llama_cpp(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")
    with pytest.raises(BridgeError, match=r"MOSS_BRIDGE_ERR_QUANTIZE: .*bogus\.gguf.*llama\.cpp"):
        quantize_gguf(bogus, tmp_path / "out.gguf", "Q8_0")


@pytest.fixture(autouse=True)
def _no_stray_files(tmp_path: Path) -> Iterator[None]:
    """No conversion leaves its temporary files behind, whether it succeeds or not."""
    yield
    assert list(tmp_path.rglob("*.tmp")) == [] and list(tmp_path.rglob("*.partial")) == []


# ---- MOSS-TTS-v1.5 ----------------------------------------------------------------------------------

# The front matter of upstream's model cards (docs/model.md, "MOSS-TTS-v1.5"): v1.5's 31 codes in its order, 1.0's
# 20 (the cards write block lists; YAML reads these flow lists the same).
V1_5_CARD = (
    "---\nlicense: apache-2.0\ntags:\n- text-to-speech\nlanguage: [zh, yue, en, ar, cs, da, de, nl, es, fr, fi, el, "
    "he, hi, hu, ja, it, ko, mk, ms, ru, fa, pl, pt, sv, ro, sw, tl, th, tr, vi]\n---\n# MOSS-TTS Family\n"
)
V1_0_CARD = (
    "---\nlicense: apache-2.0\nlanguage: [zh, en, de, es, fr, ja, it, ko, ru, fa, ar, pl, pt, cs, da, sv, he, hu, el, "
    "tr]\n---\n# MOSS-TTS Family\n"
)


def _v1_5_shaped(config: dict[str, object], layers: int) -> dict[str, object]:
    """``config`` with what upstream's v1.5 config.json may hold besides the keys the converter reads: a
    transformers 5 save of ``MossTTSDelayConfig`` (OpenMOSS/MOSS-TTS, configuration_moss_tts.py) around a Qwen3Config.
    The file itself is not readable here (docs/model.md, "MOSS-TTS-v1.5", says what that leaves open)."""
    language = {
        **config["language_config"],  # type: ignore[dict-item]
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "initializer_range": 0.02,
        "layer_types": ["full_attention"] * layers,
        "max_window_layers": layers,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "dtype": "bfloat16",
    }
    return {
        **config,
        "language_config": language,
        "auto_map": {"AutoConfig": "configuration_moss_tts.MossTTSDelayConfig"},
        "dtype": "bfloat16",
        "initializer_range": 0.02,
        "transformers_version": "5.0.0",
    }


@pytest.mark.parametrize(
    ("card", "release"),
    [(V1_5_CARD, "1.5"), (V1_0_CARD, "1.0"), (None, None), ("# MOSS-TTS\nno front matter\n", None)],
    ids=["v1.5-card", "1.0-card", "no-card", "card-without-front-matter"],
)
def test_a_v1_5_shaped_checkpoint_converts_and_its_card_tells_the_release(
    tmp_path: Path, small: DemoCheckpoint, card: str | None, release: str | None
) -> None:
    checkpoint = _variant(tmp_path, small, **_v1_5_shaped(small.config, layers=1))
    if card is not None:
        (checkpoint / "README.md").write_text(card, encoding="utf-8")
    out, said = tmp_path / "out", io.StringIO()
    convert_checkpoint(checkpoint, out, "F16", progress_stream=said)
    written = json.loads((out / "config.json").read_text())
    assert ModelSpec.load(out).identity.release == release
    meaning = {"1.5": "auto passes [pause X.Ys] to the model", "1.0": "auto renders", None: "release unknown"}[release]
    assert meaning in said.getvalue()
    assert written["moss_tts_node"]["model"] == "moss-tts" and written["moss_tts_node"]["release"] == release
    assert written["transformers_version"] == "5.0.0"  # upstream's keys pass through
    assert ModelSpec.load(out) == ModelSpec.load(checkpoint)


def test_the_card_decides_nothing_it_does_not_say() -> None:
    assert release_from_model_card(V1_5_CARD) == (
        "1.5",
        "its model card lists 31 languages, among them the 11 v1.5 added",
    )
    assert release_from_model_card(V1_0_CARD)[0] == "1.0"  # type: ignore[index]
    for card in (
        "",
        "---\nlanguage: en\n---\n",
        "---\nlanguage:\n- en\n- xx\n---\n",
        "---\n: [\n---\n",
        "---\nlicense: x\n",
    ):
        assert release_from_model_card(card) is None, card
