"""A complete tiny MOSS-TTS-Delay model with random weights, in the published file formats.

``python -m moss_tts_node demo-weights DIR`` writes what MOSS-TTS-GGUF and
MOSS-Audio-Tokenizer-ONNX hold, at toy size: a qwen3 GGUF with its text head, float16
``embeddings/`` and ``lm_heads/``, a byte-level BPE ``tokenizer/`` carrying the special tokens,
``config.json`` with their ids, ``codec/{encoder,decoder}.onnx``, and a ``config.yaml`` that
points at all of it. Tests and ``make demo`` run the real code paths on it.

It gets there the way a real model does: it first writes an original-format checkpoint into
``hf_checkpoint/`` (config.json with ``language_config`` and ``rope_parameters``, bfloat16
safetensors in two shards with their index, tokenizer.json) and then runs ``convert`` on it, so
every test that loads the demo exercises the converter too. The backbone stays F16 (hidden 256,
so the K-quants also apply to it in tests).

``--model`` makes the demo of another model of the family (docs/family.md): its codebooks (16 for MOSS-TTSD,
-VoiceGenerator and -SoundEffect), and a ``processing_moss_tts.py`` in the checkpoint, in the shape of upstream's,
whose prompt template ``convert`` reads (MOSS-TTSD's with its Scene field); MOSS-TTS's demo ships none, as the
published GGUF repository does not.

Beside the codec's ONNX graphs it writes what a stream decoder is built from, as for the real codec:
a checkpoint of the real codec architecture (``codec_checkpoint/``, ``random_codec.tiny_codec_config``:
config.json and model.safetensors), which ``make demo`` turns into ``codec/decoder_stream.onnx`` with
``build-stream-decoder``, as a user does with OpenMOSS-Team/MOSS-Audio-Tokenizer. The two codecs differ:
the ONNX graphs are a toy stand-in (``demo_codec``), so where the stream decoder is loaded (streams and
whole utterances alike) the same codes decode to other noise than ``decoder.onnx`` gives (which
``model.low_memory``, ``audio.stream_decoder: off`` and TensorRT use); with real weights the two are one codec.

The weights are random, so the audio is noise, not speech. They are nudged so that generation
behaves like a trained model's in shape: every text embedding shares one direction, which the
residual stream carries to the last layer, and the text head reads that direction to favour
``gen_slot`` over ``delay_slot`` (a few seconds of audio, then the flush) and ``im_end`` after
the audio ends. Without that a random model ends its audio after a frame or two and then
rambles text until max_new_tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from moss_tts_node.config import write_params_file
from moss_tts_node.model.family import FAMILY, MOSS_TTS, MOSS_TTS_NANO, MOSS_TTSD
from moss_tts_node.model.layout import gguf_name
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.model.template import MOSS_TTS_TEMPLATE, SCENE, SPEAKER_NUMBER, PromptTemplate
from moss_tts_node.tools.dev.demo_codec import write_demo_codec
from moss_tts_node.tools.dev.nano_codec import write_random_nano_codec
from moss_tts_node.tools.dev.nano_demo import write_nano_release
from moss_tts_node.tools.dev.random_codec import tiny_codec_config, write_random_codec
from moss_tts_node.tools.prepare.convert import MODEL_TYPE, checkpoint_tensor_name, convert_checkpoint
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, random_qwen3_tensors
from moss_tts_node.tools.prepare.safetensors_io import write_sharded_checkpoint

PROCESSING_FILE = "processing_moss_tts.py"  # what a checkpoint of the family names its processing module
# MOSS-TTSD's template as two ports reproduce it (docs/family.md, "Prompt templates"): a Scene before the text, and
# a speaker without a clip printed as None.
DIALOGUE_TEMPLATE = replace(
    MOSS_TTS_TEMPLATE,
    fields=(*MOSS_TTS_TEMPLATE.fields[:-1], ("Scene", SCENE), MOSS_TTS_TEMPLATE.fields[-1]),
    absent_speaker=f"[S{SPEAKER_NUMBER}]: None",
)
CODEC_CHECKPOINT_DIR = "codec_checkpoint"  # the codec checkpoint the demo's stream decoder is built from
GGUF_TYPE = "F16"  # unquantized: the demo backbone equals its checkpoint up to float16 rounding
GGUF_NAME = gguf_name(GGUF_TYPE)
CHECKPOINT_DIR = "hf_checkpoint"  # the original-format checkpoint the demo weights are converted from
SPECIAL_TOKENS = {  # token text -> ModelSpec field, in vocabulary order
    "<|endoftext|>": "pad_token_id",
    "<|im_start|>": "im_start_token_id",
    "<|im_end|>": "im_end_token_id",
    "<|audio_start|>": "audio_start_token_id",
    "<|audio_end|>": "audio_end_token_id",
    "<|audio_user_slot|>": "audio_user_slot_token_id",
    "<|audio_assistant_gen_slot|>": "audio_assistant_gen_slot_token_id",
    "<|audio_assistant_delay_slot|>": "audio_assistant_delay_slot_token_id",
}
_CORPUS = [
    "<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n"
    "- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nen\n- Text:\n</user_inst>",
    "user\nassistant\n[S1]:\n",
    "Hello, robot. The quick brown fox jumps over the lazy dog. Speech synthesis on a small computer.",
    "你好，机器人。今天天气很好。",
]
# Logits the text head gives these tokens along the shared direction (others are ~N(0, 1)).
_TEXT_BIAS = {
    "audio_assistant_gen_slot_token_id": 8.0,
    "audio_assistant_delay_slot_token_id": 2.0,
    "im_end_token_id": 14.0,
}
_SHARED_SCALE = 3.0  # per-element size of the shared direction, against ~1 for everything else
_DEMO_PARAMS = {  # its config.yaml, beside the weights
    "model.weights_dir": ".",
    "model.backbone_gguf": GGUF_NAME,
    "model.codec_dir": "codec",
    "llama.n_ctx": 2048,
    "llama.n_gpu_layers": 0,
    "llama.flash_attn": "off",
    "audio.onnx_provider": "cpu",
    "generation.max_new_tokens": 600,
}


def train_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """A byte-level BPE like Qwen's, trained on a few lines, with MOSS's special tokens added last."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


