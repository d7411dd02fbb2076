"""A checkpoint's prompt template: read from its processing code without running it, kept with the weights, and
rendered by the runtime.

The processing modules here are written for these tests in the shape upstream's have (docs/family.md, "Prompt
templates"): a template string constant filled in by ``.replace`` calls, and f-strings for the speakers' lines.
None of them is ever imported or run; a ``raise`` at the top of each proves it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.template import MOSS_TTS_TEMPLATE, PromptTemplate
from moss_tts_node.tools.prepare.prompt_template import (
    TemplateError,
    processing_file,
    read_prompt_template,
    template_from_source,
)

NEVER_RUN = 'raise SystemExit("this module is read, never run")\n'

# The shape of upstream's MOSS-TTS processor: the eight fields, a speaker without a clip left out.
SPEECH = (
    NEVER_RUN
    + '''
from dataclasses import dataclass

CLIP_MARK = "<|audio|>"


@dataclass
class Turn:
    text: object = None
    voices: object = None
    style: object = None
    frames: object = None
    grade: object = None
    event: object = None
    ambience: object = None
    lang: object = None

    def render(self):
        layout = """<user_inst>
- Reference(s):
{reference}
- Instruction:
{instruction}
- Tokens:
{tokens}
- Quality:
{quality}
- Sound Event:
{sound_event}
- Ambient Sound:
{ambient_sound}
- Language:
{language}
- Text:
{text}
</user_inst>"""
        if self.voices is None:
            shown = "None"
        else:
            shown = "\\n".join(
                f"[S{number + 1}]:\\n{CLIP_MARK}" for number, clip in enumerate(self.voices) if clip is not None
            )
        return (
            layout.replace("{reference}", str(shown))
            .replace("{instruction}", str(self.style))
            .replace("{tokens}", str(self.frames))
            .replace("{quality}", str(self.grade))
            .replace("{sound_event}", str(self.event))
            .replace("{ambient_sound}", str(self.ambience))
            .replace("{language}", str(self.lang))
            .replace("{text}", str(self.text))
        )


class Processor:
    def __init__(self, tokenizer, normalize_inputs=False):
        self.tokenizer = tokenizer
        self.normalize_inputs = normalize_inputs
'''
)

# The shape two ports give MOSS-TTSD's: a Scene field before the text, a speaker without a clip printed as None,
# filled in with .format.
DIALOGUE = (
    NEVER_RUN
    + """
AUDIO_SLOT = "<|audio|>"
USER_LAYOUT = (
    "<user_inst>\\n- Reference(s):\\n{reference}\\n- Instruction:\\n{instruction}\\n- Tokens:\\n{tokens}\\n"
    "- Quality:\\n{quality}\\n- Sound Event:\\n{sound_event}\\n- Ambient Sound:\\n{ambient_sound}\\n"
    "- Language:\\n{language}\\n- Scene:\\n{scene}\\n- Text:\\n{text}\\n</user_inst>"
)


def speaker_lines(references):
    lines = []
    for index, clip in enumerate(references):
        if clip is None:
            lines.append(f"[S{index + 1}]: None")
        else:
            lines.append(f"[S{index + 1}]:\\n{AUDIO_SLOT}")
    return "\\n".join(lines)


def user_turn(text=None, references=None, scene=None, **others):
    return USER_LAYOUT.format(
        reference=str(None if references is None else speaker_lines(references)),
        instruction=str(others.get("instruction")),
        tokens=str(others.get("tokens")),
        quality=str(others.get("quality")),
        sound_event=str(others.get("sound_event")),
        ambient_sound=str(others.get("ambient_sound")),
        language=str(others.get("language")),
        scene=str(scene),
        text=str(text),
    )
