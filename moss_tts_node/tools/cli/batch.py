"""``batch LIST --out DIR``: every line of a list synthesized into ``DIR/<id>.wav``, with one model load.

Lists are Seed-TTS-eval style (``utt_id|prompt_text|prompt_wav|target_text``), JSONL or plain text
(docs/usage.md, "Batch synthesis"). The whole list is read and checked before the model loads; a bad line is
recorded in the summary and skipped. Each output is a whole utterance (``Synthesizer.synthesize``:
the codec's offline decode) written under a temporary name and then renamed, so a ``DIR/<id>.wav``
that exists is complete and a later run skips it (resume). Ctrl-C stops after the line under way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moss_tts_node.errors import EXIT_INTERRUPTED, MossTTSError, RequestError
from moss_tts_node.synthesis.fields import COUNT, SEED, TEXT
from moss_tts_node.synthesis.request import REQUEST_FIELDS
from moss_tts_node.text.speakers import MAX_SPEAKERS
from moss_tts_node.timing import StopReason
from moss_tts_node.tools.overrides import add_set_option, parse_overrides
from moss_tts_node.tools.progress import Progress

if TYPE_CHECKING:
    import numpy as np

    from moss_tts_node.synthesizer import Synthesizer

SEED_TTS, JSONL, PLAIN = "seed-tts", "jsonl", "plain"
FORMATS = (SEED_TTS, JSONL, PLAIN)
SEED_TTS_SUFFIXES = (".txt", ".lst")  # a Seed-TTS list when its first line has a '|'; plain text otherwise
JSONL_SUFFIX = ".jsonl"
# A JSONL line's keys: its id, its text and its voices (files, found from the list's folder), then the request's
# fields that batch takes under their own names, as their declaration says (synthesis/fields.py).
_REQUEST_KEYS = tuple(field for field in REQUEST_FIELDS if field.batch)
JSONL_FIELDS = ("id", "text", "reference", "references", "prefix", *(field.name for field in _REQUEST_KEYS))
_JSONL_STRINGS = ("reference", "prefix", *(field.name for field in _REQUEST_KEYS if field.kind == TEXT))
_JSONL_NUMBERS = {field.name: 1 if field.kind == COUNT else 0 for field in _REQUEST_KEYS if field.kind in (COUNT, SEED)}
# What a JSONL key means where it is batch's own, or means more than synth's option for the same request field
# (usage_reference writes docs/usage.md's table of keys from these and synth's help).
JSONL_KEY_HELP = {
    "id": "names the output, DIR/<id>.wav (default: derived from the line number and the text)",
    "text": "what to say; left out (or empty) for a sound: ambient_sound or sound_event",
    "reference": 'the voice: a clip or .npy of codes, relative to the list\'s folder; "" for none, left out for the '
    "configured voice; not with references",
    "references": f"one voice per speaker, [S1] first, up to {MAX_SPEAKERS}: a list of clips or .npy files, null or "
    '"" for a speaker without one; not with reference',
    "prefix": "a recording the speech continues (docs/continuation.md): a clip or .npy of codes, relative to the "
    "list's folder",
    "prefix_text": "what the prefix says, put before text; left out when text itself begins with it",
}
# utt_id|prompt_text|prompt_wav|target_text, and some lists add the ground-truth clip as a fifth field.
SEED_TTS_FIELDS = (4, 5)
SUMMARY_FILE = "summary.jsonl"
WAV_SUFFIX = ".wav"
PARTIAL_SUFFIX = ".partial"  # DIR/.<id>.wav.partial while it is written; ids never start with '.'
DERIVED_ID_HASH_CHARS = 8
MAX_ID_BYTES = 200  # DIR/.<id>.wav.partial must stay within the usual 255-byte file name limit
EXIT_SOME_FAILED = 1  # some lines were bad or failed to synthesize; the others were done
_UNSAFE_ID = re.compile(r"[/\\\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Utterance:
    """One line to synthesize. ``reference``: a resolved clip or .npy of codes, ``""`` for no voice,
    ``None`` for the configured default voice (``generation.reference_audio``); ``references`` instead: one
    per speaker, [S1] first, None for a speaker without one; ``prefix``: a recording the speech continues, with its
    ``prefix_text`` (docs/continuation.md). ``text`` is empty for a sound (``ambient_sound`` or ``sound_event``
    and no text: docs/family.md, "Sound effects"). The other fields, one for each that the request's declaration
    says batch takes (``_REQUEST_KEYS``), left ``None`` take the config's."""

    line: int  # 1-based, in the list file
    id: str
    text: str
    reference: Path | str | None = None
    language: str | None = None
    instruction: str | None = None
    seed: int | None = None
    references: tuple[Path | None, ...] | None = None
    prefix: Path | None = None
    prefix_text: str | None = None
    quality: str | None = None
    tokens: int | None = None
    sound_event: str | None = None
    ambient_sound: str | None = None
    scene: str | None = None

    @property
    def clips(self) -> list[Path]:
        """Every file of a voice the line names."""
        voices = [self.reference, *(self.references or ()), self.prefix]
        return [voice for voice in voices if isinstance(voice, Path)]


