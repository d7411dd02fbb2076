"""The llama.cpp backbone through the C bridge, checked against an independent float64 NumPy Qwen3."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from qwen3_reference import qwen3_forward

from moss_tts_node import choices
from moss_tts_node.config import LlamaConfig
from moss_tts_node.errors import BridgeError, WeightsError
from moss_tts_node.llama.backbone import Backbone, BackboneParams
from moss_tts_node.llama.bindings import (
    FLASH_ATTN,
    GGML_TYPES,
    MOSS_BRIDGE_ABI_VERSION,
    Status,
    check_abi_version,
    load_bridge_library,
)
from moss_tts_node.llama.bridge import bridge_source_dir
from moss_tts_node.tools.prepare.conversion import quantize_gguf
from moss_tts_node.tools.prepare.qwen3_gguf import (
    Qwen3Shape,
    gguf_tensor_name,
    qwen3_tensor_shapes,
    random_qwen3_tensors,
    write_qwen3_gguf,
)

SHAPE = Qwen3Shape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=128, vocab=300)
N_BATCH = 8  # small, so that a 20-row prefill spans several llama_decode chunks
PREFILL, STEPS = 20, 6
HIDDEN_ATOL = 1e-4  # F32 weights + F32 KV + no flash-attn measure ~1e-6


@pytest.fixture(scope="module")
def tensors() -> dict[str, np.ndarray]:
    return random_qwen3_tensors(SHAPE, seed=7)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory, tensors: dict[str, np.ndarray]) -> Path:
    path = tmp_path_factory.mktemp("backbone") / "tiny.gguf"
    write_qwen3_gguf(path, SHAPE, tensors.items())
    return path


def _params(path: Path, **overrides: object) -> BackboneParams:
    settings: dict[str, object] = {
        "n_ctx": 64,
        "n_batch": N_BATCH,
        "n_threads": 2,
        "n_gpu_layers": 0,
        "kv_cache_type_k": "f32",
        "kv_cache_type_v": "f32",
        "flash_attn": "off",
    }
    settings.update(overrides)
    return BackboneParams(gguf_path=path, **asdict(LlamaConfig(**settings)))  # the config's defaults for the rest


@pytest.fixture(scope="module")
def backbone(gguf_path: Path) -> Iterator[Backbone]:
    with Backbone(_params(gguf_path)) as model:
        yield model


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((PREFILL + STEPS, SHAPE.hidden)).astype(np.float32)


@pytest.fixture(scope="module")
def reference(tensors: dict[str, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return qwen3_forward(tensors, SHAPE, rows)


def _assert_logits_close(actual: np.ndarray, expected: np.ndarray) -> None:
    # logits are a 128-term dot product of the hidden state: allow its error scaled by their magnitude
    np.testing.assert_allclose(actual, expected, rtol=0, atol=HIDDEN_ATOL * max(1.0, float(np.abs(expected).max())))


def test_sizes(backbone: Backbone) -> None:
    assert (backbone.n_embd, backbone.n_vocab) == (SHAPE.hidden, SHAPE.vocab)
    assert backbone.n_ctx >= 64  # llama.cpp rounds n_ctx up to a multiple of 256


def test_prefill_then_decode_matches_reference(
    backbone: Backbone, rows: np.ndarray, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    hidden_ref, logits_ref = reference
    backbone.clear()
    backbone.prefill(rows[:PREFILL])
    assert backbone.position == PREFILL
    np.testing.assert_allclose(backbone.hidden(), hidden_ref[PREFILL - 1], rtol=0, atol=HIDDEN_ATOL)
    _assert_logits_close(backbone.text_logits(), logits_ref[PREFILL - 1])
    for step in range(PREFILL, PREFILL + STEPS):
        backbone.decode(rows[step])
        assert backbone.position == step + 1
        np.testing.assert_allclose(backbone.hidden(), hidden_ref[step], rtol=0, atol=HIDDEN_ATOL)
        _assert_logits_close(backbone.text_logits(), logits_ref[step])


@pytest.mark.parametrize("length", [1, 2, N_BATCH, N_BATCH + 1, 2 * N_BATCH + 1])
def test_split_prefill_is_exact_at_chunk_boundaries(
    backbone: Backbone, rows: np.ndarray, reference: tuple[np.ndarray, np.ndarray], length: int
) -> None:
    # rows 0..S-2 run without outputs in N_BATCH chunks, the last row alone with outputs on
    backbone.clear()
    backbone.prefill(rows[:length])
    np.testing.assert_allclose(backbone.hidden(), reference[0][length - 1], rtol=0, atol=HIDDEN_ATOL)


def test_prefill_in_pieces_continues_positions(
    backbone: Backbone, rows: np.ndarray, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    backbone.clear()
    backbone.prefill(rows[:5])
    backbone.prefill(rows[5:PREFILL])
    assert backbone.position == PREFILL
    np.testing.assert_allclose(backbone.hidden(), reference[0][PREFILL - 1], rtol=0, atol=HIDDEN_ATOL)


def test_clear_and_replay_is_bit_identical(backbone: Backbone, rows: np.ndarray) -> None:
    def run() -> tuple[np.ndarray, np.ndarray]:
        backbone.clear()
        assert backbone.position == 0
        backbone.prefill(rows[:PREFILL])
        for step in range(PREFILL, PREFILL + 2):
            backbone.decode(rows[step])
        return backbone.hidden().copy(), backbone.text_logits().copy()

    first, second = run(), run()
    assert np.array_equal(first[0], second[0])
    assert np.array_equal(first[1], second[1])


def test_outputs_are_reused_buffers(backbone: Backbone, rows: np.ndarray) -> None:
    backbone.clear()
    backbone.prefill(rows[:3])
    hidden, logits = backbone.hidden(), backbone.text_logits()
    assert backbone.hidden() is hidden
    assert backbone.text_logits() is logits
    assert hidden.dtype == logits.dtype == np.float32


def test_no_output_after_clear(backbone: Backbone) -> None:
    backbone.clear()
    with pytest.raises(BridgeError, match="NO_OUTPUT"):
        backbone.hidden()


def test_overflowing_n_ctx_is_refused_without_decoding(backbone: Backbone, rows: np.ndarray) -> None:
    backbone.clear()
    backbone.prefill(rows[:4])
    too_many = np.zeros((backbone.n_ctx - 3, SHAPE.hidden), dtype=np.float32)
    with pytest.raises(BridgeError, match=f"n_ctx is {backbone.n_ctx}"):
        backbone.prefill(too_many)
    assert backbone.position == 4
    backbone.prefill(too_many[:-1])  # exactly full is fine
    assert backbone.position == backbone.n_ctx
    with pytest.raises(BridgeError, match="CONTEXT_FULL"):
        backbone.decode(rows[0])


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((3, SHAPE.hidden + 1), dtype=np.float32),
        np.zeros((0, SHAPE.hidden), dtype=np.float32),
        np.zeros(SHAPE.hidden, dtype=np.float32),
    ],
    ids=["wrong-width", "no-rows", "one-dim"],
)
def test_prefill_rejects_bad_shapes(backbone: Backbone, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"prefill expects embeddings of shape \(S >= 1, 128\)"):
        backbone.prefill(bad)


def test_decode_rejects_bad_shape(backbone: Backbone) -> None:
    with pytest.raises(ValueError, match=r"decode expects an embedding of shape \(128,\)"):
        backbone.decode(np.zeros((1, SHAPE.hidden), dtype=np.float32))


def test_missing_gguf(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(WeightsError, match=r"nowhere\.gguf"):
        Backbone(_params(missing))


def test_random_bytes_are_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(WeightsError, match=r"noise\.gguf"):
        Backbone(_params(path))


def test_truncated_gguf_is_reported_by_llama_cpp(tmp_path: Path, gguf_path: Path) -> None:
    # passes the magic check, so this exercises the bridge's own MODEL_LOAD path
    path = tmp_path / "truncated.gguf"
    path.write_bytes(gguf_path.read_bytes()[: gguf_path.stat().st_size // 2])
    with pytest.raises(WeightsError, match=r"truncated\.gguf.*llama\.cpp"):
        Backbone(_params(path))


def test_closed_backbone_refuses_calls(gguf_path: Path) -> None:
    model = Backbone(_params(gguf_path))
    model.close()
    model.close()
    with pytest.raises(BridgeError, match="closed"):
        model.clear()


def test_f16_weights_and_cache_stay_close(
    tmp_path: Path, tensors: dict[str, np.ndarray], rows: np.ndarray, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    path = tmp_path / "tiny-f16.gguf"
    write_qwen3_gguf(path, SHAPE, tensors.items(), dtype="f16")
    with Backbone(_params(path, kv_cache_type_k="f16", kv_cache_type_v="f16")) as model:
        model.prefill(rows[:PREFILL])
        np.testing.assert_allclose(model.hidden(), reference[0][PREFILL - 1], rtol=0, atol=2e-2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_ctx": 0}, r"INVALID_ARGUMENT: n_ctx \(0\) and n_batch \(8\) must be positive"),
        ({"n_batch": -1}, r"INVALID_ARGUMENT: n_ctx \(64\) and n_batch \(-1\) must be positive"),
        ({"n_gpu_layers": -2}, r"INVALID_ARGUMENT: n_gpu_layers must be >= -1, got -2"),
    ],
)
def test_the_bridge_refuses_bad_params_with_the_reason(
    gguf_path: Path, overrides: dict[str, object], message: str
) -> None:
    # the config checks the user's llama.* values (test_config); the bridge checks what reaches it
    with pytest.raises(BridgeError, match=message):
        Backbone(_params(gguf_path, **overrides))


def test_the_bridge_maps_every_choice_the_schema_offers() -> None:
    assert set(GGML_TYPES) == set(choices.KV_CACHE_TYPES)
    assert set(FLASH_ATTN) == set(choices.FLASH_ATTN_MODES)


def test_abi_version_is_the_headers_and_the_librarys() -> None:
    header = (bridge_source_dir() / "moss_bridge.h").read_text()
    declared = re.search(r"#define MOSS_BRIDGE_ABI_VERSION (\d+)", header)
    assert declared is not None and int(declared.group(1)) == MOSS_BRIDGE_ABI_VERSION
    assert load_bridge_library().moss_bridge_abi_version() == MOSS_BRIDGE_ABI_VERSION
    statuses = dict(re.findall(r"MOSS_BRIDGE_(ERR_\w+|OK)\s+= (\d+)", header))
    assert {name: int(value) for name, value in statuses.items()} == {s.name: s.value for s in Status}


def test_a_bridge_of_another_abi_version_is_refused_with_the_fix() -> None:
    class OtherBuild:
        _name = "/tmp/libmoss_bridge-old.so"

        def moss_bridge_abi_version(self) -> int:
            return MOSS_BRIDGE_ABI_VERSION + 1

    with pytest.raises(BridgeError, match=r"libmoss_bridge-old\.so has ABI version \d+, .* rebuild it"):
        check_abi_version(OtherBuild())


def test_gguf_tensor_names() -> None:
    assert gguf_tensor_name("embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("layers.11.self_attn.o_proj.weight") == "blk.11.attn_output.weight"
    assert gguf_tensor_name("layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    assert gguf_tensor_name("lm_head.weight") == "output.weight"
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.fc1\.weight"):
        gguf_tensor_name("layers.0.mlp.fc1.weight")


def test_writer_streams_out_of_order_and_checks_completeness(
    tmp_path: Path, tensors: dict[str, np.ndarray], rows: np.ndarray, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    path = tmp_path / "reversed.gguf"
    write_qwen3_gguf(path, SHAPE, reversed(list(tensors.items())))
    with Backbone(_params(path)) as model:
        model.prefill(rows[:3])
        np.testing.assert_allclose(model.hidden(), reference[0][2], rtol=0, atol=HIDDEN_ATOL)

    incomplete = tmp_path / "incomplete.gguf"
    partial = [(n, t) for n, t in tensors.items() if n != "lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing tensors: lm_head\.weight"):
        write_qwen3_gguf(incomplete, SHAPE, partial)
    assert not incomplete.exists()
    assert list(tmp_path.glob(".*partial")) == []
    assert len(qwen3_tensor_shapes(SHAPE)) == 3 + 11 * SHAPE.layers


# ---- prompt-prefix reuse -----------------------------------------------------------------------------


def _prompt(ids: list[int]) -> np.ndarray:
    """(S, 2) int64 prompt rows: an id column and one audio column, as the real prompt has 33."""
    return np.stack([np.array(ids), np.array(ids) % 3], axis=1).astype(np.int64)


def _embed() -> Callable[[np.ndarray], np.ndarray]:
    """An embedding table for ids < 256; counts the rows it embeds per call in ``.calls``."""
    table = np.random.default_rng(3).standard_normal((256, SHAPE.hidden)).astype(np.float32)
    calls: list[int] = []

    def embed(prompt: np.ndarray) -> np.ndarray:
        calls.append(prompt.shape[0])
        return table[prompt[:, 0]] + 0.5 * table[prompt[:, 1]]

    embed.calls = calls  # type: ignore[attr-defined]
    return embed


def test_prompt_prefix_is_kept_and_only_the_rest_prefilled(
    backbone: Backbone, tensors: dict[str, np.ndarray], rows: np.ndarray
) -> None:
    embed = _embed()
    first = _prompt(list(range(PREFILL)))
    second = _prompt([*range(12), 21, 22, 23])  # shares its 12 rows before the text with ``first``
    backbone.clear()
    assert backbone.prefill_prompt(first, embed, shared_rows=12) == PREFILL
    backbone.decode(rows[PREFILL])  # a generated row: in the cache, never reused
    assert backbone.prefill_prompt(second, embed, shared_rows=12) == 3
    assert embed.calls == [PREFILL, 3]  # type: ignore[attr-defined]
    assert backbone.position == second.shape[0]
    hidden_ref, logits_ref = qwen3_forward(tensors, SHAPE, embed(second))
    np.testing.assert_allclose(backbone.hidden(), hidden_ref[-1], rtol=0, atol=HIDDEN_ATOL)
    _assert_logits_close(backbone.text_logits(), logits_ref[-1])


def test_same_prompt_again_prefills_only_its_last_row(backbone: Backbone, rows: np.ndarray) -> None:
    embed = _embed()
    prompt = _prompt(list(range(10)))
    backbone.clear()
    backbone.prefill_prompt(prompt, embed)
    expected = backbone.hidden().copy()
    backbone.decode(rows[0])
    assert backbone.prefill_prompt(prompt, embed) == 1  # its outputs are needed again
    assert backbone.position == 10
    assert np.array_equal(backbone.hidden(), expected)


def test_a_prompt_sharing_nothing_is_prefilled_whole(backbone: Backbone) -> None:
    embed = _embed()
    backbone.clear()
    backbone.prefill_prompt(_prompt(list(range(10))), embed)
    assert backbone.prefill_prompt(_prompt(list(range(30, 36))), embed) == 6
    assert backbone.position == 6


def test_prepared_prefix_is_reused_by_the_prompts_beginning_with_it(backbone: Backbone) -> None:
    embed = _embed()
    prefix = _prompt(list(range(8)))
    backbone.clear()
    assert backbone.prepare_prefix(prefix, embed) == 8
    assert backbone.prepare_prefix(prefix, embed) == 0  # already there: nothing decoded
    assert backbone.prefill_prompt(_prompt([*range(8), 40, 41]), embed, shared_rows=8) == 2
    assert backbone.prepare_prefix(prefix, embed) == 0  # still the cache's first rows
    assert backbone.prefill_prompt(_prompt([*range(8), 42]), embed, shared_rows=8) == 1
    # Rows kept are whole segments cut alike: a prompt that does not cut where the prefix ends reuses nothing.
    assert backbone.prefill_prompt(_prompt([*range(8), 43]), embed) == 9


def test_prompt_refused_for_room_keeps_the_prefix_and_nothing_after_it(backbone: Backbone) -> None:
    embed = _embed()
    backbone.clear()
    backbone.prefill_prompt(_prompt(list(range(10))), embed)
    too_long = _prompt([*range(10), *range(backbone.n_ctx)])
    with pytest.raises(BridgeError, match=f"n_ctx is {backbone.n_ctx}"):
        backbone.prefill_prompt(too_long, embed, shared_rows=10)
    assert backbone.position == 10
    assert backbone.prefill_prompt(_prompt([*range(10), 50]), embed, shared_rows=10) == 1


# A prompt long enough for the batches whose kernels round differently (ggml's CPU flash attention tiles batches of
# 64 rows or more; quantized matrix kernels choose their code by the batch's rows): the voice prefix, the first
# request's text, the second's.
PREFIX_ROWS, FIRST_TEXT_ROWS, SECOND_TEXT_ROWS = 150, 50, 30


@pytest.fixture(scope="module")
def q8_gguf_path(gguf_path: Path) -> Path:
    path = gguf_path.with_name("tiny-q8_0.gguf")
    quantize_gguf(gguf_path, path, "Q8_0")
    return path


@pytest.mark.parametrize("weights", ["F32", "Q8_0"])
@pytest.mark.parametrize("n_batch", [512, 8])
@pytest.mark.parametrize("threads", [(2, 2), (1, 2)])  # (steps, prefill): (1, 2) is a 2-core config decoding ahead
def test_a_reused_prefix_gives_the_bits_an_empty_cache_gives(
    gguf_path: Path, q8_gguf_path: Path, weights: str, n_batch: int, threads: tuple[int, int]
) -> None:
    """The n_batch 512 cases fail on the rule of before, which kept the longest common prefix uncut
    (docs/speed.md, "Prompt-prefix reuse", has by how much)."""
    table = np.random.default_rng(5).standard_normal((1024, SHAPE.hidden)).astype(np.float32)

    def embed(prompt: np.ndarray) -> np.ndarray:
        return table[prompt[:, 0]]

    prefix = list(range(PREFIX_ROWS))
    first = _prompt([*prefix, *range(300, 300 + FIRST_TEXT_ROWS)])
    second = _prompt([*prefix, *range(600, 600 + SECOND_TEXT_ROWS)])
    path = q8_gguf_path if weights == "Q8_0" else gguf_path
    params = _params(
        path,
        n_ctx=512,
        n_batch=n_batch,
        n_threads=threads[0],
        n_threads_batch=threads[1],
        flash_attn="on",
        kv_cache_type_k="f16",
        kv_cache_type_v="f16",
    )
    with Backbone(params) as model:
        assert model.prefill_prompt(second, embed, shared_rows=PREFIX_ROWS) == second.shape[0]
        fresh = model.hidden().copy(), model.text_logits().copy()

        def assert_as_fresh() -> None:
            assert np.array_equal(model.hidden(), fresh[0]) and np.array_equal(model.text_logits(), fresh[1])

        model.clear()
        model.prefill_prompt(first, embed, shared_rows=PREFIX_ROWS)
        model.decode(table[7])
        assert model.prefill_prompt(second, embed, shared_rows=PREFIX_ROWS) == SECOND_TEXT_ROWS
        assert_as_fresh()
        assert model.prefill_prompt(second, embed, shared_rows=PREFIX_ROWS) == 1  # the same prompt again
        assert_as_fresh()
        model.clear()
        assert model.prepare_prefix(_prompt(prefix), embed) == PREFIX_ROWS
        assert model.prefill_prompt(second, embed, shared_rows=PREFIX_ROWS) == SECOND_TEXT_ROWS
        assert_as_fresh()
