"""The prompt template a checkpoint's own processing code builds, read from its source without running it.

A Hugging Face checkpoint of the family ships ``processing_*.py`` (loaded with ``trust_remote_code``), and the
family's differ (docs/family.md, "Prompt templates"). ``convert`` must not run that code, so it parses it with
``ast`` and reads what upstream's processors write in plain sight:

- the user turn's template: one string constant of the shape ``<tag>\\n- Label:\\n{field}\\n ... </tag>``, its
  ``{field}`` placeholders each filled in by a ``.replace("{field}", str(...))`` call (or a ``.format`` keyword):
  ``str()`` of an absent value prints ``None``;
- how a speaker's reference prints: the f-strings that begin ``[S{i + 1}]:``, the one holding the audio
  placeholder (a speaker with a clip) and, where there is one, the other (a speaker without one; a processor
  without it leaves such a speaker out).

Anything else (no such template, several, a field never filled in, a value printed some other way, speakers
numbered otherwise) is refused, naming what could not be read: a template guessed wrong would make every
prompt one the model was not trained on.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from moss_tts_node.model.template import MOSS_TTS_TEMPLATE, SPEAKER_NUMBER, PromptTemplate
from moss_tts_node.tools.prepare.config_reader import read_json_object

PROCESSING_GLOB = "processing_*.py"
# The files whose auto_map names the processor class ("module.Class"), where a checkpoint holds several modules.
_AUTO_MAP_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json", "config.json")
_TEMPLATE = re.compile(r"<(?P<tag>[\w-]+)>\n(?P<body>(?:- [^\n]+:\n\{\w+\}\n)+)</(?P=tag)>")
_FIELD = re.compile(r"- (?P<label>[^\n]+):\n\{(?P<name>\w+)\}\n")
_SPEAKER_START = "[S"
_SPEAKER_AFTER_NUMBER = "]:"
_SPECIAL_TOKEN = re.compile(r"<\|[\w-]+\|>")  # an audio placeholder written into the f-string itself


class TemplateError(ValueError):
    """The processing code does not say its template in a form this reader knows; the message says what."""


def read_prompt_template(checkpoint_dir: Path) -> PromptTemplate:
    """The template of the checkpoint's processing code, or MOSS-TTS's when it ships none; TemplateError when
    it ships code whose template cannot be read."""
    path = processing_file(Path(checkpoint_dir))
    if path is None:
        return MOSS_TTS_TEMPLATE
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TemplateError(f"{path}: not readable as text ({error})") from None
    return template_from_source(source, path.name)


def processing_file(checkpoint_dir: Path) -> Path | None:
    """The checkpoint's processing module: the only ``processing_*.py``, or the one an ``auto_map`` names."""
    found = sorted(checkpoint_dir.glob(PROCESSING_GLOB))
    if len(found) <= 1:
        return found[0] if found else None
    for name in _AUTO_MAP_FILES:
        path = checkpoint_dir / name
        if not path.is_file():
            continue
        auto_map = read_json_object(path, TemplateError, "").get("auto_map")
        processor = auto_map.get("AutoProcessor") if isinstance(auto_map, dict) else None
        if isinstance(processor, str) and (checkpoint_dir / f"{processor.rsplit('.', 1)[0]}.py") in found:
            return checkpoint_dir / f"{processor.rsplit('.', 1)[0]}.py"
    raise TemplateError(
        f"{checkpoint_dir} holds {len(found)} processing modules ({', '.join(p.name for p in found)}) and no auto_map "
        "that names its AutoProcessor: remove the ones the checkpoint does not use"
    )