@dataclass(frozen=True)
class DemoCheckpoint:
    """An original-format checkpoint in memory: config.json content, float32 tensors under the
    checkpoint's own names (``language_model.*``, ``emb_ext.K``, ``lm_heads.K``), and its tokenizer."""

    config: dict[str, Any]
    tensors: dict[str, np.ndarray]
    tokenizer: Tokenizer


def demo_checkpoint(seed: int = 0, hidden: int = 256, layers: int = 2, n_vq: int = 32) -> DemoCheckpoint:
    """The demo model's weights, tokenizer and config (``n_vq`` codebooks), before anything is written."""
    rng = np.random.default_rng(seed)
    tokenizer = train_tokenizer()
    spec = ModelSpec(n_vq=n_vq, **{field: tokenizer.token_to_id(text) for text, field in SPECIAL_TOKENS.items()})
    shape = Qwen3Shape(
        hidden=hidden,
        layers=layers,
        heads=4,
        kv_heads=2,
        head_dim=64,
        ffn=2 * hidden,
        vocab=tokenizer.get_vocab_size(with_added_tokens=True),
    )
    backbone = random_qwen3_tensors(shape, seed)
    direction = rng.choice([-1.0, 1.0], size=hidden).astype(np.float32)
    backbone["embed_tokens.weight"] = 0.3 * backbone["embed_tokens.weight"] + _SHARED_SCALE * direction
    for field, logit in _TEXT_BIAS.items():
        backbone["lm_head.weight"][getattr(spec, field)] = logit * direction / hidden
    tensors = {checkpoint_tensor_name(name): array for name, array in backbone.items()}
    for k in range(spec.n_vq):
        tensors[f"emb_ext.{k}.weight"] = (0.05 * rng.standard_normal((spec.audio_rows, hidden))).astype(np.float32)
        head = rng.standard_normal((spec.audio_rows, hidden)) / np.sqrt(hidden)
        tensors[f"lm_heads.{k + 1}.weight"] = head.astype(np.float32)  # lm_heads.0 is the text head

    language_config = {
        "model_type": "qwen3",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.ffn,
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.context_length,
        "rms_norm_eps": shape.rms_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
    }
    config = {
        "architectures": ["MossTTSDelayModel"],
        "model_type": MODEL_TYPE,
        "language_config": language_config,
        **spec.to_json(),
    }
    return DemoCheckpoint(config=config, tensors=dict(sorted(tensors.items())), tokenizer=tokenizer)


