"""Build the tiny MOSS-TTS-Nano fixture and record upstream PyTorch's greedy output on it.

Usage: python make_reference.py UPSTREAM_PACKAGE_DIR

UPSTREAM_PACKAGE_DIR is a directory holding upstream's HF code as the package ``moss_tts_nano``
(configuration_moss_tts_nano.py, gpt2_decoder.py, prompting.py, tokenization_moss_tts_nano.py,
modeling_moss_tts_nano.py). Needs torch, transformers<5, sentencepiece, safetensors; it is run
once by hand, never by the tests. Output goes next to this file.
"""

from __future__ import annotations

import io
import itertools
import json
import random
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
MAX_NEW_FRAMES = 20
REPETITION_PENALTY = 1.2  # upstream's runtime default for audio; it also bends greedy picks
ATTN_SCALE = 8.0  # raw init gives near-uniform attention; scaling c_attn makes positions matter
SEED = 0

# Ids 0..2 are SentencePiece's own unk/bos/eos, 3 is its pad piece; the user-defined symbols
# come next in list order, so they land on 4..9.
SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_user_slot|>",
    "<|audio_assistant_slot|>",
]
SPECIAL_IDS = {
    "pad": 3,
    "im_start": 4,
    "im_end": 5,
    "audio_start": 6,
    "audio_end": 7,
    "audio_user_slot": 8,
    "audio_assistant_slot": 9,
}


def corpus() -> list[str]:
    """About 200 lines of English and Chinese, plus the prompt template's own words."""
    subjects = ["The robot", "My friend", "A small cat", "The teacher", "Our team", "The old man", "She", "We"]
    verbs = ["reads", "walks to", "looks at", "talks about", "builds", "paints", "likes", "finds"]
    objects = [
        "the river.",
        "a red book.",
        "the new station.",
        "the quiet garden.",
        "an open window.",
        "the morning news.",
        "a tall tree.",
        "the last train.",
    ]
    zh_subjects = ["机器人", "我的朋友", "小猫", "老师", "我们的团队", "那位老人", "她", "我们"]
    zh_verbs = ["正在看", "走向", "谈论", "建造", "喜欢", "找到", "画了", "听见"]
    zh_objects = [
        "那条河。",
        "一本红色的书。",
        "新的车站。",
        "安静的花园。",
        "打开的窗户。",
        "早上的新闻。",
        "一棵高高的树。",
        "最后一班火车。",
    ]
    rng = random.Random(SEED)
    lines = [f"{s} {v} {o}" for s, v, o in itertools.product(subjects, verbs, objects)]
    lines = rng.sample(lines, 90)
    zh = [f"{s}{v}{o}" for s, v, o in itertools.product(zh_subjects, zh_verbs, zh_objects)]
    lines += rng.sample(zh, 90)
    template_words = [
        "user",
        "assistant",
        "<user_inst>",
        "</user_inst>",
        "- Reference(s):",
        "- Instruction:",
        "- Tokens:",
        "- Quality:",
        "- Sound Event:",
        "- Ambient Sound:",
        "- Language:",
        "- Text:",
        "None",
    ]
    lines += template_words * 2
    lines += [
        "Hello, how are you today?",
        "The weather is nice and warm.",
        "今天天气很好，我们去公园吧！",
        "你好，很高兴认识你。",
        "Please speak slowly and clearly.",
        "请慢慢地、清楚地说话。",
    ]
    return lines