@dataclass(frozen=True)
class BadLine:
    """A line that cannot be synthesized, and why."""

    line: int
    id: str | None  # None when the line did not get as far as naming one
    reason: str


@dataclass(frozen=True)
class SummaryRow:
    """One row of ``DIR/summary.jsonl``: a line done or failed (skipped lines get none)."""

    id: str | None
    line: int
    status: str  # "done" or "failed"
    audio_s: float | None = None
    generation_s: float | None = None  # the synthesis's wall time
    real_time_factor: float | None = None  # generation_s / audio_s
    stop_reason: str | None = None
    seed: int | None = None  # the seed it ran with: give it to reproduce the line
    error: str | None = None


class _LineError(ValueError):
    """Why a line is bad, raised while parsing it."""

    def __init__(self, reason: str, utt_id: str | None = None) -> None:
        super().__init__(reason)
        self.utt_id = utt_id


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``batch`` to the CLI (cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "batch",
        help="synthesize every line of a list into DIR/<id>.wav (resumable)",
        description="Synthesize a Seed-TTS-eval list, a JSONL file or plain text (one utterance per line) "
        "into DIR/<id>.wav with one model load; existing outputs are skipped, bad lines recorded in "
        f"DIR/{SUMMARY_FILE}. Exits 0 when every line is done, {EXIT_SOME_FAILED} when some failed, "
        f"2 on bad arguments, {EXIT_INTERRUPTED} after Ctrl-C.",
    )
    parser.add_argument(
        "list",
        type=Path,
        metavar="LIST",
        help="utt_id|prompt_text|prompt_wav|target_text lines (.lst/.txt), JSONL (.jsonl), or plain text",
    )
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder of the WAVs and the summary")
    parser.add_argument("--config", required=True, type=Path, help="params file (config/*.yaml)")
    parser.add_argument(
        "--format", choices=FORMATS, help="the list's format (default: .jsonl is JSONL; .lst/.txt with '|' Seed-TTS)"
    )
    parser.add_argument("--force", action="store_true", help="synthesize again lines whose DIR/<id>.wav exists")
    add_set_option(parser)
    parser.set_defaults(run=run)


# -- reading lists ----------------------------------------------------------------------------


