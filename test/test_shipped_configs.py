"""Every params file in config/ speaks, on the demo model (MOSS-TTS-Nano's for a config of Nano's): only where the
files are (and, for the TensorRT
configs, the codec backend, which needs a GPU) is changed, so each shipped combination of settings runs
for real (quantized KV cache with flash attention, small batches, low_memory staging, a GGUF carrying the
audio heads on a CPU-only llama.cpp, ...)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moss_tts_node.config import load_config, read_params_file
from moss_tts_node.model.family import MOSS_TTS_NANO
from moss_tts_node.model.layout import is_heads_gguf_name, nano_gguf_name
from moss_tts_node.model.rates import SAMPLES_PER_FRAME
from moss_tts_node.model.spec import ModelSpec, NanoSpec
from moss_tts_node.tools.prepare.attach_heads import append_audio_heads_to_gguf

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "config").glob("*.yaml"))


@pytest.mark.parametrize("shipped", CONFIGS, ids=lambda path: path.stem)
def test_a_shipped_config_speaks_on_the_demo_model(
    shipped: Path, demo_config: Path, family_demo: Callable[[str], Path], tmp_path: Path
) -> None:
    from moss_tts_node.synthesizer import Synthesizer

    values = read_params_file(shipped)
    nano = values["model.backbone_gguf"].startswith(nano_gguf_name(""))
    if nano:
        demo_config = family_demo(MOSS_TTS_NANO.key)
    demo = demo_config.parent
    demo_gguf = demo / load_config(demo_config).model.backbone_gguf
    gguf = demo_gguf
    if is_heads_gguf_name(values["model.backbone_gguf"]):  # made by attach-heads
        gguf = tmp_path / "with_heads.gguf"
        append_audio_heads_to_gguf(demo_gguf, demo / "lm_heads", gguf, ModelSpec.load(demo))
    overrides: dict[str, object] = {
        "model.weights_dir": str(demo),
        "model.backbone_gguf": str(gguf),
        "model.codec_dir": str(demo / "codec"),
        "model.engine_dir": "",
        "audio.backend": "onnx",
        "audio.onnx_provider": "cpu",
    }
    with Synthesizer.from_config_file(shipped, overrides) as synth:
        for key, value in values.items():  # nothing else was changed
            if "." in key and key not in overrides and not key.startswith("model."):
                group, name = key.split(".")
                expected = tuple(value) if isinstance(value, list) else value  # a list key holds a tuple
                assert getattr(getattr(synth.config, group), name) == expected, key
        result = synth.synthesize("Hello! I am a robot.", seed=2, max_new_tokens=120)
    frame = NanoSpec().samples_per_frame if nano else SAMPLES_PER_FRAME
    assert result.codes.shape[0] > 0 and result.audio.shape[0] == frame * result.codes.shape[0]
    assert np.isfinite(result.audio).all()
