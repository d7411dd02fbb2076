"""Shared fixtures: one tiny random model (real file formats) per test session, and codec-tiny."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from moss_tts_node.tools.demo_weights import write_demo_weights

REPO_ROOT = Path(__file__).resolve().parents[1]
# The directory of shared fixtures; CI keeps a copy beside the clone (<clone>/../shared).
SHARED_DIR_VARIABLE = "MOSS_SHARED_DIR"
CODEC_TINY = "codec-tiny"


@pytest.fixture(scope="session")
def demo_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.yaml of a freshly written demo model; treat the directory as read-only."""
    return write_demo_weights(tmp_path_factory.mktemp("demo"), seed=0)


@pytest.fixture(scope="session")
def synth(demo_config: Path) -> Iterator[object]:
    from moss_tts_node.synthesizer import Synthesizer

    with Synthesizer.from_config_file(demo_config) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def codec_tiny_dir() -> Path:
    """codec-tiny: the real codec architecture (tiny, random) with PyTorch reference outputs; skips without it."""
    shared = Path(os.environ.get(SHARED_DIR_VARIABLE) or REPO_ROOT.parent / "shared")
    directory = shared / CODEC_TINY
    if not (directory / "decoder.onnx").is_file():
        pytest.skip(f"{directory} not found: put the shared fixtures beside the clone or set {SHARED_DIR_VARIABLE}")
    return directory
