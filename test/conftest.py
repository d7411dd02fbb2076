"""Shared fixtures: one tiny random model (real file formats) per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moss_tts_node.tools.demo_weights import write_demo_weights


@pytest.fixture(scope="session")
def demo_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.yaml of a freshly written demo model; treat the directory as read-only."""
    return write_demo_weights(tmp_path_factory.mktemp("demo"), seed=0)


@pytest.fixture(scope="session")
def synth(demo_config: Path) -> Iterator[object]:
    from moss_tts_node.synthesizer import Synthesizer

    with Synthesizer.from_config_file(demo_config) as loaded:
        yield loaded
