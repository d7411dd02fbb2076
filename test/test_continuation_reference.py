"""Continuation and several references, token for token against upstream, restated independently.

The reference below is written from upstream's processor and ``generate()`` (docs/model.md, "Continuation" and
"Upstream"), not from the package: each turn templated on its own, audio blocks laid out and delayed, the last
assistant block cut after its T-th gen slot (continuation mode); then the generate loop's rules (the delay state
read from the prompt's last row, the masks of the first steps, the repetition penalty over every row so far,
prompt included), greedy, on the demo model's original checkpoint (bfloat16 safetensors) through the float64
NumPy Qwen3 of ``qwen3_reference``. The package runs the same model converted to an F32 GGUF, in llama.cpp, with
its exact NumPy heads; its prompt and its generated rows must equal the reference's. The last test makes sure the
comparison can fail: a wrong cut, a wrong start of the delay state or a history without the prompt breaks it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qwen3_reference import exact_synthesizer, qwen3_forward
from threadpoolctl import threadpool_limits
from tokenizers import Tokenizer

from moss_tts_node.config import SamplingConfig
from moss_tts_node.errors import MossTTSError
from moss_tts_node.model import delay as delay_module
from moss_tts_node.model import sampling as sampling_module
from moss_tts_node.model.generation import generate_rows
from moss_tts_node.synthesis import pipeline as pipeline_module
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.prompt import PromptBuilder
from moss_tts_node.tools.dev.demo_weights import CHECKPOINT_DIR
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint

STEPS = 40  # past the ramp of every codebook (n_vq + 1 steps), whatever the prefix's length
TRANSCRIPT = "Hello there, robot."
TEXT = "The quick brown fox jumps over the lazy dog."
PLACEHOLDER = "<|audio|>"
TEMPLATE = (
    "<user_inst>\n- Reference(s):\n{reference}\n- Instruction:\n{instruction}\n- Tokens:\n{tokens}\n"
    "- Quality:\n{quality}\n- Sound Event:\n{sound_event}\n- Ambient Sound:\n{ambient_sound}\n"
    "- Language:\n{language}\n- Text:\n{text}\n</user_inst>"
)


class Upstream:
    """Upstream's processor (continuation and generation modes) and its greedy ``generate()``, restated."""

    def __init__(self, checkpoint: Path) -> None:
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

    def continuation(self, text: str, references: list[np.ndarray | None] | None, prefix: np.ndarray) -> np.ndarray:
        """``processor([user(text, references), assistant([prefix])], mode="continuation")``."""
        return np.concatenate([self._user_turn(text, references), self._assistant_turn(prefix)])

    def generation(self, text: str, references: list[np.ndarray | None] | None) -> np.ndarray:
        """``processor([user(text, references)], mode="generation")``, then the audio_start row that upstream's
        llama.cpp port appends (as this package does)."""
        rows = self._user_turn(text, references, generation_prompt=True)
        start = np.full((1, 1 + self.n_vq), self.pad, dtype=np.int64)
        start[0, 0] = self.id["audio_start_token_id"]
        return np.concatenate([rows, start])

    def _user_turn(
        self, text: str, references: list[np.ndarray | None] | None, generation_prompt: bool = False
    ) -> np.ndarray:
        # str() of every field; a None speaker has no line and the next keeps its number.
        lines = [f"[S{i + 1}]:\n{PLACEHOLDER}" for i, clip in enumerate(references or []) if clip is not None]
        reference = "None" if references is None else "\n".join(lines)
        fields = {"instruction": None, "tokens": None, "quality": None, "sound_event": None, "ambient_sound": None}
        content = TEMPLATE
        for name, value in {"reference": reference, **fields, "language": "en", "text": text}.items():
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


@dataclass(frozen=True)
class Case:
    """A request as the package takes it and as upstream's processor does (the user's text, references, prefix)."""

    name: str
    request: dict[str, Any]
    references: list[np.ndarray | None] | None
    prefix: np.ndarray | None
    penalty: float = 1.0


CLIP = np.random.default_rng(11).integers(0, 1024, size=(12, 32))
SHORT = np.random.default_rng(12).integers(0, 1024, size=(5, 32))  # shorter than the delay: T < n_vq - 1
OTHER = np.random.default_rng(13).integers(0, 1024, size=(9, 32))
CASES = [
    Case("continuation", {"voice": "", "prefix": CLIP, "prefix_text": TRANSCRIPT}, None, CLIP),
    Case("continuation, 5 frames", {"voice": "", "prefix": SHORT, "prefix_text": TRANSCRIPT}, None, SHORT),
    Case("continuation and [S1]", {"voice": CLIP, "prefix": CLIP, "prefix_text": TRANSCRIPT}, [CLIP], CLIP),
    Case(
        "continuation and [S1], penalty",
        {"voice": CLIP, "prefix": CLIP, "prefix_text": TRANSCRIPT},
        [CLIP],
        CLIP,
        penalty=1.3,
    ),
    Case("[S1] and [S2]", {"voice": [CLIP, OTHER]}, [CLIP, OTHER], None),
    Case("[S2] alone", {"voice": [None, OTHER]}, [None, OTHER], None),
]


@pytest.fixture(scope="module")
def upstream(demo_config: Path) -> Upstream:
    return Upstream(demo_config.parent / CHECKPOINT_DIR)


