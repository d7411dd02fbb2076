"""The model's vocabulary facts: special-token ids, codebook count and sizes, and the delay's geometry that the
codebook count sets (the rows a clip takes, the steps to the first frame); and which model it is.

They come from the weights directory's ``config.json`` (``layout.CONFIG_FILE``) (the keys upstream's config
uses: docs/model.md, "Upstream"), with the published model's values as defaults, so a tiny test model can bring
a tiny vocabulary. The same file's record of which model of the family the weights are (its name, prompt
template and recommended sampling: ``model/identity.py``) is read with them, as ``identity``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.family import MOSS_TTS_NANO
from moss_tts_node.model.identity import RECORD_KEY, ModelIdentity
from moss_tts_node.model.layout import CONFIG_FILE
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE


@dataclass(frozen=True)
class ModelSpec:
    n_vq: int = 32
    audio_vocab_size: int = 1024  # real codes per codebook; the heads add one row for the pad code
    audio_pad_code: int = 1024
    pad_token_id: int = 151643
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    audio_start_token_id: int = 151652
    audio_end_token_id: int = 151653
    audio_user_slot_token_id: int = 151654
    audio_assistant_gen_slot_token_id: int = 151656
    audio_assistant_delay_slot_token_id: int = 151662
    sampling_rate: int = SAMPLE_RATE
    # Which model: not an upstream key, so neither compared nor written back with them (to_json).
    identity: ModelIdentity = field(default=ModelIdentity(), compare=False, repr=False)

    @property
    def channels(self) -> int:
        """Columns of a prompt row: text plus one per codebook."""
        return 1 + self.n_vq

    @property
    def audio_rows(self) -> int:
        """Rows of each audio embedding table and head: the codes plus the pad code."""
        return self.audio_vocab_size + 1

    # The delay pattern's geometry (docs/model.md, "Reference clip staircase", "De-delay"): codebook k of frame t
    # sits in row t + k, so a frame's last codebook lags n_vq - 1 rows behind its first. One step writes one row.

    def delayed_rows(self, frames: int) -> int:
        """Rows that hold ``frames`` frames under the delay: a reference clip's slot rows, and the steps that
        complete that many frames."""
        return frames + self.n_vq - 1

    @property
    def first_frame_steps(self) -> int:
        """Steps until a generation's first frame is complete (the ramp-up): the first audio can leave then."""
        return self.delayed_rows(1)

    @property
    def first_frame_budget(self) -> int:
        """The steps counted for the first frame wherever a bound is set on it: ``first_frame_steps`` and one to
        spare. A prompt must leave the context room for them (the planner's and the voices' checks), and the
        benches bound a request's first audio with them."""
        return self.first_frame_steps + 1

    def frames_after(self, steps: int) -> int:
        """Frames complete after ``steps`` steps (none during the ramp-up)."""
        return max(steps - self.n_vq + 1, 0)

    @property
    def special_token_ids(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in _CONFIG_FIELDS if f.name.endswith("_token_id")}

    @property
    def audio_channels(self) -> int:
        """Channels of the model's audio (samples are (n,) when 1, else (n, channels))."""
        return 1

    @property
    def samples_per_frame(self) -> int:
        """Samples (per channel) of one 80 ms frame at the model's rate."""
        return round(self.sampling_rate / FRAMES_PER_SECOND)

    def silence(self, samples: int) -> np.ndarray:
        """``samples`` samples of silence in the model's channel layout."""
        shape = (samples,) if self.audio_channels == 1 else (samples, self.audio_channels)
        return np.zeros(shape, dtype=np.float32)

    @property
    def is_nano(self) -> bool:
        """Whether the weights are MOSS-TTS-Nano's (``NanoSpec``): no delay pattern, a frame a step."""
        return False

    @classmethod
    def load(cls, weights_dir: Path) -> ModelSpec:
        """Read ``config.json`` when present; unknown keys are ignored (it is upstream's file). A Nano config
        (``model_type`` ``moss_tts_nano``) gives a ``NanoSpec``."""
        path = Path(weights_dir) / CONFIG_FILE
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise WeightsError(f"{path}: not a readable JSON model config: {exc}") from exc
        if not isinstance(raw, dict):
            raise WeightsError(f"{path}: expected a JSON object")
        if raw.get("model_type") == NANO_MODEL_TYPE:
            return NanoSpec.from_config(raw, path)
        return cls.from_config(raw, path)

    @classmethod
    def from_config(cls, raw: dict[str, Any], path: Path) -> ModelSpec:
        """The spec of a parsed ``config.json`` (read from ``path``); each field under its config key
        (``config_key``)."""
        values = {}
        for f in _CONFIG_FIELDS:
            key = cls.config_key(f.name)
            if key in raw:
                value = raw[key]
                if type(value) is not int or value < 0:
                    raise WeightsError(f"{path}: '{key}' must be a non-negative integer, got {value!r}")
                values[f.name] = value
        spec = cls(**values, identity=ModelIdentity.from_config(raw, values.get("n_vq", cls.n_vq), path))
        if spec.audio_pad_code != spec.audio_vocab_size:
            raise WeightsError(
                f"{path}: audio_pad_code ({spec.audio_pad_code}) must equal audio_vocab_size "
                f"({spec.audio_vocab_size}): the pad is the row after the last code"
            )
        return spec

    @staticmethod
    def config_key(name: str) -> str:
        """The config.json key of the field ``name``: the same name, for the Delay models."""
        return name

    def to_json(self) -> dict[str, int]:
        """The upstream keys, as config.json holds them."""
        return {self.config_key(f.name): getattr(self, f.name) for f in _CONFIG_FIELDS}


