"""The 16-codebook models, token for token against upstream restated (``upstream_reference.Upstream``), greedy.

Each model's demo checkpoint (16 codebooks, in the real formats: bfloat16 safetensors and its processing code) runs
through the reference, and through the package converted to an F32 GGUF with its exact NumPy heads: a voice designed
from an instruction (MOSS-VoiceGenerator), with and without its card's repetition penalty; a sound described with no
text (MOSS-SoundEffect, as its card's ``build_user_message(ambient_sound=..., tokens=...)``); two speakers continuing a
prefix with MOSS-TTSD's own template (its Scene, and ``[S1]: None`` for a speaker without a clip), and its card's two
clips one after the other. Prompt and rows must be equal; the last tests make sure the comparison can fail (a wrong
template field, penalty set, cut or text).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qwen3_reference import exact_synthesizer, recorded_rows
from threadpoolctl import threadpool_limits
from upstream_reference import Upstream

from moss_tts_node.errors import MossTTSError
from moss_tts_node.model import sampling as sampling_module
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.prompt import PromptBuilder
from moss_tts_node.tools.dev.demo_weights import CHECKPOINT_DIR

STEPS = 40  # past the ramp of every codebook (17 steps at 16 codebooks)
N_VQ = 16
TEXT = "The quick brown fox jumps over the lazy dog."
INSTRUCTION = "a warm, low voice of an old man"
RAIN = "rain on a tin roof"
DIALOGUE = "[S1]The quick brown fox. [S2]Jumps over the lazy dog."
# MOSS-TTSD's processor, as two ports reproduce it (docs/family.md, "Prompt templates"): a Scene before the text,
# and a speaker without a clip written as None.
DIALOGUE_TEMPLATE = (
    "<user_inst>\n- Reference(s):\n{reference}\n- Instruction:\n{instruction}\n- Tokens:\n{tokens}\n"
    "- Quality:\n{quality}\n- Sound Event:\n{sound_event}\n- Ambient Sound:\n{ambient_sound}\n"
    "- Language:\n{language}\n- Scene:\n{scene}\n- Text:\n{text}\n</user_inst>"
)
ABSENT_SPEAKER = "[S{n}]: None"
ALICE = np.random.default_rng(41).integers(0, 1024, size=(9, N_VQ))
BOB = np.random.default_rng(42).integers(0, 1024, size=(12, N_VQ))


@dataclass(frozen=True)
class Case:
    """A request as the package takes it, and the same request as upstream's processor takes it."""

    name: str
    model: str
    request: dict[str, Any]  # SpeechRequest's fields
    upstream: dict[str, Any]  # Upstream.generation's or .continuation's arguments
    penalty: float


VOICE_DESIGN = Case(
    "voice design",
    "voice-generator",
    {"text": TEXT, "language": "en", "instruction": INSTRUCTION},
    {"text": TEXT, "references": None, "instruction": INSTRUCTION},
    1.0,
)
CASES = [
    VOICE_DESIGN,
    replace(VOICE_DESIGN, name="voice design, the card's penalty", penalty=1.1),
    Case(
        "sound without text",
        "sound-effect",
        {"text": "", "ambient_sound": RAIN, "tokens": 50},
        {"text": None, "references": None, "ambient_sound": RAIN, "tokens": 50, "language": None},
        1.2,
    ),
    Case(
        "two speakers, [S1] without a clip, continuing [S2]",
        "moss-ttsd",
        {
            "text": DIALOGUE,
            "language": "en",
            "voice": [None, BOB],
            "prefix": BOB,
            "prefix_text": "[S2] Hello there, robot.",
            "scene": "a quiet lab at night",
        },
        {
            "text": f"[S2] Hello there, robot. {DIALOGUE}",
            "references": [None, BOB],
            "prefix": BOB,
            "scene": "a quiet lab at night",
        },
        1.1,
    ),
    Case(
        "two speakers continuing their clips, as the card",
        "moss-ttsd",
        {
            "text": DIALOGUE,
            "language": "en",
            "voice": [ALICE, BOB],
            "prefix": np.concatenate([ALICE, BOB]),
            "prefix_text": "[S1] Hello robot. [S2] Hello there.",
        },
        {
            "text": f"[S1] Hello robot. [S2] Hello there. {DIALOGUE}",
            "references": [ALICE, BOB],
            "prefix": np.concatenate([ALICE, BOB]),
        },
        1.1,
    ),
]
MODELS = sorted({case.model for case in CASES})


@pytest.fixture(scope="module")
def demos(family_demo: Callable[[str], Path]) -> dict[str, Path]:
    """Each model's demo config.yaml."""
    return {model: family_demo(model) for model in MODELS}