def train_tokenizer(path: Path) -> None:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=600,
        character_coverage=1.0,
        byte_fallback=True,  # newline and unseen characters go through <0x..> pieces
        normalization_rule_name="identity",  # keep the template's newlines and spaces as written
        remove_extra_whitespaces=False,
        pad_id=3,
        pad_piece="<pad>",
        user_defined_symbols=SPECIALS,
        num_threads=1,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def main() -> None:
    upstream = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(upstream.parent))
    from moss_tts_nano.configuration_moss_tts_nano import MossTTSNanoConfig
    from moss_tts_nano.modeling_moss_tts_nano import MossTTSNanoForCausalLM
    from moss_tts_nano.tokenization_moss_tts_nano import MossTTSNanoSentencePieceTokenizer

    train_tokenizer(HERE / "tokenizer.model")
    tokenizer = MossTTSNanoSentencePieceTokenizer(vocab_file=str(HERE / "tokenizer.model"))
    for name, token_id in SPECIAL_IDS.items():
        piece = "<pad>" if name == "pad" else f"<|{name}|>"
        assert tokenizer.sp_model.piece_to_id(piece) == token_id, (piece, token_id)

    config = MossTTSNanoConfig(
        gpt2_config={
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_inner": 128,
            "position_embedding_type": "rope",
            "rope_base": 10000,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5,
            "vocab_size": tokenizer.vocab_size,
            "n_positions": 512,
        },
        n_vq=16,
        audio_vocab_size=1024,
        audio_pad_token_id=1024,
        local_transformer_layers=1,
        pad_token_id=SPECIAL_IDS["pad"],
        im_start_token_id=SPECIAL_IDS["im_start"],
        im_end_token_id=SPECIAL_IDS["im_end"],
        audio_start_token_id=SPECIAL_IDS["audio_start"],
        audio_end_token_id=SPECIAL_IDS["audio_end"],
        audio_user_slot_token_id=SPECIAL_IDS["audio_user_slot"],
        audio_assistant_slot_token_id=SPECIAL_IDS["audio_assistant_slot"],
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    model = MossTTSNanoForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("attn.c_attn.weight"):
                param.mul_(ATTN_SCALE)
    model.save_pretrained(str(HERE), safe_serialization=True)
    (HERE / "generation_config.json").unlink(missing_ok=True)  # save_pretrained's extra; not part of the fixture

    codes = torch.Generator().manual_seed(SEED + 1)
    clone_codes = torch.randint(0, 1024, (6, 16), generator=codes)
    clone_zh_codes = torch.randint(0, 1024, (6, 16), generator=codes)
    cont_codes = torch.randint(0, 1024, (5, 16), generator=codes)
    cases = {
        "clone_en": {
            "text": "The robot reads a red book by the river.",
            "mode": "voice_clone",
            "prompt_audio_codes": clone_codes,
        },
        "clone_zh": {
            "text": "今天天气很好，小猫正在看那条河。",
            "mode": "voice_clone",
            "prompt_audio_codes": clone_zh_codes,
        },
        "cont_plain": {"text": "Hello, how are you today?", "mode": "continuation"},
        "cont_ref": {
            "text": "We walk to the quiet garden.",
            "mode": "continuation",
            "prompt_text": "My friend likes the morning news. ",
            "prompt_audio_codes": cont_codes,
        },
    }
    out: dict[str, np.ndarray] = {}
    summary = {}
    for case, spec in cases.items():
        input_ids, attention_mask = model.build_inference_input_ids(text_tokenizer=tokenizer, **spec)
        with torch.no_grad():
            hidden = model.transformer(
                inputs_embeds=model._build_inputs_embeds(input_ids), attention_mask=attention_mask
            ).last_hidden_state[0, -1]
        generation = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_frames=MAX_NEW_FRAMES,
            do_sample=False,
            audio_repetition_penalty=REPETITION_PENALTY,
            use_kv_cache=True,
        )
        frames = generation.audio_token_ids[0]
        out[f"{case}_text"] = np.array(spec["text"])
        out[f"{case}_text_ids"] = np.array(tokenizer.encode(spec["text"], add_special_tokens=False), dtype=np.int64)
        out[f"{case}_prompt"] = input_ids[0].numpy().astype(np.int64)
        out[f"{case}_frames"] = frames.numpy().astype(np.int64)
        out[f"{case}_ended"] = np.array(frames.shape[0] < MAX_NEW_FRAMES)
        out[f"{case}_hidden0"] = hidden.numpy().astype(np.float32)
        if "prompt_text" in spec:
            out[f"{case}_prompt_text"] = np.array(spec["prompt_text"])
        if "prompt_audio_codes" in spec:
            out[f"{case}_prompt_codes"] = spec["prompt_audio_codes"].numpy().astype(np.int64)
        summary[case] = {
            "prompt_rows": int(input_ids.shape[1]),
            "frames": int(frames.shape[0]),
            "ended": bool(out[f"{case}_ended"]),
        }
    out["cases"] = np.array(list(cases))
    out["max_new_frames"] = np.array(MAX_NEW_FRAMES)
    out["audio_repetition_penalty"] = np.array(REPETITION_PENALTY)
    np.savez_compressed(HERE / "reference.npz", **out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
