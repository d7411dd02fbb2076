"""A MOSS-TTS-Nano with random weights in upstream's release layout, tiny or at the real size (docs/nano.md,
"Demo weights").

``write_nano_release`` writes what OpenMOSS-Team/MOSS-TTS-Nano holds: ``config.json`` (``model_type``
``moss_tts_nano``, the transformer settings under ``gpt2_config``), ``model.safetensors`` (upstream's tensor names,
tied heads left out as ``save_pretrained`` leaves them) and a SentencePiece ``tokenizer.model`` (BPE with byte
fallback, MOSS's symbols at upstream's ids). ``demo-weights --model nano`` converts it with ``convert``, as a user
converts the release, next to a random Nano codec in its published ONNX layout.

The weights are upstream's own init (every matrix and table N(0, 0.02), zero biases, unit norms: what
``MossTTSNanoForCausalLM`` starts from), so sizes, types and value ranges are those of the real model and the bench's
figures hold for it. One nudge makes generation last as a trained model's does: the local transformer's final norm
carries a fixed direction that the text head reads as "go on" (the assistant slot) against "stop" (audio end),
by ``SPEAK_MARGIN`` logits, so that sampled speech ends after a few seconds and greedy speech runs to its budget.
Without it a random model ends its audio within a frame or two. The audio is noise, not speech.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from moss_tts_node.model.spec import NANO_MODEL_TYPE, NanoSpec
from moss_tts_node.tools.prepare.codeshell_gguf import NanoTransformerShape, nano_tensor_shapes
from moss_tts_node.tools.prepare.nano_convert import (
    GLOBAL_PREFIX,
    LOCAL_PREFIX,
    SENTENCEPIECE_FILE,
    TEXT_TABLE,
    audio_table,
)
from moss_tts_node.tools.prepare.safetensors_io import write_safetensors
from moss_tts_node.tools.prepare.sentencepiece_model import (
    BYTE,
    CONTROL,
    NORMAL,
    SPACE_MARK,
    UNKNOWN,
    USER_DEFINED,
    Piece,
    SentencePieceModel,
    write_sentencepiece_model,
)

# Upstream's transformer settings at the real size (its config.json), and the demo's tiny ones.
NANO_SIZES: dict[str, NanoTransformerShape] = {
    "real": NanoTransformerShape(hidden=768, layers=12, heads=12, ffn=3072, context_length=4096),
    "tiny": NanoTransformerShape(hidden=64, layers=2, heads=4, ffn=256, context_length=4096),
}
REAL_TEXT_VOCAB = 16384  # upstream's text vocabulary: the rows of its text table
LOCAL_LAYERS = 1
INIT_STD = 0.02  # upstream's initializer_range
SPEAK_MARGIN = 3.5  # go-on over stop, in logits: at text temperature 1, speech ends after ~33 frames (2.6 s)
NUDGE_BIAS = 4.0
# MOSS's symbols, in the order of their ids (NanoSpec: 4..9), after <unk> <s> </s> <pad>.
SYMBOLS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_user_slot|>",
    "<|audio_assistant_slot|>",
)
_CORPUS = [
    "user\nassistant\n<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n"
    "- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nNone\n- Text:\n\n</user_inst>",
    "Hello, robot. The quick brown fox jumps over the lazy dog. Speech synthesis on a small computer.",
    "The robot reads a red book by the river, and the river sings back to it all day long.",
    "你好，机器人。今天天气很好。我们一起去公园散步吧。",
]


def demo_sentencepiece_model(merges: int = 300) -> SentencePieceModel:
    """A SentencePiece BPE model in the shape of Nano's: <unk> <s> </s> <pad>, MOSS's symbols, the 256 byte pieces,
    then merged pieces (best first) and single characters, with SentencePiece's defaults for BPE."""
    trainer = trainers.BpeTrainer(vocab_size=merges, show_progress=False)
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="first")
    learner.train_from_iterator(_CORPUS, trainer=trainer)
    learned = json.loads(learner.to_str())["model"]
    merged = ["".join(pair.split(" ") if isinstance(pair, str) else pair) for pair in learned["merges"]]
    characters = sorted(piece for piece in learned["vocab"] if len(piece) == 1)
    pieces = [Piece("<unk>", 0.0, UNKNOWN), Piece("<s>", 0.0, CONTROL), Piece("</s>", 0.0, CONTROL)]
    pieces += [Piece("<pad>", 0.0, CONTROL), *(Piece(symbol, 0.0, USER_DEFINED) for symbol in SYMBOLS)]
    pieces += [Piece(f"<0x{byte:02X}>", 0.0, BYTE) for byte in range(256)]
    reserved = {piece.text for piece in pieces}
    normal = [text for text in dict.fromkeys([*merged, *characters]) if text not in reserved]  # in order, once
    pieces += [Piece(text, -float(rank), NORMAL) for rank, text in enumerate(normal)]
    return SentencePieceModel(
        pieces=tuple(pieces),
        model_type="bpe",
        byte_fallback=True,
        normalizer_name="identity",
        remove_extra_whitespaces=False,
    )


