"""Which model of the family a checkpoint is, told from what it holds, for the record ``convert`` writes.

Upstream's ``config.json`` names no model (every one is ``moss_tts_delay``), and the Hugging Face cards of
MOSS-TTSD, -VoiceGenerator and -SoundEffect are the family's common page (docs/family.md, "Converting"), so a
checkpoint tells which model it is only through a few signs:

- its processing code's template has a ``Scene`` field: only MOSS-TTSD's has one;
- its backbone has Qwen3-1.7B's shape (hidden 2048, 28 layers): in the family only MOSS-VoiceGenerator;
- 32 codebooks and neither sign: MOSS-TTS, whose card's language list then tells 1.0 from v1.5
  (docs/model.md, "MOSS-TTS-v1.5").

Where none tells, ``convert --model`` must; where a sign and ``--model`` disagree, or the model cannot have the
checkpoint's codebook count, the conversion is refused, naming both.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from moss_tts_node.model.family import DELAY_FAMILY, MOSS_TTS, MOSS_TTSD, VOICE_GENERATOR, FamilyModel
from moss_tts_node.model.identity import V1_0, V1_5, ModelIdentity
from moss_tts_node.model.template import PromptTemplate
from moss_tts_node.text.languages import ADDED_IN_V1_5, LANGUAGES
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape

MODEL_CARD_FILE = "README.md"
VOICE_GENERATOR_SHAPE = (2048, 28)  # Qwen3-1.7B's hidden size and layers


class IdentityError(ValueError):
    """The checkpoint's model cannot be told, or is not what it must be; the message says what differs."""


def identify(
    checkpoint_dir: Path, shape: Qwen3Shape, n_vq: int, template: PromptTemplate, model: str | None = None
) -> ModelIdentity:
    """The identity of the checkpoint in ``checkpoint_dir`` (backbone ``shape``, ``n_vq`` codebooks, processing
    code's ``template``); ``model``: a key of FAMILY that ``convert --model`` gave, or None."""
    signs = _signs(shape, template)
    if model is not None:
        if model not in DELAY_FAMILY:
            raise IdentityError(
                f"--model {model} is not a model of the MossTTSDelay family, which this checkpoint is: "
                f"choose one of {', '.join(DELAY_FAMILY)}"
            )
        chosen, evidence = DELAY_FAMILY[model], f"convert --model {model}"
        for other, sign in signs:
            if other is MOSS_TTSD and other is not chosen:  # processing code is the checkpoint's own word
                raise IdentityError(f"--model {model} says {chosen.name}, but {sign}: check which checkpoint this is")
    elif len({other for other, _ in signs}) > 1:
        told = "; ".join(f"{sign}" for _, sign in signs)
        raise IdentityError(f"the checkpoint shows signs of two models ({told}): say which with --model")
    elif signs:
        chosen, evidence = signs[0]
    elif n_vq in MOSS_TTS.codebooks:
        chosen, evidence = MOSS_TTS, f"{n_vq} codebooks, and no sign of another model of the family"
    else:
        candidates = [m for m in DELAY_FAMILY.values() if n_vq in m.codebooks]
        raise IdentityError(
            f"config.json's n_vq is {n_vq}, and nothing in the checkpoint tells which model of the family it is "
            f"({_models_with(n_vq, candidates)}; their model cards are the family's common page): pass --model "
            + " or --model ".join(m.key for m in candidates or DELAY_FAMILY.values())
        )
    if n_vq not in chosen.codebooks:
        raise IdentityError(
            f"config.json's n_vq is {n_vq}, but {chosen.name} has {' or '.join(map(str, chosen.codebooks))} codebooks "
            f"({evidence}): this is another model, or a variant of it this package does not know"
        )
    release = model_card_release(checkpoint_dir) if chosen is MOSS_TTS else None
    if release is not None:
        evidence = f"{evidence}; release {release[0]}: {release[1]}"
    return ModelIdentity(chosen, None if release is None else release[0], template, evidence)


def _signs(shape: Qwen3Shape, template: PromptTemplate) -> list[tuple[FamilyModel, str]]:
    signs = []
    if template.has_scene:
        signs.append((MOSS_TTSD, f"its processing code ({template.source}) has a Scene field, as only MOSS-TTSD's"))
    if (shape.hidden, shape.layers) == VOICE_GENERATOR_SHAPE:
        signs.append(
            (
                VOICE_GENERATOR,
                f"its backbone has Qwen3-1.7B's shape (hidden {shape.hidden}, {shape.layers} layers), "
                "as only MOSS-VoiceGenerator's in the family",
            )
        )
    return signs


def _models_with(n_vq: int, models: list[FamilyModel]) -> str:
    if not models:
        counts = ", ".join(f"{m.name} {'/'.join(map(str, m.codebooks))}" for m in DELAY_FAMILY.values())
        return f"no model of the family has {n_vq} codebooks: {counts}"
    return f"{n_vq} codebooks: {', '.join(m.name for m in models)}"


def model_card_release(checkpoint_dir: Path) -> tuple[str, str] | None:
    """(release, evidence) from the checkpoint's model card, or None when it has none that tells."""
    card = Path(checkpoint_dir) / MODEL_CARD_FILE
    try:
        return release_from_model_card(card.read_text(encoding="utf-8")) if card.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None


def release_from_model_card(card: str) -> tuple[str, str] | None:
    """(MOSS-TTS release, the evidence in words) from a model card's front matter, or None when it does not tell:
    its ``language:`` list has 1.0's 20 codes, or v1.5's 31."""
    lines = card.lstrip("\ufeff").splitlines()
    fences = [number for number, line in enumerate(lines) if line.strip() == "---"]
    if len(fences) < 2 or fences[0] != 0:
        return None
    try:
        front = yaml.safe_load("\n".join(lines[1 : fences[1]]))
    except yaml.YAMLError:
        return None
    listed = front.get("language") if isinstance(front, dict) else None
    if not isinstance(listed, list):
        return None
    codes = {str(code) for code in listed}
    if set(ADDED_IN_V1_5) <= codes:
        return V1_5, f"its model card lists {len(codes)} languages, among them the {len(ADDED_IN_V1_5)} v1.5 added"
    if codes and codes <= set(LANGUAGES) - set(ADDED_IN_V1_5):
        return V1_0, f"its model card lists {len(codes)} of the 20 languages of 1.0 and none that v1.5 added"
    return None
