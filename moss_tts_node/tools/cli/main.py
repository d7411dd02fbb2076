"""Command line: ``python -m moss_tts_node COMMAND ...`` (``--help`` lists the commands).

A thin layer over ``Synthesizer``: it parses flags into config overrides and request fields,
shows progress, and turns every ``MossTTSError`` into a one-line reason and exit code 2.
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from moss_tts_node.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, MossTTSError, RequestError
from moss_tts_node.model.family import FAMILY, MOSS_TTS
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.playback import DEFAULT_PREBUFFER_S
from moss_tts_node.synthesis.fields import COUNT, SEED
from moss_tts_node.synthesis.request import REQUEST_FIELDS
from moss_tts_node.text.speakers import MAX_SPEAKERS
from moss_tts_node.tools.overrides import add_set_option, parse_overrides
from moss_tts_node.tools.progress import Progress

if TYPE_CHECKING:
    from moss_tts_node.synthesis.request import Voices
    from moss_tts_node.synthesis.voices import VoiceLibrary


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except MossTTSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m moss_tts_node", description="MOSS-TTS-Delay speech, torch-free.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    synth = commands.add_parser("synth", help="text to a WAV file")
    synth.add_argument("--config", required=True, type=Path, help="params file (config/*.yaml)")
    synth.add_argument(
        "--text",
        help="what to say; - reads standard input as it arrives and speaks it sentence by sentence (an LLM's output); "
        "left out with --ambient-sound or --sound-event: a sound, no speech",
    )
    synth.add_argument(
        "--output",
        type=Path,
        help="WAV file to write (16-bit, at the rate and channels given out: 24 kHz mono, MOSS-TTS-Nano 48 kHz "
        "stereo): the codec's decode of the utterance, with --play what played",
    )
    synth.add_argument(
        "--play", action="store_true", help="play it on the sound output while it streams (needs the [play] extra)"
    )
    synth.add_argument("--device", help="with --play: output device name or index (default: the system's)")
    synth.add_argument(
        "--prebuffer",
        type=float,
        default=DEFAULT_PREBUFFER_S,
        metavar="SECONDS",
        help=f"with --play: audio queued before playing starts (default {DEFAULT_PREBUFFER_S}); "
        "raise it where synthesis is slower than real time",
    )
    synth.add_argument(
        "--reference",
        action="append",
        metavar="VOICE",
        help="voice to clone: WAV/FLAC clip, .npy codes from encode-voice, or a voice name of the config; give it "
        f"once per speaker, up to {MAX_SPEAKERS} ([S1] first, '' for a speaker without a clip)",
    )
    synth.add_argument(
        "--prefix",
        metavar="CLIP_OR_NPY",
        help="a recording the speech continues (continuation cloning, docs/continuation.md): a clip, .npy codes or "
        "a voice name of the config; only the new speech is written",
    )
    for field in REQUEST_FIELDS:  # the request's own fields, each as its declaration says (synthesis/fields.py)
        if field.cli:
            synth.add_argument(field.cli_flag, type=int if field.kind in (COUNT, SEED) else str, help=field.help)
    synth.add_argument("--text-temperature", type=float, help="overrides sampling.text_temperature")
    synth.add_argument("--audio-temperature", type=float, help="overrides sampling.audio_temperature")
    synth.add_argument("--max-new-tokens", type=int, help="overrides generation.max_new_tokens")
    synth.add_argument("--save-tokens", type=Path, help="write prompt, generated and codes (int64) to this .npz")
    synth.add_argument("--profile", action="store_true", help="print the timing report")
    add_set_option(synth)
    synth.set_defaults(run=run_synth)

    voice = commands.add_parser("encode-voice", help="encode a reference clip into a .npy of codes")
    voice.add_argument("--config", required=True, type=Path, help="params file naming model.codec_dir")
    voice.add_argument("audio", type=Path, help="WAV/FLAC clip of the voice")
    voice.add_argument("output", type=Path, help=".npy file to write, (frames, n_vq) int64: the model's codebooks")
    add_set_option(voice)
    voice.set_defaults(run=run_encode_voice)

    demo = commands.add_parser("demo-weights", help="write a tiny random model (noise, not speech) for tests")
    demo.add_argument("directory", type=Path, help="where to write the weights and their config.yaml")
    demo.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    demo.add_argument("--model", choices=list(FAMILY), default=MOSS_TTS.key, help="which model of the family")
    demo.set_defaults(run=run_demo_weights)

    for name in EXTRA_COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


# Commands that live in their own modules: each has ``register(commands)``, which adds its
# subparser and sets ``run``, and keeps heavy imports inside ``run`` so `--help` stays fast.
EXTRA_COMMAND_MODULES: tuple[str, ...] = (
    "moss_tts_node.tools.prepare.convert",
    "moss_tts_node.tools.prepare.attach_heads",
    "moss_tts_node.tools.dev.bench",
    "moss_tts_node.tools.dev.text_stream_bench",
    "moss_tts_node.tools.dev.http_bench",
    "moss_tts_node.tools.prepare.build_engines",
    "moss_tts_node.tools.prepare.stream_decoder_build",
    "moss_tts_node.tools.cli.doctor",
    "moss_tts_node.tools.dev.codec_fidelity",
    "moss_tts_node.tools.cli.batch",
    "moss_tts_node.tools.cli.serve",
)


def run_synth(args: argparse.Namespace) -> int:
    from moss_tts_node.backends import open_synthesizer
    from moss_tts_node.codec.audio_io import write_wav
    from moss_tts_node.config import load_config
    from moss_tts_node.playback import Speaker, sound_output
    from moss_tts_node.synthesis.request import SpeechRequest, check_request, request_language
    from moss_tts_node.timing import StopReason

    if args.output is None and not args.play:
        raise RequestError("nothing to do: give --output FILE.wav, --play, or both")
    if args.text is None and not (args.ambient_sound or args.sound_event):
        raise RequestError("nothing to say: give --text, or --ambient-sound or --sound-event for a sound")
    text = args.text or ""
    if args.language is not None:  # refused before the config and the model load
        request_language(args.language)
    open_output = sound_output(args.device) if args.play else None  # no sound output: say so before loading
    overrides = parse_overrides(args.set)
    for flag, key in (
        ("text_temperature", "sampling.text_temperature"),
        ("audio_temperature", "sampling.audio_temperature"),
        ("max_new_tokens", "generation.max_new_tokens"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    config = load_config(args.config, overrides)
    fields = {field.name: getattr(args, field.name) for field in REQUEST_FIELDS if field.cli}
    fields |= {"voice": _references(args.reference), "prefix": args.prefix}
    check_request(SpeechRequest("" if text == STDIN else text, **fields), config.limits)  # before loading
    with open_synthesizer(config) as synth, ExitStack() as playing:
        fields = {**fields, "voice": _named(fields["voice"], synth.voices), "prefix": _named(args.prefix, synth.voices)}
        # A file alone gets the codec's decode of the whole utterance (of each sentence, for standard input);
        # --play streams, and the file then holds what was played.
        if text == STDIN:
            stream = synth.stream_text(standard_input(), streaming=args.play, **fields)
        else:
            stream = synth.stream(text, streaming=args.play, **fields)
        speaker = playing.enter_context(Speaker(open_output, args.prebuffer)) if open_output else None
        chunks = []
        progress = Progress(sys.stderr)
        for chunk in stream:
            chunks.append(chunk.samples)
            if speaker:
                speaker.feed("synth", chunk.samples, chunk.sample_rate, chunk.is_final)
            progress.show(chunk.start_s + chunk.samples.shape[0] / chunk.sample_rate)
        progress.done()
        if speaker:
            speaker.wait()
    report = stream.report
    assert report is not None and stream.generated is not None and stream.codes is not None
    if text == STDIN and report.steps == 0:
        raise RequestError("standard input held nothing to speak: pipe some text into it")
    audio = np.concatenate(chunks)
    if args.output:
        write_wav(args.output, audio, synth.sampling_rate)
    if args.save_tokens:
        np.savez(args.save_tokens, prompt=stream.prompt, generated=stream.generated, codes=stream.codes)
    if args.profile:
        print(report.format())
    rtf = f", real-time factor {report.real_time_factor:.2f}" if report.real_time_factor else ""
    done = f"wrote {args.output}" if args.output else "played"
    print(f"{done}: {report.audio_seconds:.2f} s of audio in {report.wall_s:.2f} s{rtf}")
    if report.stop_reason is StopReason.MAX_NEW_TOKENS:
        print("note: stopped at max_new_tokens; raise it (--max-new-tokens) for longer text", file=sys.stderr)
    return 0


STDIN = "-"  # --text's value that reads standard input


def _references(values: list[str] | None) -> str | list[str | None] | None:
    """--reference as a request's voice: None (the configured one) when not given, the value itself when given once
    ('' still meaning no voice), else the list of the speakers' references (None for one without a clip)."""
    if values is None or len(values) == 1:
        return None if values is None else values[0]
    return [value or None for value in values]