def nano_release_config(shape: NanoTransformerShape, text_vocab: int) -> dict[str, Any]:
    """Upstream's config.json for these transformer settings (its keys, its other values)."""
    spec = NanoSpec()
    ids = {name: getattr(spec, name) for name in spec.special_token_ids}
    return {
        "architectures": ["MossTTSNanoForCausalLM"],
        "model_type": NANO_MODEL_TYPE,
        "model_architecture": "global_local_transformer",
        "n_vq": spec.n_vq,
        "audio_vocab_size": spec.audio_vocab_size,
        "audio_codebook_sizes": [spec.audio_vocab_size] * spec.n_vq,
        "audio_pad_token_id": spec.audio_pad_code,
        "audio_assistant_slot_token_id": ids["audio_assistant_gen_slot_token_id"],
        **{name: value for name, value in ids.items() if name != "audio_assistant_gen_slot_token_id"},
        "audio_tokenizer_sample_rate": spec.sampling_rate,
        "audio_tokenizer_type": "moss-audio-tokenizer-nano",
        "local_transformer_layers": LOCAL_LAYERS,
        "hidden_size": shape.hidden,
        "vocab_size": text_vocab,
        "dtype": "float32",
        "gpt2_config": {
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "position_embedding_type": "rope",
            "rope_base": shape.rope_base,
            "layer_norm_epsilon": shape.layer_norm_eps,
            "n_embd": shape.hidden,
            "n_head": shape.heads,
            "n_inner": shape.ffn,
            "n_layer": shape.layers,
            "n_positions": shape.context_length,
            "vocab_size": text_vocab,
        },
    }


def random_nano_tensors(shape: NanoTransformerShape, text_vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Upstream's init of every tensor ``save_pretrained`` writes, float32, with the speaking nudge."""
    rng = np.random.default_rng(seed)
    spec = NanoSpec()
    tensors: dict[str, np.ndarray] = {}
    for prefix, part in ((GLOBAL_PREFIX, shape), (LOCAL_PREFIX, dataclasses.replace(shape, layers=LOCAL_LAYERS))):
        for name, dims in nano_tensor_shapes(part).items():
            if len(dims) == 2:
                tensors[prefix + name] = rng.normal(0.0, INIT_STD, dims).astype(np.float32)
            else:  # LayerNorm weights one, every bias zero
                tensors[prefix + name] = np.full(
                    dims, float(".ln_" in f".{name}" and name.endswith(".weight")), np.float32
                )
    text = rng.normal(0.0, INIT_STD, (text_vocab, shape.hidden)).astype(np.float32)
    # The nudge: the local final norm's bias points along a unit `direction`, NUDGE_BIAS long against the normed
    # output's N(0, 1) component along it, and audio end's row reads it as stop. Only that row: the slot's is in
    # every generated row's input, and nudged it would carry the direction into the hidden states themselves.
    direction = rng.normal(size=shape.hidden)
    direction = (direction / np.linalg.norm(direction)).astype(np.float32)
    tensors[LOCAL_PREFIX + "ln_f.bias"] = NUDGE_BIAS * direction
    text[spec.audio_end_token_id] -= SPEAK_MARGIN / NUDGE_BIAS * direction
    tensors[TEXT_TABLE] = text
    for k in range(spec.n_vq):
        table = rng.normal(0.0, INIT_STD, (spec.audio_vocab_size, shape.hidden)).astype(np.float32)
        # Orthogonal to the direction: the audio heads (tied) would otherwise pick the codes that point along it,
        # and those codes, summed into the next row, would push every later frame further from stopping.
        tensors[audio_table(k)] = table - np.outer(table @ direction, direction)
    return tensors


def write_nano_release(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random Nano (``NANO_SIZES[size]``) in upstream's release layout into ``out_dir``; return it."""
    shape = NANO_SIZES[size]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = demo_sentencepiece_model()
    text_vocab = REAL_TEXT_VOCAB if size == "real" else len(tokenizer.pieces)
    write_sentencepiece_model(out_dir / SENTENCEPIECE_FILE, tokenizer)
    config = nano_release_config(shape, text_vocab)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_safetensors(out_dir / "model.safetensors", random_nano_tensors(shape, text_vocab, seed), "F32")
    return out_dir
