"""The prompt is the weights' own template (docs/family.md, "Prompt templates"): MOSS-TTSD's Scene and its absent
speakers, a field a template lacks refused, and a sound described without text (docs/family.md, "Sound effects"):
its prompt, its length bounds, the command line and batch lists. That the rows are upstream's, token for token, is
``test_family_reference.py``'s; MOSS-TTS's prompts, byte for byte as before, are ``test_prompt.py``'s."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import bad_input_message, prompt_text, run_cli
from tokenizers import Tokenizer

from moss_tts_node.config import LimitsConfig
from moss_tts_node.errors import RequestError
from moss_tts_node.model.family import MOSS_TTSD
from moss_tts_node.model.identity import ModelIdentity
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesis.request import SpeechRequest, check_request
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.pieces import Piece
from moss_tts_node.text.prompt import PromptBuilder, PromptFields
from moss_tts_node.timing import StopReason
from moss_tts_node.tools.dev.demo_weights import DIALOGUE_TEMPLATE

PAD = 1024
RAIN = "rain on a tin roof"


def chat(content: str) -> str:
    return "<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def weights(demo_config: Path) -> Path:
    return demo_config.parent


@pytest.fixture(scope="module")
def dialogue_builder(weights: Path) -> PromptBuilder:
    """The demo's tokenizer with MOSS-TTSD's template, as a MOSS-TTSD checkpoint's processing code gives it."""
    spec = replace(ModelSpec.load(weights), identity=ModelIdentity(MOSS_TTSD, template=DIALOGUE_TEMPLATE))
    return PromptBuilder(weights / "tokenizer", spec)


def test_a_dialogue_prompt_prints_its_scene_and_a_speaker_without_a_clip(
    dialogue_builder: PromptBuilder, weights: Path
) -> None:
    clip = np.random.default_rng(0).integers(0, 1024, size=(3, 32))
    fields = PromptFields(text="[S1]Hi. [S3]Hello.", language="en", scene="a kitchen at night")
    rows = dialogue_builder.build(fields, [clip, None, clip])
    block = "<|audio_start|>" + "<|audio_user_slot|>" * (3 + 31) + "<|audio_end|>"
    # Written out from MOSS-TTSD's template (docs/family.md, "Prompt templates"), independently of prompt.py.
    content = (
        f"<user_inst>\n- Reference(s):\n[S1]:\n{block}\n[S2]: None\n[S3]:\n{block}\n- Instruction:\nNone\n"
        "- Tokens:\nNone\n- Quality:\nNone\n- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nen\n"
        "- Scene:\na kitchen at night\n- Text:\n[S1]Hi. [S3]Hello.\n</user_inst>"
    )
    tokenizer = Tokenizer.from_file(str(weights / "tokenizer" / "tokenizer.json"))
    assert rows[:-1, 0].tolist() == tokenizer.encode(chat(content), add_special_tokens=False).ids
    assert (rows[:, 1:] != PAD).sum() == 2 * clip.size  # both clips' codes, in their own slots


@pytest.mark.parametrize("text", ["[S1]Hello! [S2]Hi.", "[S2] 42 apples", "\u4f60\u597d"])
def test_a_dialogue_voice_prefix_is_where_its_prompts_begin(dialogue_builder: PromptBuilder, text: str) -> None:
    """The KV cache keeps what comes before the text, the scene included (it is the field before the text)."""
    voice = np.random.default_rng(1).integers(0, 1024, size=(5, 32))
    fields = PromptFields(text=text, scene="a lab")
    prefix = dialogue_builder.voice_prefix(fields, [None, voice])
    prompt = dialogue_builder.encode(fields, [None, voice])
    np.testing.assert_array_equal(prompt.rows[: prefix.shape[0]], prefix)
    assert prompt.shared_rows == prefix.shape[0]
    text_ids = dialogue_builder.tokenizer.encode(text, add_special_tokens=False).ids
    assert prompt.rows[prefix.shape[0] : prefix.shape[0] + len(text_ids), 0].tolist() == text_ids
    assert prompt.text_tokens == len(text_ids)
    other_scene = dialogue_builder.voice_prefix(replace(fields, scene="a ship"), [None, voice])
    assert not np.array_equal(prefix, other_scene)


def test_a_field_the_template_lacks_is_refused_naming_the_model(synth: Synthesizer) -> None:
    with pytest.raises(
        RequestError, match=r"MOSS-TTS \(release unknown\)'s prompt has no scene field .*leave scene out"
    ):
        synth.stream("Hello.", scene="a kitchen")
    with pytest.raises(RequestError, match=r"has no scene field"):
        synth.prepare_voice(scene="a kitchen")
    with pytest.raises(RequestError, match=r"has no scene field"):
        synth.stream_text(["Hello."], scene="a kitchen")


def test_the_scene_counts_toward_the_request_length() -> None:
    limits = LimitsConfig(max_text_chars=10)
    check_request(SpeechRequest("a" * 6, scene="b" * 4), limits)
    with pytest.raises(RequestError, match=r"11 characters .*scene"):
        check_request(SpeechRequest("a" * 6, scene="b" * 5), limits)
    with pytest.raises(RequestError, match=r"scene must be a string"):
        check_request(SpeechRequest("a", scene=3), limits)  # type: ignore[arg-type]