def read_list(path: Path, list_format: str | None = None) -> list[Utterance | BadLine]:
    """Every non-blank line of the list, in order, as an Utterance or a BadLine (``list_format``
    None: chosen by ``detect_format``). Raises RequestError when the file itself cannot be used."""
    if not path.is_file():
        raise RequestError(f"list {path} not found; give a Seed-TTS-eval .lst, a .jsonl or a text file")
    try:
        lines = [line.rstrip("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    except UnicodeDecodeError as exc:
        raise RequestError(f"list {path} is not UTF-8 ({exc.reason} at byte {exc.start}); save it as UTF-8") from exc
    list_format = list_format or detect_format(path, lines)
    folder = path.parent
    entries: list[Utterance | BadLine] = []
    first_line_of: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            if list_format == SEED_TTS:
                utterance = _seed_tts_line(number, line, folder)
            elif list_format == JSONL:
                utterance = _jsonl_line(number, line, folder)
            else:
                utterance = Utterance(number, derived_id(number, line.strip()), line.strip())
            if utterance.id in first_line_of:
                raise _LineError(f"duplicate id (first on line {first_line_of[utterance.id]})", utterance.id)
        except _LineError as bad:
            entries.append(BadLine(number, bad.utt_id, str(bad)))
            continue
        first_line_of[utterance.id] = number
        entries.append(utterance)
    if not entries:
        raise RequestError(f"list {path} has no lines to synthesize")
    return entries


def detect_format(path: Path, lines: list[str]) -> str:
    suffix = path.suffix.lower()
    if suffix == JSONL_SUFFIX:
        return JSONL
    first = next((line for line in lines if line.strip()), "")
    return SEED_TTS if suffix in SEED_TTS_SUFFIXES and "|" in first else PLAIN


def derived_id(line: int, text: str) -> str:
    """The id of a line that gives none: its line number and a hash of its text, so it stays the same
    from run to run (resume) and changes when the text is edited."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:DERIVED_ID_HASH_CHARS]
    return f"{line:05d}-{digest}"


def _seed_tts_line(number: int, line: str, folder: Path) -> Utterance:
    fields = [field.strip() for field in line.split("|")]
    if len(fields) not in SEED_TTS_FIELDS:
        raise _LineError(f"{len(fields)} '|'-separated fields, expected utt_id|prompt_text|prompt_wav|target_text")
    # prompt_text (fields[1]), the reference clip's transcript, has no place in MOSS-TTS-Delay's prompt
    # (docs/model.md "Prompt format"): it is read and not used, as is a fifth, ground-truth clip.
    utt_id, _, prompt_wav, text = fields[:4]
    _check(utt_id, text)
    if not prompt_wav:
        raise _LineError("no prompt_wav: a Seed-TTS line needs its reference clip", utt_id)
    return Utterance(number, utt_id, text, _reference(folder, prompt_wav, utt_id))


def _jsonl_line(number: int, line: str, folder: Path) -> Utterance:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _LineError(f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(item, dict):
        raise _LineError(f'expected a JSON object such as {{"text": "Hello."}}, got {type(item).__name__}')
    utt_id = item.get("id")
    if utt_id is not None and not isinstance(utt_id, str):
        raise _LineError(f"id must be a string, got {json.dumps(utt_id)}")
    unknown = sorted(set(item) - set(JSONL_FIELDS))
    if unknown:
        raise _LineError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(JSONL_FIELDS)}", utt_id)
    for key in _JSONL_STRINGS:
        if item.get(key) is not None and not isinstance(item[key], str):
            raise _LineError(f"{key} must be a string or null, got {json.dumps(item[key])}", utt_id)
    sound = item.get("ambient_sound") or item.get("sound_event")  # no text needed: a sound
    text = item.get("text", "" if sound else None)
    if not isinstance(text, str):
        raise _LineError('no "text" string: every line needs one but a sound (ambient_sound or sound_event)', utt_id)
    utt_id = utt_id if utt_id is not None else derived_id(number, text.strip() or sound)
    _check(utt_id, text, bool(sound))
    for key, least in _JSONL_NUMBERS.items():
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise _LineError(f"{key} must be an integer >= {least} or null, got {json.dumps(value)}", utt_id)
    reference, prefix = item.get("reference"), item.get("prefix")
    return Utterance(
        number,
        utt_id,
        text.strip(),
        reference=_reference(folder, reference, utt_id) if reference else reference,
        references=_references(folder, item, utt_id),
        prefix=_reference(folder, prefix, utt_id) if prefix else None,
        **{field.name: item.get(field.name) for field in _REQUEST_KEYS},
    )


def _references(folder: Path, item: dict[str, Any], utt_id: str) -> tuple[Path | None, ...] | None:
    """A line's ``references``: a list of the speakers' clips, [S1] first, null or "" for a speaker without one."""
    references = item.get("references")
    if references is None:
        return None
    if "reference" in item:
        raise _LineError("give reference (one voice) or references (one per speaker), not both", utt_id)
    if not isinstance(references, list) or not 1 <= len(references) <= MAX_SPEAKERS:
        raise _LineError(
            f"references must be a list of 1 to {MAX_SPEAKERS} clips ([S1] first, null for a speaker without one), "
            f"got {json.dumps(references)}",
            utt_id,
        )
    if not all(isinstance(value, str) or value is None for value in references):
        raise _LineError(f"each of references must be a string or null, got {json.dumps(references)}", utt_id)
    return tuple(_reference(folder, value, utt_id) if value else None for value in references)


def _check(utt_id: str, text: str, sound: bool = False) -> None:
    """Refuse an id that cannot name ``DIR/<id>.wav`` (empty, a path, hidden, too long) and empty text, but for a
    ``sound``."""
    if not utt_id:
        raise _LineError("empty id")
    if _UNSAFE_ID.search(utt_id) or utt_id.startswith(".") or len(utt_id.encode("utf-8")) > MAX_ID_BYTES:
        raise _LineError(
            f"id {utt_id!r} cannot name a file in DIR: no '/', '\\' or control characters, "
            f"no leading '.', at most {MAX_ID_BYTES} bytes",
            utt_id,
        )
    if not text.strip() and not sound:
        raise _LineError("empty text", utt_id)


def _reference(folder: Path, value: str, utt_id: str) -> Path:
    path = folder / value  # relative paths are the list folder's; an absolute one stays as it is
    if not path.is_file():
        raise _LineError(f"reference clip not found: {path}", utt_id)
    return path.resolve()


# -- running ------------------------------------------------------------------------------------


def output_path(out_dir: Path, utt_id: str) -> Path:
    return out_dir / f"{utt_id}{WAV_SUFFIX}"


def run(args: argparse.Namespace) -> int:
    from moss_tts_node.config import load_config
    from moss_tts_node.synthesizer import Synthesizer

    entries = read_list(args.list, args.format)
    config = load_config(args.config, parse_overrides(args.set))  # bad settings fail before any output
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RequestError(f"cannot make the output folder {args.out}: {exc.strerror}") from exc
    todo = [
        entry
        for entry in entries
        if isinstance(entry, Utterance) and (args.force or not output_path(args.out, entry.id).exists())
    ]
    progress = Progress(sys.stderr)
    if not todo:  # nothing to synthesize: no model to load
        return Batch(None, args.out, progress).run(entries, todo)
    started = time.perf_counter()
    with Synthesizer(config) as synth:
        progress.message(f"model loaded in {time.perf_counter() - started:.1f} s")
        return Batch(synth, args.out, progress).run(entries, todo)


@dataclass
class Totals:
    done: int = 0
    skipped: int = 0
    failed: int = 0
    not_reached: int = 0
    at_token_limit: int = 0
    audio_s: float = 0.0
    busy_s: float = 0.0  # spent on the lines synthesized so far (done or failed): the ETA's rate


class Batch:
    """Runs a list's entries against one loaded Synthesizer, appending a summary row as each finishes."""

    def __init__(self, synth: Synthesizer | None, out_dir: Path, progress: Progress) -> None:
        self.synth = synth
        self.out_dir = out_dir
        self.progress = progress
        self.totals = Totals()
        self._voices: dict[Path, np.ndarray | MossTTSError] = {}
        self._voice_uses: Counter[Path] = Counter()

    def run(self, entries: list[Utterance | BadLine], todo: list[Utterance]) -> int:
        """Every entry in order: bad lines recorded, those not in ``todo`` skipped, the rest synthesized.
        Returns the exit status."""
        self._voice_uses = Counter(clip for u in todo for clip in u.clips)
        todo_ids = {u.id for u in todo}
        totals, left = self.totals, len(todo)
        interrupted = False
        started = time.perf_counter()
        with (self.out_dir / SUMMARY_FILE).open("a", encoding="utf-8") as summary, _stop_after_this_line() as stop:
            for number, entry in enumerate(entries):
                if stop.is_set():  # checked before each line: a Ctrl-C during the last one leaves nothing undone
                    totals.not_reached = len(entries) - number
                    interrupted = True
                    break
                synthesized = len(todo) - left
                eta = totals.busy_s / synthesized * left if synthesized else None
                self.progress.bar(number, len(entries), eta, entry.id or "")
                if isinstance(entry, BadLine):
                    row = SummaryRow(entry.id, entry.line, "failed", error=entry.reason)
                elif entry.id not in todo_ids:
                    totals.skipped += 1
                    continue
                else:
                    row = self._synthesize(entry)
                    left -= 1
                if row.error:
                    totals.failed += 1
                    self.progress.message(f"line {row.line} ({row.id or 'no id'}): {row.error}")
                summary.write(json.dumps(asdict(row), ensure_ascii=False) + "\n")
                summary.flush()
            else:
                self.progress.bar(len(entries), len(entries), 0.0)
        self.progress.done()
        return self._report(time.perf_counter() - started, interrupted)

    def _synthesize(self, utterance: Utterance) -> SummaryRow:
        assert self.synth is not None
        started = time.perf_counter()
        try:
            references = utterance.references
            voice = self._voice(utterance.reference) if references is None else [self._voice(v) for v in references]
            fields = {field.name: getattr(utterance, field.name) for field in _REQUEST_KEYS}
            result = self.synth.synthesize(utterance.text, voice=voice, prefix=self._voice(utterance.prefix), **fields)
        except MossTTSError as exc:
            self.totals.busy_s += time.perf_counter() - started
            return SummaryRow(utterance.id, utterance.line, "failed", error=str(exc))
        report = result.report
        _write_whole(output_path(self.out_dir, utterance.id), result.audio, result.sample_rate)
        totals = self.totals
        totals.done += 1
        totals.audio_s += report.audio_seconds
        totals.busy_s += time.perf_counter() - started
        totals.at_token_limit += report.stop_reason is StopReason.MAX_NEW_TOKENS
        return SummaryRow(
            utterance.id,
            utterance.line,
            "done",
            audio_s=round(report.audio_seconds, 3),
            generation_s=round(report.wall_s, 3),
            real_time_factor=None if report.real_time_factor is None else round(report.real_time_factor, 4),
            stop_reason=str(report.stop_reason),
            seed=report.seed,
        )

    def _voice(self, reference: Path | str | None) -> np.ndarray | str | None:
        """The codes of a clip, encoded once however many lines use it (kept until its last one);
        ``None`` and ``""`` as they are (the configured voice, no voice)."""
        if not isinstance(reference, Path):
            return reference
        assert self.synth is not None
        voice = self._voices.get(reference)
        if voice is None:
            try:
                voice = self.synth.encode_reference(reference)
            except MossTTSError as exc:  # an unreadable clip fails every line that uses it, read once
                voice = exc
            self._voices[reference] = voice
        self._voice_uses[reference] -= 1
        if self._voice_uses[reference] <= 0:
            del self._voices[reference]
        if isinstance(voice, MossTTSError):
            raise voice
        return voice

    def _report(self, wall_s: float, interrupted: bool) -> int:
        totals = self.totals
        summary = self.out_dir / SUMMARY_FILE
        print(
            f"done {totals.done}, skipped {totals.skipped} (already in {self.out_dir}), failed {totals.failed}"
            + (f" (reasons in {summary})" if totals.failed else "")
            + (f", not reached {totals.not_reached}" if interrupted else "")
        )
        rtf = f": overall real-time factor {wall_s / totals.audio_s:.2f}" if totals.audio_s else ""
        print(f"{totals.audio_s:.2f} s of audio in {wall_s:.2f} s{rtf}")
        if totals.at_token_limit:
            print(
                f"note: {totals.at_token_limit} line(s) stopped at max_new_tokens (summary stop_reason); "
                "raise it with --set generation.max_new_tokens=N",
                file=sys.stderr,
            )
        if interrupted:
            print("interrupted: run the same command again to do the rest", file=sys.stderr)
            return EXIT_INTERRUPTED
        return EXIT_SOME_FAILED if totals.failed else 0


def _write_whole(path: Path, audio: np.ndarray, sample_rate: int) -> None:
    """Write under a temporary name, then rename: ``path`` exists only once it is complete."""
    from moss_tts_node.codec.audio_io import write_wav

    partial = path.with_name(f".{path.name}{PARTIAL_SUFFIX}")
    try:
        write_wav(partial, audio, sample_rate)
        os.replace(partial, path)
    except (OSError, RuntimeError) as exc:  # soundfile's errors are RuntimeErrors
        raise RequestError(
            f"cannot write {path} ({exc}); check that the folder is writable and has room, then run again to resume"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)


@contextmanager
def _stop_after_this_line() -> Iterator[threading.Event]:
    """The first Ctrl-C sets the event (the loop stops after the line under way); a second one
    interrupts at once, as before."""
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: Any) -> None:
        stop.set()
        signal.signal(signal.SIGINT, previous)
        # os.write, not print: a signal handler may run in the middle of another write to stderr.
        os.write(2, b"\nstopping after the current line (Ctrl-C again to stop now)\n")

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
