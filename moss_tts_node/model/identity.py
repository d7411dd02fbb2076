"""Which model of the family a weights directory holds: the record ``convert`` writes into its ``config.json``.

Upstream's ``config.json`` has no key that names the model or its release (docs/model.md, "MOSS-TTS-v1.5"), so
``convert`` works out which one it converts (``tools/prepare/identify.py``: from the checkpoint, its model card, or
``convert --model``) and records it beside upstream's keys under ``RECORD_KEY`` (docs/family.md, "The identity
record")::

    "moss_tts_node": {"model": "voice-generator", "release": null, "n_vq": 16,
                      "evidence": "...", "template": {...}}

``model`` is a key of ``model.family.FAMILY``; ``release`` MOSS-TTS's release where its card told (``1.0`` or
``1.5``); ``n_vq`` the codebooks the model needs (it must agree with config.json's own ``n_vq``); ``evidence``
how convert told; ``template`` the prompt template read from the checkpoint's processing code
(``model/template.py``). A record written before the family (``{"release": ..., "evidence": ...}``) is MOSS-TTS's.
A directory without a record (the published MOSS-TTS-GGUF, which is 1.0, or one converted without its card) holds
MOSS-TTS of an unknown release when it has MOSS-TTS's 32 codebooks, else a model nothing records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.family import FAMILY, MOSS_TTS, FamilyModel, RecommendedSampling
from moss_tts_node.model.template import MOSS_TTS_TEMPLATE, PromptTemplate

RECORD_KEY = "moss_tts_node"
V1_0 = "1.0"
V1_5 = "1.5"
RELEASES = (V1_0, V1_5)
UNRECORDED = "an unrecorded MossTTSDelay model"


@dataclass(frozen=True)
class ModelIdentity:
    """What the weights are: the model (None where nothing records it and its codebooks are not MOSS-TTS's), its
    release (MOSS-TTS's, where known), its prompt template, and how ``convert`` told."""

    model: FamilyModel | None = MOSS_TTS
    release: str | None = None
    template: PromptTemplate = MOSS_TTS_TEMPLATE
    evidence: str = ""

    @property
    def name(self) -> str:
        """The model in words, for people (``doctor``, the timing report, the node's diagnostics)."""
        if self.model is None:
            return UNRECORDED
        if self.model is MOSS_TTS:
            return f"MOSS-TTS {self.release}" if self.release else "MOSS-TTS (release unknown)"
        return self.model.name

    @property
    def sampling(self) -> RecommendedSampling:
        """The sampling upstream recommends for the model; MOSS-TTS's where the model is not recorded."""
        return (self.model or MOSS_TTS).sampling

    @property
    def dialogue(self) -> bool:
        """Whether the model speaks dialogues piece after piece, each continuing the one before (``FamilyModel``)."""
        return self.model is not None and self.model.dialogue

    @property
    def trained_on_pause_markers(self) -> bool | None:
        """Whether the model was trained on ``[pause X.Ys]`` markers (MOSS-TTS v1.5 was, 1.0 was not); None when
        unknown (the other models' cards do not say)."""
        return None if self.model is not MOSS_TTS or self.release is None else self.release == V1_5

    def to_record(self, n_vq: int) -> dict[str, Any]:
        if self.model is None:
            raise ValueError("only an identified model is recorded")
        return {
            "model": self.model.key,
            "release": self.release,
            "n_vq": n_vq,
            "evidence": self.evidence,
            "template": self.template.to_json(),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], n_vq: int, path: Path) -> ModelIdentity:
        """The identity the weights' ``config.json`` (``config``, read from ``path``; ``n_vq`` its codebooks)
        records; WeightsError when its record is not one ``convert`` writes or disagrees with the config."""
        record = config.get(RECORD_KEY)
        if record is None:
            return cls(MOSS_TTS if n_vq in MOSS_TTS.codebooks else None)
        where = f"{path}: {RECORD_KEY!r}"
        if not isinstance(record, dict):
            raise WeightsError(f"{where} must be an object (convert writes it); convert the checkpoint again")
        release = record.get("release")
        if release is not None and release not in RELEASES:
            raise WeightsError(f"{where}: unknown release {release!r} (known: {', '.join(RELEASES)})")
        evidence = str(record.get("evidence", ""))
        if "model" not in record:  # written before the family: MOSS-TTS, its release from its card
            return cls(MOSS_TTS, release, MOSS_TTS_TEMPLATE, evidence)
        model = FAMILY.get(record["model"])
        if model is None:
            raise WeightsError(
                f"{where}: unknown model {record['model']!r}: this version runs {', '.join(FAMILY)}; "
                "a newer moss_tts_node converted these weights"
            )
        if record.get("n_vq") != n_vq:
            raise WeightsError(
                f"{where} records {record.get('n_vq')!r} codebooks for {model.name}, but config.json's n_vq is {n_vq}: "
                "the directory was changed after convert wrote it; convert the checkpoint again"
            )
        template = PromptTemplate.from_json(record.get("template"), f"{where}.template")
        return cls(model, release, template, evidence)
