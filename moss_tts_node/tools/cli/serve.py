"""``serve``: the OpenAI-compatible speech server (``python -m moss_tts_node serve``, or ``moss_tts_server``).

Needs the ``[http]`` extra (Starlette, uvicorn); docs/http.md says the rest.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moss_tts_node.errors import EXIT_BAD_INPUT, ConfigError, MossTTSError
from moss_tts_node.http.api import DEFAULT_FORMAT, FORMATS, served_model
from moss_tts_node.tools.overrides import add_set_option, parse_overrides

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_QUEUE_SIZE = 8  # as the node's queue_size
DEFAULT_MAX_RESPONSE_S = 120.0  # as the node's max_response_seconds
API_KEY_VARIABLE = "MOSS_TTS_API_KEY"


def register(commands: Any) -> None:
    parser = commands.add_parser("serve", help="serve OpenAI's POST /v1/audio/speech over HTTP (docs/http.md)")
    add_arguments(parser)
    parser.set_defaults(run=run_serve)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, help="params file (config/*.yaml)")
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}, this machine only); another needs an API key",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--api-key-file",
        type=Path,
        help=f"a file holding the key every request must bear ('Authorization: Bearer KEY'); or set {API_KEY_VARIABLE}",
    )
    parser.add_argument(
        "--queue-size",
        type=int,
        default=DEFAULT_QUEUE_SIZE,
        help=f"requests that may wait behind the one being spoken; more are refused (default {DEFAULT_QUEUE_SIZE})",
    )
    parser.add_argument(
        "--max-response-seconds",
        type=float,
        default=DEFAULT_MAX_RESPONSE_S,
        help=f"most seconds of audio in a whole (not streamed) response (default {DEFAULT_MAX_RESPONSE_S:g})",
    )
    parser.add_argument(
        "--served-model-name",
        help="the model id clients ask for (default: the weights' model of the family, MOSS-TTS, ...)",
    )
    parser.add_argument(
        "--default-response-format",
        choices=FORMATS,
        default=DEFAULT_FORMAT,
        help=f"the format of a request that names none (default {DEFAULT_FORMAT}, as OpenAI's API)",
    )
    parser.add_argument(
        "--public-lists",
        action="store_true",
        help="answer the model and voice lists without the API key (Open WebUI reads them without one)",
    )
    parser.add_argument(
        "--voice-upload-dir",
        type=Path,
        help="take voices clients upload (POST /v1/audio/voices, with the API key) into this directory, one of "
        "voices.directories",
    )
    add_set_option(parser)


def run_serve(args: argparse.Namespace) -> int:
    try:
        from moss_tts_node.http.server import serve
    except ImportError as error:
        raise ConfigError(f"serve needs the [http] extra: pip install 'moss_tts_node[http]' ({error})") from None
    from moss_tts_node.http.server import Settings
    from moss_tts_node.http.service import SpeechService
    from moss_tts_node.http.uploads import VoiceUploads
    from moss_tts_node.synthesizer import Synthesizer

    if not 0 <= args.queue_size <= 64:
        raise ConfigError(f"--queue-size must be 0 to 64, got {args.queue_size}")
    if not 0.08 <= args.max_response_seconds <= 3600:
        raise ConfigError(f"--max-response-seconds must be 0.08 to 3600, got {args.max_response_seconds}")
    api_key = _api_key(args.api_key_file)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    synth = Synthesizer.from_config_file(args.config, parse_overrides(args.set))
    service = SpeechService(synth, args.queue_size, args.max_response_seconds)
    try:
        synth.prepare_voice()
        settings = Settings(
            model_id=args.served_model_name or served_model(synth.spec.identity),
            api_key=api_key,
            default_format=args.default_response_format,
            public_lists=args.public_lists,
            uploads=VoiceUploads(synth, args.voice_upload_dir) if args.voice_upload_dir else None,
        )
        serve(service, settings, args.host, args.port)
    finally:
        service.close()
        synth.close()
    return 0


def _api_key(path: Path | None) -> str | None:
    """The API key: the file's first line, else the variable's value; None for neither."""
    if path is not None:
        try:
            key = path.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError(f"--api-key-file {path}: {error.strerror}") from None
        if not key:
            raise ConfigError(f"--api-key-file {path} is empty: put the key in it")
        return key
    return os.environ.get(API_KEY_VARIABLE) or None


def main(argv: Sequence[str] | None = None) -> int:
    """The ``moss_tts_server`` console script: ``serve``'s options, ROS-free."""
    parser = argparse.ArgumentParser(prog="moss_tts_server", description="OpenAI-compatible MOSS-TTS speech server")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_serve(args)
    except MossTTSError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
