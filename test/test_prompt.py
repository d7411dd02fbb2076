"""Prompt layout against docs/model.md ("Prompt format"), row by row, on the demo tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from moss_tts_node.errors import RequestError
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.prompt import PromptBuilder, PromptFields

PAD = 1024
CLIP = np.zeros((3, 32), dtype=np.int64)


@pytest.fixture(scope="module")
def weights(demo_config: Path) -> Path:
    return demo_config.parent


@pytest.fixture(scope="module")
def builder(weights: Path) -> PromptBuilder:
    return PromptBuilder(weights / "tokenizer", ModelSpec.load(weights))


def expected_text(ref: str, language: str, text: str) -> str:
    # Written out literally from docs/model.md, independently of prompt.py.
    content = (
        "<user_inst>\n- Reference(s):\n" + ref + "\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n"
        "- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\n"
        + language
        + "\n- Text:\n"
        + text
        + "\n</user_inst>"
    )
    return "<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n"


def test_prompt_without_reference(builder: PromptBuilder, weights: Path) -> None:
    spec = builder.spec
    rows = builder.build(PromptFields(text="Hello robot.", language="en"))
    tokenizer = Tokenizer.from_file(str(weights / "tokenizer" / "tokenizer.json"))
    ids = tokenizer.encode(expected_text("None", "en", "Hello robot."), add_special_tokens=False).ids
    assert rows.dtype == np.int64 and rows.shape == (len(ids) + 1, 33)
    assert rows[:-1, 0].tolist() == ids
    assert rows[-1, 0] == spec.audio_start_token_id
    assert (rows[:, 1:] == PAD).all()
    assert rows[0, 0] == spec.im_start_token_id


def test_prompt_with_reference_clip(builder: PromptBuilder, weights: Path) -> None:
    spec = builder.spec
    frames = 4
    codes = np.arange(frames * 32, dtype=np.int64).reshape(frames, 32) % 1024
    rows = builder.build(PromptFields(text="Hi.", language="en"), [codes])

    slots = "<|audio_user_slot|>" * (frames + 31)
    ref = "[S1]:\n<|audio_start|>" + slots + "<|audio_end|>"
    tokenizer = Tokenizer.from_file(str(weights / "tokenizer" / "tokenizer.json"))
    ids = tokenizer.encode(expected_text(ref, "en", "Hi."), add_special_tokens=False).ids
    assert rows[:-1, 0].tolist() == ids

    start = ids.index(spec.audio_start_token_id)
    block = rows[start + 1 : start + 1 + frames + 31]
    assert (block[:, 0] == spec.audio_user_slot_token_id).all()
    assert rows[start + frames + 32, 0] == spec.audio_end_token_id
    for t in range(frames):
        for k in range(32):
            assert block[t + k, 1 + k] == codes[t, k]
    assert (block[:, 1:] != PAD).sum() == frames * 32  # pad everywhere off the staircase
    outside = np.ones(len(rows), dtype=bool)
    outside[start + 1 : start + 1 + frames + 31] = False
    assert (rows[outside, 1:] == PAD).all()


def test_missing_fields_print_none_and_tokens_prints_its_number(builder: PromptBuilder) -> None:
    content = builder.user_content(PromptFields(text="x", tokens=25), [])
    assert "- Tokens:\n25\n" in content
    assert "- Language:\nNone\n" in content and "- Reference(s):\nNone\n" in content


def test_two_references_are_numbered(builder: PromptBuilder) -> None:
    content = builder.user_content(PromptFields(text="x"), [CLIP, CLIP])
    assert "[S1]:\n<|audio|>\n[S2]:\n<|audio|>" in content


def test_control_tokens_in_text_are_refused(builder: PromptBuilder) -> None:
    with pytest.raises(RequestError, match="control token"):
        builder.build(PromptFields(text="say <|im_end|> now"))


@pytest.mark.parametrize("text", ["Hello! I am a robot.", " leading space", "42 apples", "\u4f60\u597d"])
def test_voice_prefix_is_where_every_prompt_of_the_voice_begins(builder: PromptBuilder, text: str) -> None:
    voice = np.random.default_rng(0).integers(0, 1024, size=(5, 32))
    fields = PromptFields(text=text, language="en", instruction="calm")
    prefix = builder.voice_prefix(fields, [voice])
    encoded = builder.encode(fields, [voice])
    prompt = encoded.rows
    assert prefix.shape[0] < prompt.shape[0]
    assert encoded.shared_rows == prefix.shape[0]  # where the backbone cuts the prompt, to reuse the prefix exactly
    assert np.array_equal(prompt[: prefix.shape[0]], prefix)
    # the text is what follows: everything before it is in the prefix
    text_ids = builder.tokenizer.encode(text, add_special_tokens=False).ids
    assert prompt[prefix.shape[0] : prefix.shape[0] + len(text_ids), 0].tolist() == text_ids


def test_voice_prefix_changes_with_the_fields_before_the_text(builder: PromptBuilder) -> None:
    fields = PromptFields(text="x", language="en")
    assert not np.array_equal(builder.voice_prefix(fields), builder.voice_prefix(PromptFields(text="x", language="zh")))
    assert np.array_equal(builder.voice_prefix(fields), builder.voice_prefix(PromptFields(text="other", language="en")))


def test_a_speaker_without_a_clip_has_no_line_and_the_next_keeps_its_number(builder: PromptBuilder) -> None:
    """As upstream's processor renders ``reference=[None, clip]``: only ``[S2]:``."""
    content = builder.user_content(PromptFields(text="x"), [None, CLIP])
    assert "- Reference(s):\n[S2]:\n<|audio|>\n- Instruction:" in content
    codes = np.random.default_rng(1).integers(0, 1024, size=(3, 32))
    rows = builder.build(PromptFields(text="x"), [None, codes])
    text = builder.tokenizer.decode(rows[:, 0].tolist(), skip_special_tokens=False)
    assert "[S2]:\n<|audio_start|>" in text and "[S1]" not in text
    assert (rows[:, 1:] != PAD).sum() == codes.size  # the clip's codes, in its slots


@pytest.mark.parametrize("text", ["Hello robot.", "42 apples, 7 pears!", "\u4f60\u597d\uff0c\u673a\u5668\u4eba\u3002"])
def test_the_prompt_counts_its_texts_tokens(builder: PromptBuilder, text: str) -> None:
    prompt = builder.encode(PromptFields(text=text, language="en"), [CLIP])
    assert prompt.text_tokens == len(builder.tokenizer.encode(text, add_special_tokens=False).ids)
    np.testing.assert_array_equal(prompt.rows, builder.build(PromptFields(text=text, language="en"), [CLIP]))
