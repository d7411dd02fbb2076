"""Which MOSS-TTS-Delay release a weights directory holds, where that can be told (docs/model.md, "MOSS-TTS-v1.5").

1.0 and v1.5 have the same architecture and the same ``config.json`` keys (upstream's ``MossTTSDelayConfig`` has no
version field), so neither the weights nor the config tell them apart. Their model cards do: a Hugging Face
checkpoint's ``README.md`` opens with YAML front matter whose ``language:`` list has 1.0's 20 codes, or v1.5's 31.
``convert`` reads the card of the checkpoint it converts and records the release in the output ``config.json``
(``RECORD_KEY``). A directory without that record (the published MOSS-TTS-GGUF, which is 1.0, or a checkpoint
converted without its card) is of an unknown release: the card of a GGUF repository describes the files someone
uploaded, not necessarily the weights inside them, so it is not read.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.layout import CONFIG_FILE
from moss_tts_node.text.languages import ADDED_IN_V1_5, LANGUAGES

V1_0 = "1.0"
V1_5 = "1.5"
MODEL_CARD_FILE = "README.md"
RECORD_KEY = "moss_tts_node"  # {"release": ..., "evidence": ...}: ours, beside upstream's keys


def release_from_model_card(card: str) -> tuple[str, str] | None:
    """(release, the evidence in words) from a model card's front matter, or None when it does not tell."""
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


def read_release(weights_dir: Path) -> str | None:
    """The release ``convert`` recorded in the weights directory's ``config.json``; None when none is recorded."""
    path = Path(weights_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8")).get(RECORD_KEY)
    except (OSError, ValueError, AttributeError) as exc:
        raise WeightsError(f"{path}: not a readable JSON model config: {exc}") from exc
    release = record.get("release") if isinstance(record, dict) else None
    return release if release in (V1_0, V1_5) else None


def trained_on_pause_markers(release: str | None) -> bool | None:
    """Whether the release was trained on ``[pause X.Ys]`` markers; None when the release is unknown."""
    return None if release is None else release == V1_5