def _named(voices: Voices, library: VoiceLibrary) -> Voices:
    """The voices the user gave, each a voice of the config's library where it is one's name (and no file has that
    path), else as given (a file's path, whose refusal is the file's own)."""
    if isinstance(voices, list):
        return [_named(voice, library) for voice in voices]
    if isinstance(voices, str) and not Path(voices).exists():
        return library.get(voices) or voices
    return voices


def standard_input() -> Iterator[str]:
    """Standard input as a writer flushes it (each read returns what has arrived), decoded as UTF-8 across reads."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        while data := os.read(sys.stdin.fileno(), 65536):
            if text := decoder.decode(data):
                yield text
        if text := decoder.decode(b"", final=True):
            yield text
    except UnicodeDecodeError as error:
        raise RequestError(f"standard input is not UTF-8 text: {error}") from None


def run_encode_voice(args: argparse.Namespace) -> int:
    from moss_tts_node.codec.audio_io import load_reference_audio
    from moss_tts_node.codec.factory import open_codec
    from moss_tts_node.config import load_config
    from moss_tts_node.model.spec import ModelSpec
    from moss_tts_node.synthesis.stages import codec_params

    config = load_config(args.config, parse_overrides(args.set))
    spec = ModelSpec.load(Path(config.model.weights_dir))  # a voice has the model's codebooks
    with open_codec(codec_params(config, spec), decoder=False) as codec:
        codes = codec.encode(load_reference_audio(args.audio, codec=type(codec)))  # at the codec's rate and channels
    np.save(args.output, codes)
    print(f"wrote {args.output}: {codes.shape[0]} frames ({codes.shape[0] / FRAMES_PER_SECOND:.2f} s) of voice codes")
    return 0


def run_demo_weights(args: argparse.Namespace) -> int:
    from moss_tts_node.tools.dev.demo_weights import write_demo_weights

    config_path = write_demo_weights(args.directory, seed=args.seed, model=args.model)
    print(f"wrote a tiny random model (noise, not speech) to {args.directory}; config: {config_path}")
    return 0
