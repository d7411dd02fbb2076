"""The 31 languages of MOSS-TTS-v1.5: accepted as codes or names by the core, the config and the CLI; refused
otherwise, with the list that fixes it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import bad_input_message

from moss_tts_node.config import load_config
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.languages import ADDED_IN_V1_5, LANGUAGES, language_code, language_tag
from moss_tts_node.text.prompt import PromptFields

# Upstream's model card table (docs/model.md, "MOSS-TTS-v1.5"), retyped: the module must hold exactly these.
UPSTREAM_CODES = [
    "zh",
    "yue",
    "en",
    "ar",
    "cs",
    "da",
    "nl",
    "fi",
    "fr",
    "de",
    "el",
    "he",
    "hi",
    "hu",
    "it",
    "ja",
    "ko",
    "mk",
    "ms",
    "fa",
    "pl",
    "pt",
    "ro",
    "ru",
    "es",
    "sw",
    "sv",
    "tl",
    "th",
    "tr",
    "vi",
]
V1_0_CODES = [
    "zh",
    "en",
    "de",
    "es",
    "fr",
    "ja",
    "it",
    "he",
    "ko",
    "ru",
    "fa",
    "ar",
    "pl",
    "pt",
    "cs",
    "da",
    "sv",
    "hu",
    "el",
    "tr",
]  # 1.0's README table


def test_the_codes_are_upstreams_31_and_v1_5_added_eleven_to_1_0s_twenty() -> None:
    assert list(LANGUAGES) == UPSTREAM_CODES
    assert sorted(set(LANGUAGES) - set(ADDED_IN_V1_5)) == sorted(V1_0_CODES)
    assert len(set(LANGUAGES.values())) == 31


@pytest.mark.parametrize(
    ("given", "prompt_gets"),
    [
        ("fr", "fr"),
        ("FR", "fr"),
        (" fr ", "fr"),
        ("French", "French"),
        ("french", "French"),
        ("yue", "yue"),
        ("Cantonese", "Cantonese"),
        ("Persian", "Persian"),
        ("vi", "vi"),
    ],
)
def test_a_code_or_a_name_in_any_case_gets_upstreams_spelling(given: str, prompt_gets: str) -> None:
    assert language_tag(given) == prompt_gets


@pytest.mark.parametrize("given", ["xx", "Klingon", "", "en-US", "zh_CN", "Mandarin"])
def test_anything_else_is_refused_with_the_list(given: str) -> None:
    with pytest.raises(ValueError, match=r"unknown language .*: give one of the codes zh, yue, en, .*, vi, or its"):
        language_tag(given)
    with pytest.raises(ValueError, match=r"unknown language"):
        language_code(given)


def test_every_spelling_of_a_language_has_its_code() -> None:
    for code, name in LANGUAGES.items():
        for spelling in (code, code.upper(), name, name.lower(), f" {name} "):
            assert language_code(spelling) == code


def test_the_config_checks_generation_language_when_it_loads(demo_config: Path) -> None:
    assert load_config(demo_config, {"generation.language": "French"}).generation.language == "French"
    with pytest.raises(ConfigError, match=r"config\.yaml: 'generation\.language': unknown language 'Klingon'"):
        load_config(demo_config, {"generation.language": "Klingon"})


def test_the_cli_refuses_a_language_before_loading_the_model(demo_config: Path, tmp_path: Path) -> None:
    line = bad_input_message(
        "synth", "--config", demo_config, "--text", "Hi.", "--language", "xx", "--output", tmp_path / "a.wav"
    )
    assert line.startswith("error: unknown language 'xx': give one of the codes zh, yue, en")
    assert not (tmp_path / "a.wav").exists()


def test_a_request_language_is_checked_and_spelled_as_upstream_does(synth: Synthesizer) -> None:
    with pytest.raises(RequestError, match=r"unknown language 'Klingon'"):
        synth.stream("Hello.", language="Klingon")
    for given, expected in (("FRENCH", "French"), ("Fr", "fr")):
        stream = synth.stream("Hello.", language=given)  # not iterated: nothing is generated
        assert (stream.prompt == synth.prompts.build(PromptFields(text="Hello.", language=expected))).all()
    config = replace(synth.config, generation=replace(synth.config.generation, language="ZH"))
    default = synth.stream("Hello.", config=config)  # the configured default is spelled the same way
    assert (default.prompt == synth.prompts.build(PromptFields(text="Hello.", language="zh"))).all()