# -- a sound, no text ------------------------------------------------------------------------------------------


def test_a_sound_prompt_prints_none_for_its_text(weights: Path) -> None:
    """What upstream's ``build_user_message(ambient_sound=..., tokens=...)`` prints: ``text`` None is ``None``."""
    builder = PromptBuilder(weights / "tokenizer", ModelSpec.load(weights))
    prompt = builder.encode(PromptFields(text=None, ambient_sound=RAIN, tokens=125))
    content = (
        "<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n- Tokens:\n125\n- Quality:\nNone\n"
        f"- Sound Event:\nNone\n- Ambient Sound:\n{RAIN}\n- Language:\nNone\n- Text:\nNone\n</user_inst>"
    )
    assert prompt.rows[:-1, 0].tolist() == builder.tokenizer.encode(chat(content), add_special_tokens=False).ids
    assert prompt.text_tokens == 0  # the None is the template's word, not a text to plan for


@pytest.fixture(scope="module")
def sound_config(family_demo: Callable[[str], Path]) -> Path:
    return family_demo("sound-effect")


@pytest.fixture(scope="module")
def sound(sound_config: Path) -> Iterator[Synthesizer]:
    with Synthesizer.from_config_file(sound_config) as loaded:
        yield loaded


def test_a_sound_without_text_is_a_sound_effect(sound: Synthesizer) -> None:
    result = sound.synthesize("", ambient_sound=RAIN, tokens=25, seed=1)
    text = prompt_text(sound, result.prompt)
    assert f"- Ambient Sound:\n{RAIN}\n" in text and "- Tokens:\n25\n" in text and "- Text:\nNone\n" in text
    assert result.codes.shape[1] == 16 and result.codes.shape[0] > 0 and np.isfinite(result.audio).all()
    assert sound.stream("  ", sound_event="a door knocks twice").estimated_seconds is None  # the model decides
    assert sound.stream("", ambient_sound=RAIN, tokens=25).estimated_seconds == 2.0  # the tokens field asks


def test_a_sound_keeps_to_every_length_bound(sound: Synthesizer, sound_config: Path) -> None:
    """``max_new_tokens`` (steps), ``max_audio_s`` (frames of the request) and the context (steps)."""
    steps = sound.synthesize("", ambient_sound=RAIN, seed=1, max_new_tokens=20)
    assert steps.generated.shape[0] <= 20 and steps.report.stop_reason is StopReason.MAX_NEW_TOKENS
    audio = sound.synthesize("", ambient_sound=RAIN, seed=1, max_audio_s=0.8)
    assert audio.codes.shape[0] <= 10 and audio.report.stop_reason is StopReason.MAX_NEW_TOKENS
    # Refused before it is planned where the caller's bound is below its tokens field; not where it has none.
    with pytest.raises(RequestError, match=r"expected to take 10\.0 s"):
        sound.stream("", ambient_sound=RAIN, tokens=125, max_expected_s=5.0)
    sound.stream("", ambient_sound=RAIN, max_expected_s=5.0, max_audio_s=5.0)
    with Synthesizer.from_config_file(sound_config, {"llama.n_ctx": 160}) as small:
        fields = PromptFields(text=None, ambient_sound=RAIN)
        (piece,) = small.planner.plan(fields, [], max_new_tokens=100_000)
    assert isinstance(piece, Piece) and piece.max_steps == small.n_ctx - piece.prompt.shape[0]


def test_what_is_not_a_sound_effect_is_refused(sound: Synthesizer) -> None:
    with pytest.raises(RequestError, match=r"the text is empty"):
        sound.stream("")  # nothing described
    with pytest.raises(RequestError, match=r"a sound without text cannot continue a recording"):
        sound.stream("", ambient_sound=RAIN, prefix=np.zeros((5, 16), dtype=np.int64), prefix_text="Hi.")


def test_the_cli_makes_a_sound_without_text(sound_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "rain.wav"
    done = run_cli("synth", "--config", sound_config, "--ambient-sound", RAIN, "--tokens", "25", "--output", out)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 44
    message = bad_input_message("synth", "--config", sound_config, "--output", out)
    assert "nothing to say: give --text, or --ambient-sound or --sound-event" in message


def test_a_batch_line_may_be_a_sound(sound_config: Path, tmp_path: Path) -> None:
    lines = tmp_path / "sounds.jsonl"
    lines.write_text(
        json.dumps({"id": "rain", "ambient_sound": RAIN, "tokens": 25, "seed": 1})
        + "\n"
        + json.dumps({"id": "nothing", "language": "en"})
        + "\n"
    )
    done = run_cli("batch", lines, "--out", tmp_path / "out", "--config", sound_config)
    assert done.returncode == 1, done.stderr  # one line failed, the other was done
    rows = {row["id"]: row for row in map(json.loads, (tmp_path / "out" / "summary.jsonl").read_text().splitlines())}
    assert rows["rain"]["status"] == "done" and (tmp_path / "out" / "rain.wav").is_file()
    assert "every line needs one but a sound" in rows["nothing"]["error"]
