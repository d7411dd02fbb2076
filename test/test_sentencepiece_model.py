"""tokenizer.model → tokenizer.json (tools/prepare/sentencepiece_model.py) against SentencePiece itself.

The reference is the ``sentencepiece`` library (a test dependency only): the Nano fixture's model (BPE, byte
fallback, identity normalization, MOSS's symbols) and models the test trains, one per setting the converter
handles differently (Unigram; NFKC with extra spaces removed; no dummy prefix), encode the same texts to the same ids,
bar the one difference the converter documents for Unigram.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sentencepiece as spm
from tokenizers import Tokenizer

from moss_tts_node.errors import WeightsError
from moss_tts_node.tools.dev.nano_demo import demo_sentencepiece_model
from moss_tts_node.tools.prepare.sentencepiece_model import (
    BYTE,
    CONTROL,
    UNKNOWN,
    convert_sentencepiece,
    read_sentencepiece_model,
    tokenizer_from_sentencepiece,
    write_sentencepiece_model,
)

NANO_TOKENIZER = Path(__file__).parent / "data" / "nano-tiny" / "tokenizer.model"
SYMBOLS = ["<|im_start|>", "<|im_end|>", "<|audio_start|>"]

TEXTS = [
    "Hello world, this is a test.",
    "  two  spaces  ",
    "你好，世界！今天天气很好。",
    "user\n",
    "\n- Instruction:\nNone\n- Text:\n",
    "emoji 😀, ümlaut, ｆｕｌｌｗｉｄｔｈ ①",
    "",
    " ",
    "\t tab",
    "<s>control pieces read as text</s>",
    "<0x41> <unk> byte and unknown pieces spelled out",
    "▁a literal space mark",
    "aaaa bbbb aaaa",
]
RESERVED = (CONTROL, UNKNOWN, BYTE)
ALPHABET = "abcdefghij klmnop\n\t.,!?你好世界天气很的了是üÅ😀①▁<>|_ｆ"


def _texts(count: int = 1500) -> list[str]:
    rng = random.Random(0)
    return TEXTS + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def _mismatches(model_file: Path) -> list[tuple[str, list[int], list[int]]]:
    reference = spm.SentencePieceProcessor(model_file=str(model_file))
    ours = tokenizer_from_sentencepiece(model_file)
    found = []
    for text in _texts():
        expected = reference.encode(text)
        got = ours.encode(text, add_special_tokens=False).ids
        if got != expected:
            found.append((text, expected, got))
    return found


def _train(tmp_path: Path, name: str, **options: object) -> Path:
    rng = random.Random(1)
    words = ["speech", "robot", "voice", "hello", "world", "你好", "世界", "天气", "很好", "today", "None"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(300)]
    corpus = tmp_path / f"{name}.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    # byte_fallback's 256 pieces come on top of what this corpus can fill: the vocabulary size is a soft limit.
    settings = {"vocab_size": 400, "hard_vocab_limit": False, "byte_fallback": True, "user_defined_symbols": SYMBOLS}
    settings |= options
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / name), minloglevel=2, num_threads=1, **settings
    )
    return tmp_path / f"{name}.model"


def test_the_nano_tokenizer_converts_exactly() -> None:
    model = read_sentencepiece_model(NANO_TOKENIZER)
    assert (model.model_type, model.byte_fallback, model.normalizer_name) == ("bpe", True, "identity")
    assert _mismatches(NANO_TOKENIZER) == []


@pytest.mark.parametrize(
    "settings",
    [
        {"model_type": "unigram"},
        {"model_type": "bpe", "normalization_rule_name": "nmt_nfkc", "remove_extra_whitespaces": True},
        {"model_type": "unigram", "normalization_rule_name": "nfkc", "remove_extra_whitespaces": True},
        {"model_type": "bpe", "add_dummy_prefix": False, "normalization_rule_name": "identity"},
    ],
    ids=["unigram", "bpe-nfkc", "unigram-nfkc", "no-dummy-prefix"],
)
def test_trained_models_convert_exactly(tmp_path: Path, settings: dict[str, object]) -> None:
    model_file = _train(tmp_path, "trained", **settings)
    differing = [text for text, _, _ in _mismatches(model_file)]
    if settings["model_type"] == "unigram":
        # The one documented difference: Unigram reads reserved pieces spelled out in the text.
        reserved = [piece.text for piece in read_sentencepiece_model(model_file).pieces if piece.kind in RESERVED]
        assert differing and all(any(text in line for text in reserved) for line in differing)
    else:
        assert differing == []


def test_the_merge_order_matters(tmp_path: Path) -> None:
    """The check can fail: BPE merges in another order than by score give other ids on the same texts."""
    model_file = _train(tmp_path, "bpe", model_type="bpe")
    converted = tokenizer_from_sentencepiece(model_file)
    spec = json.loads(converted.to_str())
    spec["model"]["merges"] = spec["model"]["merges"][::-1]
    shuffled = Tokenizer.from_str(json.dumps(spec))
    reference = spm.SentencePieceProcessor(model_file=str(model_file))
    assert any(shuffled.encode(text, add_special_tokens=False).ids != reference.encode(text) for text in _texts(50))


def test_symbols_keep_their_ids_and_the_written_file_reads_back(tmp_path: Path) -> None:
    destination = tmp_path / "tokenizer.json"
    convert_sentencepiece(NANO_TOKENIZER, destination)
    reference = spm.SentencePieceProcessor(model_file=str(NANO_TOKENIZER))
    loaded = Tokenizer.from_file(str(destination))
    for piece_id in range(reference.get_piece_size()):
        assert loaded.id_to_token(piece_id) == reference.id_to_piece(piece_id)
    # A symbol in the text is read whole, with SentencePiece's id (where the dummy prefix goes is the documented
    # difference: the prompt builders never encode texts that hold symbols).
    ids = loaded.encode("<|im_start|>user", add_special_tokens=False).ids
    assert reference.piece_to_id("<|im_start|>") in ids
    assert sorted(ids) == sorted(reference.encode("<|im_start|>user"))


def test_unusable_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    garbage = tmp_path / "tokenizer.model"
    garbage.write_bytes(b"\xff\xff\xff")
    with pytest.raises(WeightsError, match="not a readable SentencePiece model"):
        tokenizer_from_sentencepiece(garbage)
    with pytest.raises(WeightsError, match="model type is word"):
        tokenizer_from_sentencepiece(_train(tmp_path, "word", model_type="word"))


def test_written_models_are_sentencepiece_models(tmp_path: Path) -> None:
    """The writer (demo weights in upstream's layout) gives files SentencePiece loads, reads back what it wrote."""
    for model in (read_sentencepiece_model(NANO_TOKENIZER), demo_sentencepiece_model()):
        path = tmp_path / "written.model"
        write_sentencepiece_model(path, model)
        assert read_sentencepiece_model(path) == model
        assert _mismatches(path) == []
