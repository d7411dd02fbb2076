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

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.identity import ModelIdentity
from moss_tts_node.model.layout import CONFIG_FILE
from moss_tts_node.model.rates import SAMPLE_RATE


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

    @classmethod
    def load(cls, weights_dir: Path) -> ModelSpec:
        """Read ``config.json`` when present; unknown keys are ignored (it is upstream's file)."""
        path = Path(weights_dir) / CONFIG_FILE
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise WeightsError(f"{path}: not a readable JSON model config: {exc}") from exc
        if not isinstance(raw, dict):
            raise WeightsError(f"{path}: expected a JSON object")
        values = {}
        for f in _CONFIG_FIELDS:
            if f.name in raw:
                value = raw[f.name]
                if type(value) is not int or value < 0:
                    raise WeightsError(f"{path}: '{f.name}' must be a non-negative integer, got {value!r}")
                values[f.name] = value
        spec = cls(**values, identity=ModelIdentity.from_config(raw, values.get("n_vq", cls.n_vq), path))
        if spec.audio_pad_code != spec.audio_vocab_size:
            raise WeightsError(
                f"{path}: audio_pad_code ({spec.audio_pad_code}) must equal audio_vocab_size "
                f"({spec.audio_vocab_size}): the pad is the row after the last code"
            )
        return spec

    def to_json(self) -> dict[str, int]:
        """The upstream keys, as config.json holds them."""
        return {f.name: getattr(self, f.name) for f in _CONFIG_FIELDS}


_CONFIG_FIELDS = tuple(f for f in dataclasses.fields(ModelSpec) if f.name != "identity")