_CONFIG_FIELDS = tuple(f for f in dataclasses.fields(ModelSpec) if f.name != "identity")

# upstream's config.json of MOSS-TTS-Nano says what it is (MossTTSNanoConfig.model_type).
NANO_MODEL_TYPE = "moss_tts_nano"

# Nano's config.json names two of the fields otherwise (configuration_moss_tts_nano.py); the rest are the same.
_NANO_KEYS = {
    "audio_pad_code": "audio_pad_token_id",
    "audio_assistant_gen_slot_token_id": "audio_assistant_slot_token_id",
    "sampling_rate": "audio_tokenizer_sample_rate",
}


@dataclass(frozen=True)
class NanoSpec(ModelSpec):
    """MOSS-TTS-Nano's vocabulary facts (docs/nano.md, "Tokens"): its own special ids, 16 codebooks, 48 kHz stereo
    audio, and no delay pattern: a generated row is a whole frame, so a clip takes one row a frame and a step
    completes a frame. Nano has no delay slot: ``audio_assistant_delay_slot_token_id`` is never used."""

    n_vq: int = 16
    pad_token_id: int = 3
    im_start_token_id: int = 4
    im_end_token_id: int = 5
    audio_start_token_id: int = 6
    audio_end_token_id: int = 7
    audio_user_slot_token_id: int = 8
    audio_assistant_gen_slot_token_id: int = 9
    audio_assistant_delay_slot_token_id: int = 9
    sampling_rate: int = 48000
    text_vocab_size: int = 16384  # gpt2_config's vocab_size: the rows of the text embedding table

    @property
    def is_nano(self) -> bool:
        return True

    @property
    def audio_channels(self) -> int:
        return 2  # the codec's: interleaved stereo (codec/nano.py)

    def delayed_rows(self, frames: int) -> int:
        return frames

    def frames_after(self, steps: int) -> int:
        return max(steps, 0)

    @staticmethod
    def config_key(name: str) -> str:
        return _NANO_KEYS.get(name, name)

    @property
    def special_token_ids(self) -> dict[str, int]:
        ids = super().special_token_ids
        return {name: i for name, i in ids.items() if name != "audio_assistant_delay_slot_token_id"}

    def to_json(self) -> dict[str, int]:
        return {key: value for key, value in super().to_json().items() if key != "audio_assistant_delay_slot_token_id"}

    @classmethod
    def from_config(cls, raw: dict[str, Any], path: Path) -> ModelSpec:
        spec = super().from_config(raw, path)
        gpt2 = raw.get("gpt2_config")
        vocab = gpt2.get("vocab_size", cls.text_vocab_size) if isinstance(gpt2, dict) else cls.text_vocab_size
        if type(vocab) is not int or vocab <= spec.audio_assistant_gen_slot_token_id:
            raise WeightsError(
                f"{path}: gpt2_config.vocab_size must be an integer above the special ids, got {vocab!r}"
            )
        spec = dataclasses.replace(spec, text_vocab_size=vocab)
        model = spec.identity.model
        if RECORD_KEY not in raw:  # upstream's own config.json: its model_type says what it is
            return dataclasses.replace(spec, identity=ModelIdentity(MOSS_TTS_NANO, evidence="its model_type"))
        if model is not MOSS_TTS_NANO:
            raise WeightsError(
                f"{path}: model_type {NANO_MODEL_TYPE!r} is MOSS-TTS-Nano's, but {RECORD_KEY!r} records "
                f"{spec.identity.name}: convert the checkpoint again"
            )
        return spec