@pytest.fixture(scope="module")
def exact(demos: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Synthesizer]]:
    """Each demo converted to F32, F32 KV cache, exact NumPy heads, greedy."""
    overrides = {"audio.heads_backend": "numpy", "generation.max_new_tokens": STEPS}
    with contextlib.ExitStack() as stack:
        yield {
            model: stack.enter_context(exact_synthesizer(config, tmp_path_factory.mktemp(f"{model}-f32"), **overrides))
            for model, config in demos.items()
        }


@pytest.fixture(scope="module")
def expected(demos: dict[str, Path]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each case's (prompt, generated rows) by the reference (BLAS on one thread, as in the continuation tests)."""
    results = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for case in CASES:
            checkpoint = demos[case.model].parent / CHECKPOINT_DIR
            dialogue = case.model == "moss-ttsd"
            upstream = Upstream(checkpoint, DIALOGUE_TEMPLATE, ABSENT_SPEAKER) if dialogue else Upstream(checkpoint)
            fields = dict(case.upstream)
            text, references, prefix = fields.pop("text"), fields.pop("references"), fields.pop("prefix", None)
            if prefix is None:
                prompt = upstream.generation(text, references, **fields)
            else:
                prompt = upstream.continuation(text, references, prefix, **fields)
            results[case.name] = prompt, upstream.generate(prompt, STEPS, case.penalty)
    return results


def request(synth: Synthesizer, case: Case) -> SpeechRequest:
    sampling = replace(synth.config.sampling, audio_repetition_penalty=case.penalty)
    return SpeechRequest(**case.request, sampling=sampling)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_prompt_and_greedy_rows_are_upstreams(
    exact: dict[str, Synthesizer], expected: dict[str, tuple[np.ndarray, np.ndarray]], case: Case
) -> None:
    synth = exact[case.model]
    assert synth.spec.n_vq == N_VQ
    stream = synth.stream(request(synth, case))
    list(stream)
    reference_prompt, reference_rows = expected[case.name]
    np.testing.assert_array_equal(stream.prompt, reference_prompt)
    assert stream.generated is not None and stream.generated.shape == reference_rows.shape == (STEPS, 1 + N_VQ)
    mismatch = np.argwhere(stream.generated != reference_rows)
    assert mismatch.size == 0, f"first mismatch (step, column): {mismatch[0].tolist()}"


def test_the_penalty_changes_the_rows_here(expected: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """So that the penalty cases hold the package to its rule, not to rows any rule would give."""
    assert not np.array_equal(expected[CASES[0].name][1], expected[CASES[1].name][1])


# -- the comparison can fail --------------------------------------------------------------------------------------


def test_the_check_fails_on_a_wrong_template_field(
    exact: dict[str, Synthesizer], expected: dict[str, tuple[np.ndarray, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MOSS-TTSD's prompt with GitHub's writing of an absent speaker (none) is not its processor's."""
    case = CASES[3]
    synth = exact[case.model]
    monkeypatch.setattr(synth.prompts, "template", replace(synth.prompts.template, absent_speaker=None))
    stream = synth.stream(request(synth, case))
    assert stream.prompt is not None and stream.prompt.shape != expected[case.name][0].shape


def test_the_check_fails_on_a_wrong_cut_or_text(
    exact: dict[str, Synthesizer], expected: dict[str, tuple[np.ndarray, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A continuation cut one gen slot early, and a sound whose text prints empty instead of None."""
    original = PromptBuilder.encode

    def mutated(self: PromptBuilder, fields: Any, references: Any = (), prefix: Any = None) -> Any:
        if fields.text is None:
            return original(self, replace(fields, text=""), references, prefix)
        prompt = original(self, fields, references, prefix)
        return prompt if prefix is None else replace(prompt, rows=prompt.rows[:-1])

    monkeypatch.setattr(PromptBuilder, "encode", mutated)
    for case in (CASES[2], CASES[3]):
        synth = exact[case.model]
        stream = synth.stream(request(synth, case))
        assert stream.prompt is not None and not np.array_equal(stream.prompt[:, 0], expected[case.name][0][:, 0])


def test_the_check_fails_on_a_wrong_penalty_set(
    exact: dict[str, Synthesizer], expected: dict[str, tuple[np.ndarray, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Channels 1.. penalised over column 1 alone, not over the union of theirs: other rows."""
    rows = recorded_rows(monkeypatch)

    def observe(self: Any, audio_rows: np.ndarray) -> None:
        audio_rows = np.atleast_2d(audio_rows)
        self._seen_first[audio_rows[:, 0]] = True
        self._seen_rest[audio_rows[:, 1]] = True

    monkeypatch.setattr(sampling_module.Sampler, "observe", observe)
    case = CASES[1]
    synth = exact[case.model]
    stream = synth.stream(request(synth, case))
    np.testing.assert_array_equal(stream.prompt, expected[case.name][0])
    with contextlib.suppress(MossTTSError):
        list(stream)
    assert rows and not np.array_equal(np.stack(rows), expected[case.name][1][: len(rows)])
