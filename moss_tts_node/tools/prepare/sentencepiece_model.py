"""A SentencePiece ``tokenizer.model`` as a Hugging Face ``tokenizer.json`` (docs/nano.md, "Converting").

MOSS-TTS-Nano ships SentencePiece's model file; the runtime tokenizes with ``tokenizers`` for every model, so
``convert`` rewrites the file once. The model file is a protocol buffer (``sentencepiece_model.proto``); the few
fields read here are decoded from the wire format directly, so neither ``sentencepiece`` nor ``protobuf`` is a
dependency. The tokenizer built from them encodes as SentencePiece does (test/test_sentencepiece_model.py compares
the two on the Nano fixture's model and on models trained by the test):

- BPE: SentencePiece joins, again and again, the adjacent pair whose union is the piece of highest score. A BPE
  merge list ranked by that score does the same.
- Unigram: the same pieces and scores, the same Viterbi.
- Normalization, in SentencePiece's order: the precompiled character map (absent for ``identity``), extra spaces
  removed where the model says so, the dummy ``▁`` prefix, spaces escaped as ``▁``.
- User-defined symbols (MOSS's ``<|im_start|>`` and the like) are read whole from text, as SentencePiece's prefix
  matcher reads them; control symbols (``<s>``, ``</s>``) are never read from text.

One difference is left, on purpose: in a text that holds a user-defined symbol, ``tokenizers`` normalizes each part
between symbols on its own, so each part gets the dummy ``▁`` where SentencePiece puts one before the whole text.
Matching the symbols in the normalized text instead would normalize the symbols too (``▁<|im_start|>``), and a
``Metaspace`` prefix skips texts that already start with a space; both are wrong for plain text, which is what the
prompt builders encode: they insert special tokens by id and refuse texts that hold them. A Unigram model has
one more: ``tokenizers``' Unigram reads every piece from text, so a text that spells out a control, unknown or byte
piece (``<s>``, ``<unk>``, ``<0x41>``) gets that piece where SentencePiece spells it out character by character.
BPE (Nano's tokenizer) has neither: its merges only ever build normal and user-defined pieces.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers

from moss_tts_node.errors import WeightsError

SPACE_MARK = "\u2581"  # SentencePiece's ▁

# sentencepiece_model.proto: field numbers and enum values read here.
_MODEL_PIECES, _MODEL_TRAINER, _MODEL_NORMALIZER = 1, 2, 3
_PIECE_TEXT, _PIECE_SCORE, _PIECE_TYPE = 1, 2, 3
_TRAINER_MODEL_TYPE, _TRAINER_WHITESPACE_SUFFIX, _TRAINER_BYTE_FALLBACK, _TRAINER_UNK_ID = 3, 24, 35, 40
_NORMALIZER_NAME, _NORMALIZER_CHARSMAP, _NORMALIZER_DUMMY_PREFIX = 1, 2, 3
_NORMALIZER_EXTRA_WHITESPACES, _NORMALIZER_ESCAPE_WHITESPACES = 4, 5
# ModelProto.SentencePiece.Type
NORMAL = 1
UNKNOWN = 2
CONTROL = 3
USER_DEFINED = 4
UNUSED = 5
BYTE = 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


@dataclass(frozen=True)
class Piece:
    text: str
    score: float
    kind: int  # NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED or BYTE


@dataclass(frozen=True)
class SentencePieceModel:
    """What the conversion needs of a model file; the defaults are the proto's."""

    pieces: tuple[Piece, ...]
    model_type: str = "unigram"
    byte_fallback: bool = False
    unk_id: int = 0
    whitespace_as_suffix: bool = False
    normalizer_name: str = ""
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: varints as int, 32-bit fields and byte strings as bytes."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            yield number, data[at : at + width]
            at += width
        elif wire_type == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("a field runs past the end")
            yield number, data[at : at + length]
            at += length
        else:
            raise ValueError(f"wire type {wire_type} is not one protobuf writes")


def _piece(data: bytes) -> Piece:
    text, score, kind = "", 0.0, NORMAL
    for number, value in _fields(data):
        if number == _PIECE_TEXT and isinstance(value, bytes):
            text = value.decode("utf-8")
        elif number == _PIECE_SCORE and isinstance(value, bytes):
            score = struct.unpack("<f", value)[0]
        elif number == _PIECE_TYPE and isinstance(value, int):
            kind = value
    return Piece(text, score, kind)