def write_checkpoint(directory: Path, checkpoint: DemoCheckpoint, dtype: str = "BF16", shards: int = 2) -> Path:
    """Write ``checkpoint`` as Hugging Face saves it (tensors stored as ``dtype``); returns ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(checkpoint.config, indent=2) + "\n", encoding="utf-8")
    checkpoint.tokenizer.save(str(directory / "tokenizer.json"))
    write_sharded_checkpoint(directory, checkpoint.tensors, dtype, shards)
    return directory


def processing_source(template: PromptTemplate) -> str:
    """A processing module, in the shape of upstream's (a template string filled in by ``.replace``, the speakers'
    lines in f-strings), that builds ``template``: the demo checkpoint's own word on its prompt. Never run."""
    layout = "\n".join(
        [template.opening, *(f"- {label}:\n{{{name}}}" for label, name in template.fields), template.closing]
    )
    fills = "".join(
        f'\n        .replace("{{{name}}}", str({"speakers" if name == "reference" else f"fields.get({name!r})"}))'
        for _, name in template.fields
    )

    def line(form: str) -> str:  # a speaker's line as f-string source
        numbered = form.replace(SPEAKER_NUMBER, "{index + 1}").replace(template.audio_placeholder, "{AUDIO}")
        return "f" + repr(numbered)

    absent = "None" if template.absent_speaker is None else line(template.absent_speaker)
    return f"""AUDIO = {template.audio_placeholder!r}
LAYOUT = {layout!r}


def speaker_lines(clips):
    lines = [{line(template.speaker)} if clip is not None else {absent} for index, clip in enumerate(clips)]
    return "\\n".join(text for text in lines if text is not None)


def user_content(fields, clips=None):
    speakers = None if clips is None else speaker_lines(clips)
    return (
        LAYOUT{fills}
    )
"""


# The Nano demo codec's audio gain: upstream's init decodes to about 5e-10 RMS, below one 16-bit step, so the demo's
# WAV files, topics and playback would hold only zeros; times this, about -33 dBFS RMS with peaks near -13 dBFS,
# noise a test can record back and compare.
NANO_DEMO_GAIN = 5e7


def write_demo_weights(
    out_dir: Path, seed: int = 0, hidden: int = 256, layers: int = 2, model: str = MOSS_TTS.key
) -> Path:
    """Write the demo of ``model`` (a key of ``model.family.FAMILY``) into ``out_dir`` (overwriting a previous
    one); returns the path of its config.yaml."""
    out_dir = Path(out_dir)
    family_model = FAMILY[model]
    if family_model is MOSS_TTS_NANO:
        return _write_nano_demo(out_dir, seed)
    checkpoint = demo_checkpoint(seed, hidden, layers, n_vq=family_model.codebooks[0])
    source = write_checkpoint(out_dir / CHECKPOINT_DIR, checkpoint)
    if family_model is not MOSS_TTS:
        template = DIALOGUE_TEMPLATE if family_model is MOSS_TTSD else MOSS_TTS_TEMPLATE
        (source / PROCESSING_FILE).write_text(processing_source(template), encoding="utf-8")
    convert_checkpoint(source, out_dir, GGUF_TYPE, force=True, model=model)
    write_demo_codec(out_dir / "codec", seed=seed)
    write_random_codec(tiny_codec_config(), out_dir / CODEC_CHECKPOINT_DIR)
    config_path = out_dir / "config.yaml"
    header = (
        f"Demo {family_model.name} model: random weights, noise not speech.\n"
        f"Made by `python -m moss_tts_node demo-weights --model {model}`."
    )
    write_params_file(config_path, _DEMO_PARAMS, header)
    return config_path


def _write_nano_demo(out_dir: Path, seed: int) -> Path:
    """MOSS-TTS-Nano's demo: its release layout (``nano_demo``) converted as a user converts the release, and a
    random Nano codec in its published ONNX layout (``nano_codec``), tiny."""
    release = write_nano_release(out_dir / CHECKPOINT_DIR, "tiny", seed)
    gguf = convert_checkpoint(release, out_dir, GGUF_TYPE, force=True)
    write_random_nano_codec(out_dir / "codec", "tiny", seed, NANO_DEMO_GAIN)
    config_path = out_dir / "config.yaml"
    params = {**_DEMO_PARAMS, "model.backbone_gguf": gguf.name}
    header = (
        f"Demo {MOSS_TTS_NANO.name} model: random weights, noise not speech.\n"
        f"Made by `python -m moss_tts_node demo-weights --model {MOSS_TTS_NANO.key}`."
    )
    write_params_file(config_path, params, header)
    return config_path
