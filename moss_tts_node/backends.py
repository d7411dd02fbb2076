"""Which synthesizer a config names (``model.backend``): the local model, or a remote speech server.

Both take the same requests and stream the same ``AudioChunk``s, so the node, the CLI and the API open theirs
here and speak through either unchanged (docs/http.md, "Remote backend").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from moss_tts_node.choices import BACKEND_REMOTE
from moss_tts_node.config import Config, load_config

if TYPE_CHECKING:
    from moss_tts_node.http.remote import RemoteSynthesizer
    from moss_tts_node.synthesizer import Synthesizer


def open_synthesizer(
    config: Config | str | Path, overrides: dict[str, Any] | None = None
) -> Synthesizer | RemoteSynthesizer:
    """The synthesizer of ``config`` (a Config, or a params file read with ``overrides``), loaded."""
    if not isinstance(config, Config):
        config = load_config(config, overrides)
    if config.model.backend == BACKEND_REMOTE:
        from moss_tts_node.http.remote import RemoteSynthesizer

        return RemoteSynthesizer(config)
    from moss_tts_node.synthesizer import Synthesizer

    return Synthesizer(config)