@pytest.fixture(scope="module")
def exact(demo_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesizer]:
    """The demo checkpoint converted to F32, F32 KV cache, exact NumPy heads, greedy."""
    overrides = {"audio.heads_backend": "numpy", "generation.max_new_tokens": STEPS}
    with exact_synthesizer(demo_config, tmp_path_factory.mktemp("f32"), **overrides) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def expected(upstream: Upstream) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each case's (prompt, generated rows) by the reference (BLAS on one thread: many make its small products
    slower, the more so on a busy machine)."""
    with threadpool_limits(limits=1, user_api="blas"):
        return {case.name: _expected(upstream, case) for case in CASES}


def _expected(upstream: Upstream, case: Case) -> tuple[np.ndarray, np.ndarray]:
    if case.prefix is None:
        prompt = upstream.generation(TEXT, case.references)
    else:  # the user gives upstream the transcript and the text as one text (its model card: ref_text + text)
        prompt = upstream.continuation(f"{TRANSCRIPT} {TEXT}", case.references, case.prefix)
    return prompt, upstream.generate(prompt, STEPS, case.penalty)


def _sampling(synth: Synthesizer, case: Case) -> SamplingConfig:
    return replace(synth.config.sampling, audio_repetition_penalty=case.penalty)


def generated_by_the_package(synth: Synthesizer, case: Case) -> tuple[np.ndarray, np.ndarray]:
    stream = synth.stream(SpeechRequest(TEXT, language="en", sampling=_sampling(synth, case), **case.request))
    list(stream)
    assert stream.prompt is not None and stream.generated is not None
    return stream.prompt, stream.generated


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_prompt_and_greedy_rows_are_upstreams(
    exact: Synthesizer, expected: dict[str, tuple[np.ndarray, np.ndarray]], case: Case
) -> None:
    prompt, rows = generated_by_the_package(exact, case)
    reference_prompt, reference_rows = expected[case.name]
    np.testing.assert_array_equal(prompt, reference_prompt)
    assert rows.shape == reference_rows.shape == (STEPS, 33)
    mismatch = np.argwhere(rows != reference_rows)
    assert mismatch.size == 0, f"first mismatch (step, column): {mismatch[0].tolist()}"
    if case.prefix is not None:  # the model completes the prefix's last frames before its own
        assert (rows[0, 1 : 1 + min(case.prefix.shape[0] + 1, 32)] != 1024).all()


def _cut_one_row_early(original: Any) -> Any:
    def encode(self: PromptBuilder, *args: Any, **kwargs: Any) -> Any:
        prompt = original(self, *args, **kwargs)
        prefix = args[2] if len(args) > 2 else kwargs.get("prefix")
        return prompt if prefix is None else prompt.__class__(prompt.rows[:-1], prompt.text_tokens)

    return encode


def _start_as_a_fresh_generation(original: Any) -> Any:
    def init(self: Any, spec: Any, prompt: np.ndarray) -> None:
        original(self, spec, prompt)
        self.audio_length = min(self.audio_length, 1)

    return init


def _history_without_the_prompt(original: Any) -> Any:
    def init(self: Any, config: Any, spec: Any, prompt: np.ndarray) -> None:
        original(self, config, spec, prompt[:0])

    return init


def test_the_check_fails_on_a_wrong_cut(
    exact: Synthesizer, expected: dict[str, tuple[np.ndarray, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt that ends one gen slot early is not upstream's (its first check fails before anything runs)."""
    monkeypatch.setattr(PromptBuilder, "encode", _cut_one_row_early(PromptBuilder.encode))
    case = CASES[0]
    stream = exact.stream(SpeechRequest(TEXT, language="en", **case.request))
    assert stream.prompt is not None and stream.prompt.shape[0] == expected[case.name][0].shape[0] - 1


@pytest.mark.parametrize(
    ("mutation", "case"),
    [
        ("start", CASES[0]),  # the delay state starts as after a lone audio_start
        ("history", CASES[3]),  # the repetition penalty forgets the prompt's codes
    ],
)
def test_the_check_fails_on_a_wrong_start_or_history(
    exact: Synthesizer,
    expected: dict[str, tuple[np.ndarray, np.ndarray]],
    monkeypatch: pytest.MonkeyPatch,
    mutation: str,
    case: Case,
) -> None:
    """The same prompt, generated by other rules, gives other rows (the first of them already: a prefix frame left
    incomplete may then stop the stream at its decode, which the rows recorded as they came show anyway)."""
    rows: list[np.ndarray] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        generation = generate_rows(*args, **kwargs)
        while True:
            try:
                row = next(generation)
            except StopIteration as end:
                return end.value
            rows.append(row)
            yield row

    monkeypatch.setattr(pipeline_module, "generate_rows", recorded)
    if mutation == "start":
        DelayState = delay_module.DelayState
        monkeypatch.setattr(DelayState, "__init__", _start_as_a_fresh_generation(DelayState.__init__))
    else:
        Sampler = sampling_module.Sampler
        monkeypatch.setattr(Sampler, "__init__", _history_without_the_prompt(Sampler.__init__))
    stream = exact.stream(SpeechRequest(TEXT, language="en", sampling=_sampling(exact, case), **case.request))
    np.testing.assert_array_equal(stream.prompt, expected[case.name][0])
    with contextlib.suppress(MossTTSError):
        list(stream)
    assert rows and not np.array_equal(np.stack(rows), expected[case.name][1][: len(rows)])