def read_sentencepiece_model(path: Path) -> SentencePieceModel:
    """The model file at ``path``: WeightsError where it is not one."""
    try:
        data = Path(path).read_bytes()
        pieces: list[Piece] = []
        settings: dict[str, object] = {}
        for number, value in _fields(data):
            if not isinstance(value, bytes):
                continue
            if number == _MODEL_PIECES:
                pieces.append(_piece(value))
            elif number == _MODEL_TRAINER:
                settings.update(_trainer_settings(value))
            elif number == _MODEL_NORMALIZER:
                settings.update(_normalizer_settings(value))
    except (OSError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise WeightsError(f"{path}: not a readable SentencePiece model: {exc}") from exc
    if not pieces:
        raise WeightsError(f"{path}: not a SentencePiece model (it has no pieces)")
    return SentencePieceModel(pieces=tuple(pieces), **settings)  # type: ignore[arg-type]


def _trainer_settings(data: bytes) -> dict[str, object]:
    settings: dict[str, object] = {}
    for number, value in _fields(data):
        if number == _TRAINER_MODEL_TYPE and isinstance(value, int):
            settings["model_type"] = MODEL_TYPES.get(value, f"type {value}")
        elif number == _TRAINER_BYTE_FALLBACK and isinstance(value, int):
            settings["byte_fallback"] = bool(value)
        elif number == _TRAINER_UNK_ID and isinstance(value, int):
            settings["unk_id"] = value
        elif number == _TRAINER_WHITESPACE_SUFFIX and isinstance(value, int):
            settings["whitespace_as_suffix"] = bool(value)
    return settings


def _normalizer_settings(data: bytes) -> dict[str, object]:
    flags = {
        _NORMALIZER_DUMMY_PREFIX: "add_dummy_prefix",
        _NORMALIZER_EXTRA_WHITESPACES: "remove_extra_whitespaces",
        _NORMALIZER_ESCAPE_WHITESPACES: "escape_whitespaces",
    }
    settings: dict[str, object] = {}
    for number, value in _fields(data):
        if number == _NORMALIZER_NAME and isinstance(value, bytes):
            settings["normalizer_name"] = value.decode("utf-8")
        elif number == _NORMALIZER_CHARSMAP and isinstance(value, bytes):
            settings["charsmap"] = value
        elif number in flags and isinstance(value, int):
            settings[flags[number]] = bool(value)
    return settings


def _check_supported(model: SentencePieceModel, path: Path) -> None:
    problems = []
    if model.model_type not in ("bpe", "unigram"):
        problems.append(f"its model type is {model.model_type} (BPE and Unigram convert)")
    if model.whitespace_as_suffix:
        problems.append("it marks spaces as suffixes (treat_whitespace_as_suffix)")
    if not model.escape_whitespaces:
        problems.append("it keeps spaces unescaped (escape_whitespaces false)")
    if any(piece.kind == UNUSED for piece in model.pieces):
        problems.append("it has UNUSED pieces")
    if problems:
        raise WeightsError(
            f"{path}: this SentencePiece model cannot be converted to tokenizer.json exactly: "
            + "; ".join(problems)
            + ". MOSS-TTS-Nano's own tokenizer.model has none of these: use the one its release ships"
        )


def _normalizer(model: SentencePieceModel) -> normalizers.Normalizer:
    steps: list[normalizers.Normalizer] = []
    if model.charsmap:
        steps.append(normalizers.Precompiled(model.charsmap))
    # SentencePiece drops leading spaces and runs of spaces as it reads the text, but trailing ones after escaping
    # them, so a ▁ the text itself ends with goes too. \A and \z because ^ and $ would match at each newline.
    if model.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex("\\A +"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    steps.append(normalizers.Replace(" ", SPACE_MARK))
    if model.remove_extra_whitespaces:
        steps.append(normalizers.Replace(Regex(f"{SPACE_MARK}+\\z"), ""))
    if model.add_dummy_prefix:
        steps.append(normalizers.Prepend(SPACE_MARK))  # Prepend leaves an empty text empty, as SentencePiece does
    return normalizers.Sequence(steps)


def _bpe_merges(model: SentencePieceModel) -> list[tuple[str, str]]:
    """Every split of a mergeable piece into two pieces, best merged score first.

    SentencePiece's BPE joins the adjacent pair whose union scores highest; ranking each split of a piece by the
    piece's score (pieces of equal score by id, then the split's ids) makes the BPE model pick the same join.
    """
    ids = {piece.text: i for i, piece in enumerate(model.pieces) if piece.kind in (NORMAL, USER_DEFINED)}
    ranked = []
    for text, merged_id in ids.items():
        score = model.pieces[merged_id].score
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-score, merged_id, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def tokenizer_from_sentencepiece(path: Path) -> Tokenizer:
    """The ``tokenizers`` equivalent of the SentencePiece model at ``path`` (ids unchanged)."""
    model = read_sentencepiece_model(path)
    _check_supported(model, path)
    unk = model.pieces[model.unk_id].text
    if model.model_type == "bpe":
        vocab = {piece.text: i for i, piece in enumerate(model.pieces)}
        core: models.Model = models.BPE(
            vocab, _bpe_merges(model), unk_token=unk, fuse_unk=True, byte_fallback=model.byte_fallback
        )
    else:
        scored = [(piece.text, piece.score) for piece in model.pieces]
        core = models.Unigram(scored, unk_id=model.unk_id, byte_fallback=model.byte_fallback)
    tokenizer = Tokenizer(core)
    tokenizer.normalizer = _normalizer(model)
    # Control pieces stay plain vocabulary entries: SentencePiece never reads them from text.
    symbols = [piece.text for piece in model.pieces if piece.kind == USER_DEFINED]
    tokenizer.add_tokens([AddedToken(text, normalized=False, special=False) for text in symbols])
    decoding: list[decoders.Decoder] = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if model.add_dummy_prefix:
        decoding.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decoding)
    return tokenizer


def _key(number: int, wire_type: int) -> bytes:
    return _varint_bytes(number << 3 | wire_type)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _message(fields: list[tuple[int, int | float | bytes | str]]) -> bytes:
    """A message of varint (int, bool), 32-bit float and length-delimited (bytes, str) fields."""
    out = bytearray()
    for number, value in fields:
        if isinstance(value, float):
            out += _key(number, 5) + struct.pack("<f", value)
        elif isinstance(value, int):
            out += _key(number, 0) + _varint_bytes(int(value))
        else:
            data = value.encode("utf-8") if isinstance(value, str) else value
            out += _key(number, 2) + _varint_bytes(len(data)) + data
    return bytes(out)


def write_sentencepiece_model(path: Path, model: SentencePieceModel) -> None:
    """Write ``model`` as a SentencePiece model file (the fields ``read_sentencepiece_model`` reads), for demo
    weights in upstream's layout; SentencePiece itself loads it (test/test_sentencepiece_model.py)."""
    model_types = {name: number for number, name in MODEL_TYPES.items()}
    trainer = _message(
        [
            (_TRAINER_MODEL_TYPE, model_types[model.model_type]),
            (_TRAINER_WHITESPACE_SUFFIX, model.whitespace_as_suffix),
            (_TRAINER_BYTE_FALLBACK, model.byte_fallback),
            (_TRAINER_UNK_ID, model.unk_id),
        ]
    )
    normalizer = _message(
        [
            (_NORMALIZER_NAME, model.normalizer_name),
            *([(_NORMALIZER_CHARSMAP, model.charsmap)] if model.charsmap else []),
            (_NORMALIZER_DUMMY_PREFIX, model.add_dummy_prefix),
            (_NORMALIZER_EXTRA_WHITESPACES, model.remove_extra_whitespaces),
            (_NORMALIZER_ESCAPE_WHITESPACES, model.escape_whitespaces),
        ]
    )
    pieces = [
        (_MODEL_PIECES, _message([(_PIECE_TEXT, p.text), (_PIECE_SCORE, float(p.score)), (_PIECE_TYPE, p.kind)]))
        for p in model.pieces
    ]
    Path(path).write_bytes(_message([*pieces, (_MODEL_TRAINER, trainer), (_MODEL_NORMALIZER, normalizer)]))


def convert_sentencepiece(source: Path, destination: Path) -> None:
    """Write ``source`` (a SentencePiece model file) as the tokenizer.json ``destination``."""
    tokenizer_from_sentencepiece(source).save(str(destination))
