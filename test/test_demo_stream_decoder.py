"""The demo weights take the path a robot with real weights takes: a stream decoder built from a codec checkpoint.

``make demo`` runs ``build-stream-decoder`` on the demo's ``codec_checkpoint/`` (the real codec architecture,
tiny and random) into its codec directory, as a user does with the published checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import linked_copy

from moss_tts_node.codec.layout import STREAM_DECODER_FILE
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.tools.cli.main import main
from moss_tts_node.tools.dev.demo_weights import CODEC_CHECKPOINT_DIR


def test_the_demo_weights_stream_on_a_stream_decoder_built_from_their_codec_checkpoint(
    demo_config: Path, tmp_path: Path
) -> None:
    """make demo's path, a real robot's: build-stream-decoder on the codec checkpoint, into the codec directory;
    streams then decode on it ("stateful stream", what doctor reports), and whole utterances too."""
    codec_dir = linked_copy(demo_config.parent / "codec", tmp_path / "codec")  # the shared demo stays as it is
    checkpoint = demo_config.parent / CODEC_CHECKPOINT_DIR
    assert main(["build-stream-decoder", str(checkpoint), "--out", str(codec_dir / STREAM_DECODER_FILE)]) == 0
    with Synthesizer.from_config_file(demo_config, {"model.codec_dir": str(codec_dir)}) as synth:
        whole = synth.synthesize("Hello, robot.", seed=1)
        stream = synth.stream("Hello, robot.", seed=1)
        chunks = [chunk.samples for chunk in stream]
    assert stream.report is not None and stream.report.codec_decode == "stateful stream" and len(chunks) > 2
    np.testing.assert_array_equal(stream.codes, whole.codes)
    np.testing.assert_allclose(np.concatenate(chunks), whole.audio, rtol=0, atol=1e-6)
    assert np.abs(whole.audio).max() > 0
