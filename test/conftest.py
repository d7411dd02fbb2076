"""Shared fixtures and helpers: one tiny random model (real file formats) per test session, the demo
codec, codec-tiny (the real codec architecture), small vocabularies, weight directories with a file left
out, and the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.tools.demo_codec import write_demo_codec
from moss_tts_node.tools.demo_weights import write_demo_weights

REPO_ROOT = Path(__file__).resolve().parents[1]
# The directory of shared fixtures; CI keeps a copy beside the clone (<clone>/../shared).
SHARED_DIR_VARIABLE = "MOSS_SHARED_DIR"
CODEC_TINY = "codec-tiny"

if TYPE_CHECKING:
    from moss_tts_node.synthesizer import Synthesizer


@pytest.fixture(scope="session")
def demo_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.yaml of a freshly written demo model; treat the directory as read-only."""
    return write_demo_weights(tmp_path_factory.mktemp("demo"), seed=0)


@pytest.fixture(scope="session")
def synth(demo_config: Path) -> Iterator[Synthesizer]:
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


@pytest.fixture(scope="session")
def demo_codec(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(encoder.onnx, decoder.onnx) of the tiny demo codec; read-only."""
    return write_demo_codec(tmp_path_factory.mktemp("demo_codec"))


def small_spec(first_id: int) -> ModelSpec:
    """A ModelSpec for a small text vocabulary: the special tokens take the ids from ``first_id`` on."""
    names = (
        "pad_token_id",
        "im_start_token_id",
        "im_end_token_id",
        "audio_start_token_id",
        "audio_end_token_id",
        "audio_user_slot_token_id",
        "audio_assistant_gen_slot_token_id",
        "audio_assistant_delay_slot_token_id",
    )
    return ModelSpec(**{name: first_id + offset for offset, name in enumerate(names)})


def linked_copy(source: Path, target: Path, skip: Iterable[str | Path] = ()) -> Path:
    """``target`` filled with symlinks to every file under ``source`` except those in ``skip`` (relative
    paths): a weights directory to break one file of without touching the shared one."""
    skipped = {Path(path) for path in skip}
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if path.is_dir() or relative in skipped:
            continue
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).symlink_to(path)
    return target


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m moss_tts_node ARGS`` in a child process (it inherits PYTHONPATH), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "moss_tts_node", *map(str, args)], capture_output=True, text=True, timeout=120
    )