def template_from_source(source: str, name: str) -> PromptTemplate:
    """The template that the processing module ``source`` (file ``name``, for messages) builds."""
    try:
        tree = ast.parse(source, name)
    except SyntaxError as error:
        raise TemplateError(f"{name}: not Python this reader can parse ({error.msg}, line {error.lineno})") from None
    constants = _module_strings(tree)
    opening, fields, closing = _template(tree, name)
    _check_filled(tree, name, [field for _, field in fields])
    speaker, absent_speaker, placeholder = _speaker_forms(tree, name, constants)
    try:
        return PromptTemplate(
            fields=tuple(fields),
            opening=opening,
            closing=closing,
            speaker=speaker,
            absent_speaker=absent_speaker,
            audio_placeholder=placeholder,
            source=name,
        )
    except ValueError as error:
        raise TemplateError(f"{name}: {error}") from None


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` assignments (the audio placeholder is one)."""
    strings = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            strings.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
    return strings


def _template(tree: ast.Module, name: str) -> tuple[str, list[tuple[str, str]], str]:
    """(opening tag, (label, field) pairs, closing tag) of the one template string constant."""
    found = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _TEMPLATE.fullmatch(node.value)
    }
    if len(found) != 1:
        what = "no user-turn template" if not found else f"{len(found)} different user-turn templates"
        raise TemplateError(
            f"{name}: {what} found (one string constant of '- Label:' lines, each followed by a "
            "'{field}' line, between <tag> and </tag>): this reader cannot tell which prompt the checkpoint expects"
        )
    template = found.pop()
    match = _TEMPLATE.fullmatch(template)
    assert match is not None
    fields = [(field["label"], field["name"]) for field in _FIELD.finditer(match["body"])]
    return f"<{match['tag']}>", fields, f"</{match['tag']}>"


def _check_filled(tree: ast.Module, name: str, fields: list[str]) -> None:
    """Every placeholder is filled in with ``str(...)`` of its value (so an absent value prints ``None``)."""
    fills: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr == "replace" and len(node.args) == 2 and isinstance(node.args[0], ast.Constant):
            placeholder = node.args[0].value
            if isinstance(placeholder, str) and placeholder.startswith("{") and placeholder.endswith("}"):
                fills[placeholder[1:-1]] = node.args[1]
        elif node.func.attr == "format":
            fills.update({keyword.arg: keyword.value for keyword in node.keywords if keyword.arg})
    for field in fields:
        if field not in fills:
            raise TemplateError(f"{name}: the template's {{{field}}} is never filled in (no .replace or .format)")
        value = fills[field]
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "str"):
            raise TemplateError(
                f"{name}: {{{field}}} is filled with `{ast.unparse(value)}`, not str(...) of it: this reader cannot "
                "tell how the checkpoint prints it when it is absent"
            )


def _speaker_forms(tree: ast.Module, name: str, constants: dict[str, str]) -> tuple[str, str | None, str]:
    """(how a speaker with a clip prints, how one without prints or None, the audio placeholder)."""
    with_clip: set[tuple[str, str]] = set()
    without_clip: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            form = _speaker_form(node, name, constants)
            if form is None:
                continue
            text, placeholder = form
            if placeholder is None:
                without_clip.add(text)
            else:
                with_clip.add((text, placeholder))
    if len(with_clip) != 1 or len(without_clip) > 1:
        raise TemplateError(
            f"{name}: found {len(with_clip)} ways to print a speaker's reference clip and {len(without_clip)} to print "
            "a speaker without one (f-strings beginning '[S{...}]:'); this reader knows one of the first, and at most "
            "one of the second"
        )
    speaker, placeholder = with_clip.pop()
    return speaker, (without_clip.pop() if without_clip else None), placeholder


def _speaker_form(node: ast.JoinedStr, name: str, constants: dict[str, str]) -> tuple[str, str | None] | None:
    """An f-string ``[S{i + 1}]:...`` as (text with ``{n}`` for the number, the audio placeholder in it or None);
    None for any other f-string."""
    parts = node.values
    if not (
        len(parts) >= 2
        and isinstance(parts[0], ast.Constant)
        and parts[0].value == _SPEAKER_START
        and isinstance(parts[1], ast.FormattedValue)
    ):
        return None
    rest = parts[2:]
    if not (rest and isinstance(rest[0], ast.Constant) and str(rest[0].value).startswith(_SPEAKER_AFTER_NUMBER)):
        return None
    number = parts[1].value
    if not (
        isinstance(number, ast.BinOp)
        and isinstance(number.op, ast.Add)
        and isinstance(number.right, ast.Constant)
        and number.right.value == 1
    ):
        raise TemplateError(
            f"{name}: speakers are numbered by `{ast.unparse(number)}` in `{ast.unparse(node)}`; this reader knows "
            "a count from 0 plus 1 (speakers from S1)"
        )
    text, placeholder = _SPEAKER_START + SPEAKER_NUMBER, None
    for part in rest:
        if isinstance(part, ast.Constant):
            text += str(part.value)
            continue
        assert isinstance(part, ast.FormattedValue)
        value = constants.get(part.value.id) if isinstance(part.value, ast.Name) else None
        if value is None:
            raise TemplateError(
                f"{name}: `{ast.unparse(node)}` prints `{ast.unparse(part.value)}`, which is not a string constant of "
                "the module: this reader cannot tell what a speaker's line holds"
            )
        text, placeholder = text + value, value
    if placeholder is None and (inline := _SPECIAL_TOKEN.search(text)):
        placeholder = inline.group()
    return text, placeholder