"""
)

# Adjacent string literals are one constant to Python: the dialogue layout above is one template.
DIALOGUE_FIELDS = [name for _, name in MOSS_TTS_TEMPLATE.fields[:-1]] + ["scene", "text"]


def test_a_speech_processor_reads_as_moss_tts_template() -> None:
    template = template_from_source(SPEECH, "processing_speech.py")
    assert template.fields == MOSS_TTS_TEMPLATE.fields
    assert (template.speaker, template.absent_speaker, template.audio_placeholder) == (
        "[S{n}]:\n<|audio|>",
        None,
        "<|audio|>",
    )
    assert template.source == "processing_speech.py" and not template.has_scene
    assert template.user_content({"text": "Hi."}, [True]) == MOSS_TTS_TEMPLATE.user_content({"text": "Hi."}, [True])


def test_a_dialogue_processor_has_a_scene_and_prints_a_missing_speaker() -> None:
    template = template_from_source(DIALOGUE, "processing_dialogue.py")
    assert list(template.names) == DIALOGUE_FIELDS and template.has_scene
    assert template.absent_speaker == "[S{n}]: None"
    content = template.user_content({"text": "[S1] Hi. [S3] Hello.", "scene": "a kitchen"}, [True, False, True])
    assert content == (
        "<user_inst>\n- Reference(s):\n[S1]:\n<|audio|>\n[S2]: None\n[S3]:\n<|audio|>\n- Instruction:\nNone\n"
        "- Tokens:\nNone\n- Quality:\nNone\n- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nNone\n"
        "- Scene:\na kitchen\n- Text:\n[S1] Hi. [S3] Hello.\n</user_inst>"
    )


def test_the_rendered_content_is_what_the_prompt_format_prints() -> None:
    """docs/model.md, "Prompt format", written out: today's prompt builder prints exactly this."""
    content = MOSS_TTS_TEMPLATE.user_content({"text": "Hello.", "language": "en", "tokens": 40}, [True, True])
    assert content == (
        "<user_inst>\n- Reference(s):\n[S1]:\n<|audio|>\n[S2]:\n<|audio|>\n- Instruction:\nNone\n- Tokens:\n40\n"
        "- Quality:\nNone\n- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nen\n- Text:\nHello.\n"
        "</user_inst>"
    )
    without_clips = MOSS_TTS_TEMPLATE.user_content({"text": None, "ambient_sound": "rain"})
    assert "- Reference(s):\nNone\n" in without_clips and without_clips.endswith("- Text:\nNone\n</user_inst>")
    # A missing speaker is left out where the template says nothing of it (upstream's [None, R] prints [S2] only).
    assert "- Reference(s):\n[S2]:\n<|audio|>\n" in MOSS_TTS_TEMPLATE.user_content({"text": "x"}, [False, True])
    # Up to the text: what a voice's requests share (the KV cache keeps it).
    prefix = MOSS_TTS_TEMPLATE.user_content({"language": "en", "tokens": 40}, [True, True], stop_before="text")
    assert content == prefix + "Hello.\n</user_inst>"
    with pytest.raises(ValueError, match="no field 'scene'"):
        MOSS_TTS_TEMPLATE.user_content({"text": "x", "scene": "a kitchen"})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (  # the template assembled at run time: nothing to read
            NEVER_RUN
            + 'LABELS = {"reference": "Reference(s)", "text": "Text"}\n'
            + 'def layout():\n    return "\\n".join(f"- {label}:\\n{{{name}}}" for name, label in LABELS.items())\n',
            r"no user-turn template found",
        ),
        (SPEECH.replace('.replace("{quality}", str(self.grade))', ""), r"\{quality\} is never filled in"),
        (
            SPEECH.replace('.replace("{language}", str(self.lang))', '.replace("{language}", self.lang or "")'),
            r"\{language\} is filled with `self\.lang or ''`, not str",
        ),
        (SPEECH.replace("[S{number + 1}]", "[S{number}]"), r"speakers are numbered by `number`"),
        (SPEECH + '\nOTHER = """<user_inst>\n- Text:\n{text}\n</user_inst>"""\n', r"2 different user-turn templates"),
        (SPEECH.replace("- Text:\n{text}\n", ""), r"must be distinct, hold 'reference' and end with 'text'"),
        ("def broken(:\n", r"not Python this reader can parse"),
    ],
    ids=["assembled", "unfilled", "not-str", "numbering", "two-templates", "no-text", "syntax"],
)
def test_what_cannot_be_read_is_refused_saying_what(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        template_from_source(source, "processing_x.py")


def test_the_processing_file_is_found_and_absent_means_moss_tts(tmp_path: Path) -> None:
    assert processing_file(tmp_path) is None and read_prompt_template(tmp_path) == MOSS_TTS_TEMPLATE
    (tmp_path / "processing_dialogue.py").write_text(DIALOGUE)
    assert read_prompt_template(tmp_path).has_scene
    (tmp_path / "processing_speech.py").write_text(SPEECH)
    with pytest.raises(TemplateError, match=r"2 processing modules .* no auto_map"):
        processing_file(tmp_path)
    auto_map = {"auto_map": {"AutoProcessor": "processing_speech.Processor"}}
    (tmp_path / "processor_config.json").write_text(json.dumps(auto_map))
    assert processing_file(tmp_path) == tmp_path / "processing_speech.py"


def test_a_template_round_trips_through_the_record_and_a_damaged_one_is_refused() -> None:
    template = template_from_source(DIALOGUE, "processing_dialogue.py")
    assert PromptTemplate.from_json(json.loads(json.dumps(template.to_json())), "here") == template
    damaged = {**template.to_json(), "fields": [["Text"]]}
    with pytest.raises(
        WeightsError, match=r"here is not a prompt template that convert wrote .*convert the checkpoint"
    ):
        PromptTemplate.from_json(damaged, "here")
    with pytest.raises(WeightsError, match="here is not a prompt template"):
        PromptTemplate.from_json({**template.to_json(), "fields": [["Text", "text"]]}, "here")
