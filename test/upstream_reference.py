"""Upstream's processor (generation and continuation modes) and its greedy ``generate()``, restated independently
of the package, for the tests that hold the package to them token for token (``test_continuation_reference.py``,
``test_family_reference.py``).

Written from upstream's processor and ``generate()`` (docs/model.md, "Continuation" and "Upstream"), not from the
package: each turn templated on its own, audio blocks laid out and delayed, the last assistant block cut after its
T-th gen slot (continuation mode); then the generate loop's rules (the delay state read from the prompt's last row,
the masks of the first steps, the repetition penalty over every row so far, prompt included: channel 0 over its own
column, the others over the union of theirs), greedy, on a demo model's original checkpoint (bfloat16 safetensors)
through the float64 NumPy Qwen3 of ``qwen3_reference``. The template is GitHub's processor's unless a test gives the
one a checkpoint's own processor writes (MOSS-TTSD's, docs/family.md, "Prompt templates").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from qwen3_reference import qwen3_forward
from tokenizers import Tokenizer

from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint

PLACEHOLDER = "<|audio|>"
# GitHub's processor's user turn (moss_tts_delay/processing_moss_tts.py), its fields filled by str().
TEMPLATE = (
    "<user_inst>\n- Reference(s):\n{reference}\n- Instruction:\n{instruction}\n- Tokens:\n{tokens}\n"
    "- Quality:\n{quality}\n- Sound Event:\n{sound_event}\n- Ambient Sound:\n{ambient_sound}\n"
    "- Language:\n{language}\n- Text:\n{text}\n</user_inst>"
)


class Upstream:
    """Upstream's processor (continuation and generation modes) and its greedy ``generate()``, restated."""

    def __init__(self, checkpoint: Path, template: str = TEMPLATE, absent_speaker: str | None = None) -> None:
        """``template``: the user turn as the checkpoint's processor writes it; ``absent_speaker``: the line of a
        speaker without a clip (``{n}`` its number), None where the processor leaves it out (GitHub's)."""
        self.template, self.absent_speaker = template, absent_speaker
        config = json.loads((checkpoint / "config.json").read_text())
        language = config["language_config"]
        self.shape = Qwen3Shape(
            hidden=language["hidden_size"],
            layers=language["num_hidden_layers"],
            heads=language["num_attention_heads"],
            kv_heads=language["num_key_value_heads"],
            head_dim=language["head_dim"],
            ffn=language["intermediate_size"],
            vocab=language["vocab_size"],
            rope_theta=language["rope_parameters"]["rope_theta"],
            rms_eps=language["rms_norm_eps"],
        )
        self.id = {key: value for key, value in config.items() if key.endswith("_token_id")}
        self.n_vq, self.pad = config["n_vq"], config["audio_pad_code"]
        tensors = SafetensorsCheckpoint(checkpoint)
        self.backbone = {
            name.removeprefix("language_model."): tensors.read(name).astype(np.float64)
            for name in tensors.tensors
            if name.startswith("language_model.")
        }
        self.backbone["lm_head.weight"] = tensors.read("lm_heads.0.weight").astype(np.float64)
        self.audio_embeddings = [tensors.read(f"emb_ext.{k}.weight").astype(np.float64) for k in range(self.n_vq)]
        self.audio_heads = [tensors.read(f"lm_heads.{k + 1}.weight").astype(np.float64) for k in range(self.n_vq)]
        self.tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        self.token = {name: self.tokenizer.id_to_token(token_id) for name, token_id in self.id.items()}

    # -- the processor ------------------------------------------------------------------------------------

    def continuation(
        self, text: str, references: list[np.ndarray | None] | None, prefix: np.ndarray, **fields: Any
    ) -> np.ndarray:
        """``processor([user(text, references, **fields), assistant([prefix])], mode="continuation")``; the fields
        left out are None but the language, en."""
        return np.concatenate([self._user_turn(text, references, fields), self._assistant_turn(prefix)])

    def generation(self, text: str | None, references: list[np.ndarray | None] | None, **fields: Any) -> np.ndarray:
        """``processor([user(text, references, **fields)], mode="generation")``, then the audio_start row that
        upstream's llama.cpp port appends (as this package does)."""
        rows = self._user_turn(text, references, fields, generation_prompt=True)
        start = np.full((1, 1 + self.n_vq), self.pad, dtype=np.int64)
        start[0, 0] = self.id["audio_start_token_id"]
        return np.concatenate([rows, start])

    def _user_turn(
        self,
        text: str | None,
        references: list[np.ndarray | None] | None,
        fields: dict[str, Any],
        generation_prompt: bool = False,
    ) -> np.ndarray:
        # str() of every field; a None speaker has no line (GitHub's processor) and the next keeps its number, or the
        # line the checkpoint's processor writes for it.
        absent = self.absent_speaker
        lines = [
            f"[S{i + 1}]:\n{PLACEHOLDER}" if clip is not None else absent.replace("{n}", str(i + 1))
            for i, clip in enumerate(references or [])
            if clip is not None or absent is not None
        ]
        reference = "None" if references is None else "\n".join(lines)
        values = {name: None for name in re.findall(r"\{(\w+)\}", self.template)} | {"language": "en"} | fields
        content = self.template
        for name, value in {**values, "reference": reference, "text": text}.items():
            content = content.replace("{" + name + "}", str(value))
        # The chat template of one user message, with the assistant header when generation follows.
        chat = f"{self.token['im_start_token_id']}user\n{content}{self.token['im_end_token_id']}\n"
        if generation_prompt:
            chat += f"{self.token['im_start_token_id']}assistant\n"
        clips = [clip for clip in references or [] if clip is not None]
        slot = self.token["audio_user_slot_token_id"]
        return self._unified(chat, clips, slot, slot, cut=False)

    def _assistant_turn(self, prefix: np.ndarray) -> np.ndarray:
        chat = f"{self.token['im_start_token_id']}assistant\n{PLACEHOLDER}{self.token['im_end_token_id']}\n"
        gen, delay = self.token["audio_assistant_gen_slot_token_id"], self.token["audio_assistant_delay_slot_token_id"]
        return self._unified(chat, [prefix], gen, delay, cut=True)

    def _unified(self, chat: str, clips: list[np.ndarray], gen: str, delay: str, cut: bool) -> np.ndarray:
        """A turn's text and audio columns: each block audio_start, T slots and n_vq - 1 more (none for T = 0),
        audio_end; the codes delayed under the slots, pad everywhere else; with ``cut`` the last block's delayed
        codes lose their last n_vq - 1 rows and the text is cut to the same length."""
        start, end = self.token["audio_start_token_id"], self.token["audio_end_token_id"]
        for clip in clips:
            slots = gen * clip.shape[0] + delay * (self.n_vq - 1) if clip.shape[0] else ""
            chat = chat.replace(PLACEHOLDER, start + slots + end, 1)
        ids = self.tokenizer.encode(chat, add_special_tokens=False).ids
        starts = [i for i, token in enumerate(ids) if token == self.id["audio_start_token_id"]]
        ends = [i for i, token in enumerate(ids) if token == self.id["audio_end_token_id"]]
        assert len(starts) == len(ends) == len(clips)
        audio: list[np.ndarray] = []
        after = 0  # the row after which the next run of pads starts: the previous block's audio_end
        for block_start, block_end, clip in zip(starts, ends, clips, strict=True):
            audio.append(np.full((block_start - after + 1, self.n_vq), self.pad))
            audio.append(self._delayed(clip))
            after = block_end
        if cut:
            audio[-1] = audio[-1][: audio[-1].shape[0] - (self.n_vq - 1)]
        else:
            audio.append(np.full((len(ids) - after, self.n_vq), self.pad))
        columns = np.concatenate(audio) if clips else np.full((len(ids), self.n_vq), self.pad)
        return np.column_stack([np.array(ids[: columns.shape[0]]), columns]).astype(np.int64)

    def _delayed(self, codes: np.ndarray) -> np.ndarray:
        frames = codes.shape[0]
        delayed = np.full((frames + self.n_vq - 1, self.n_vq), self.pad)
        for k in range(self.n_vq):
            delayed[k : k + frames, k] = codes[:, k]
        return delayed

    # -- generate() -----------------------------------------------------------------------------------------

    def generate(self, prompt: np.ndarray, steps: int, penalty: float) -> np.ndarray:
        """``steps`` rows of greedy generation after ``prompt``, by generate()'s rules (batch 1)."""
        ids, n_vq, pad = self.id, self.n_vq, self.pad
        rows = prompt.copy()
        audio_starts = np.flatnonzero(prompt[:, 0] == ids["audio_start_token_id"])
        continuing = prompt[-1, 0] in (ids["audio_start_token_id"], ids["audio_assistant_gen_slot_token_id"])
        is_audio = continuing and audio_starts.size > 0
        audio_length = prompt.shape[0] - int(audio_starts[-1]) if is_audio else 0
        delayed_length: int | None = None  # None: not flushing
        stopping = False
        for time_step in range(steps):
            hidden, text_logits = qwen3_forward(self.backbone, self.shape, self._embed(rows))
            logits = text_logits[-1].copy()
            if stopping:
                text = ids["pad_token_id"]
            elif delayed_length is not None and delayed_length < n_vq:
                text = ids["audio_assistant_delay_slot_token_id"]
            elif delayed_length == n_vq:
                text, is_audio = ids["audio_end_token_id"], False
            else:
                if is_audio:
                    allowed = np.full_like(logits, -np.inf)
                    for name in ("audio_assistant_gen_slot_token_id", "audio_assistant_delay_slot_token_id"):
                        allowed[ids[name]] = logits[ids[name]]
                    logits = allowed
                else:
                    for name in ("pad_token_id", "audio_assistant_gen_slot_token_id"):
                        logits[ids[name]] = -np.inf
                    logits[ids["audio_assistant_delay_slot_token_id"]] = logits[ids["audio_end_token_id"]] = -np.inf
                if time_step == 0:
                    logits[ids["audio_assistant_delay_slot_token_id"]] = -np.inf
                if time_step <= n_vq:
                    logits[ids["im_end_token_id"]] = -np.inf
                text = int(np.argmax(logits))
            is_audio = is_audio or text == ids["audio_start_token_id"]
            stopping = stopping or text == ids["im_end_token_id"]
            channel = np.arange(n_vq)
            sampled = channel < audio_length
            if delayed_length is not None:
                sampled &= channel >= delayed_length
            codes = np.full(n_vq, pad)
            for k in np.flatnonzero(sampled):
                audio_logits = hidden[-1] @ self.audio_heads[k].T
                audio_logits[pad] = -np.inf
                if penalty != 1.0:
                    # channel 0 over its own column's history; 1.. over the union of theirs, every row so far
                    seen = np.unique(rows[:, 1] if k == 0 else rows[:, 2:])
                    audio_logits[seen] = np.where(
                        audio_logits[seen] > 0, audio_logits[seen] / penalty, audio_logits[seen] * penalty
                    )
                codes[k] = int(np.argmax(audio_logits))
            if text in (
                ids["audio_start_token_id"],
                ids["audio_assistant_gen_slot_token_id"],
                ids["audio_assistant_delay_slot_token_id"],
            ):
                audio_length += 1
            elif text == ids["audio_end_token_id"]:
                audio_length = 0
            if delayed_length is None and text == ids["audio_assistant_delay_slot_token_id"]:
                delayed_length = 0
            if delayed_length is not None:
                delayed_length += 1
                if delayed_length > n_vq:
                    delayed_length = None
            rows = np.concatenate([rows, np.concatenate([[text], codes])[None, :]])
        return rows[prompt.shape[0] :]

    def _embed(self, rows: np.ndarray) -> np.ndarray:
        embedded = self.backbone["embed_tokens.weight"][rows[:, 0]].astype(np.float64)
        for k in range(self.n_vq):
            embedded += self.audio_embeddings[k][rows[:, 1 + k]]
        return embedded
