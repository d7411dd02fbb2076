"""Continuation and several references, token for token against upstream, restated independently.

The reference (``upstream_reference.Upstream``) restates upstream's processor and ``generate()`` from their code, not
from the package, and runs them greedy on the demo model's original checkpoint (bfloat16 safetensors) through the
float64 NumPy Qwen3 of ``qwen3_reference``. The package runs the same model converted to an F32 GGUF, in llama.cpp,
with its exact NumPy heads; its prompt and its generated rows must equal the reference's. The last test makes sure
the comparison can fail: a wrong cut, a wrong start of the delay state or a history without the prompt breaks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qwen3_reference import exact_synthesizer, recorded_rows
from threadpoolctl import threadpool_limits
from upstream_reference import Upstream

from moss_tts_node.config import SamplingConfig
from moss_tts_node.errors import MossTTSError
from moss_tts_node.model import delay as delay_module
from moss_tts_node.model import sampling as sampling_module
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.prompt import PromptBuilder
from moss_tts_node.tools.dev.demo_weights import CHECKPOINT_DIR

STEPS = 40  # past the ramp of every codebook (n_vq + 1 steps), whatever the prefix's length
TRANSCRIPT = "Hello there, robot."
TEXT = "The quick brown fox jumps over the lazy dog."


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
        return prompt if prefix is None else replace(prompt, rows=prompt.rows[:-1])

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
    rows = recorded_rows(monkeypatch)
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
