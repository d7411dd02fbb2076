"""``batch``: lists read in each format, outputs equal to ``synthesize()``, resume, bad lines, shared clips, Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from conftest import bad_input_message, run_cli

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.pcm import float_to_pcm16
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.tools.cli.batch import BadLine, Utterance, read_list
from moss_tts_node.tools.cli.main import main as cli_main
from moss_tts_node.tools.progress import Progress

SUMMARY = "summary.jsonl"


def write_clip(path: Path, rate: int = 24000, pitch: float = 0.05) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_wav(path, 0.2 * np.sin(np.arange(rate) * pitch), rate)
    return path


def write_jsonl(path: Path, items: list[dict[str, Any] | str]) -> Path:
    """One line per item: a dict as JSON, a string as it is (for broken lines)."""
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items))
    return path


def summary_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / SUMMARY).read_text().splitlines()]


def batch(demo_config: Path, listing: Path, out: Path, *extra: str) -> int:
    """The batch command in this process, so that spies on the synthesizer and codec see its calls."""
    return cli_main(["batch", str(listing), "--out", str(out), "--config", str(demo_config), *extra])


@pytest.fixture
def synthesized(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ``Synthesizer.synthesize`` is called with, in order."""
    texts: list[str] = []
    original = Synthesizer.synthesize

    def spy(self: Synthesizer, text: str, **request: Any) -> Any:
        texts.append(text)
        return original(self, text, **request)

    monkeypatch.setattr(Synthesizer, "synthesize", spy)
    return texts


def test_a_seed_tts_list_resolves_clips_against_its_folder_and_reads_four_or_five_fields(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "wavs" / "a.wav")
    listing = tmp_path / "meta.lst"
    listing.write_text(
        "u1|what the clip says|wavs/a.wav|Hello robot.\n"
        "\n"  # blank lines are not lines
        f"u2|transcript|{clip}|Second line.|ground_truth.wav\n"
        "u3|transcript|wavs/a.wav|A | in the text.|truth.wav\n"  # '|' cannot be in a Seed-TTS text
        "u4|too|few\n"
    )
    first, second, third, fourth = read_list(listing)
    assert first == Utterance(1, "u1", "Hello robot.", reference=clip.resolve())
    assert second == Utterance(3, "u2", "Second line.", reference=clip.resolve())
    assert third == BadLine(4, None, "6 '|'-separated fields, expected utt_id|prompt_text|prompt_wav|target_text")
    assert isinstance(fourth, BadLine) and fourth.line == 5 and fourth.reason.startswith("3 ")
    # A .txt with '|' is a Seed-TTS list too; --format plain reads the same file as text lines.
    as_txt = tmp_path / "meta.txt"
    as_txt.write_text("u1|what the clip says|wavs/a.wav|Hello robot.\n")
    assert read_list(as_txt) == [first]
    (plain,) = read_list(as_txt, "plain")
    assert plain.text == "u1|what the clip says|wavs/a.wav|Hello robot."


def test_jsonl_reads_every_field_and_plain_text_derives_stable_ids(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "v" / "a.wav")
    listing = write_jsonl(
        tmp_path / "list.jsonl",
        [
            {"id": "a", "text": "One.", "reference": "v/a.wav", "language": "en", "instruction": "calm", "seed": 4},
            {"text": "  Two.  ", "reference": ""},
        ],
    )
    first, second = read_list(listing)
    assert first == Utterance(1, "a", "One.", clip.resolve(), "en", "calm", 4)
    assert second == Utterance(2, f"00002-{hashlib.sha256(b'Two.').hexdigest()[:8]}", "Two.", reference="")

    text = tmp_path / "phrases.txt"
    text.write_text("Battery low.\n\nDoor open.\n")
    assert [(u.id, u.text, u.reference) for u in read_list(text) if isinstance(u, Utterance)] == [
        (f"00001-{hashlib.sha256(b'Battery low.').hexdigest()[:8]}", "Battery low.", None),
        (f"00003-{hashlib.sha256(b'Door open.').hexdigest()[:8]}", "Door open.", None),
    ]


def test_outputs_equal_synthesize_of_the_same_text_and_seed(demo_config: Path, tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "voice.wav")
    lines = [
        {"id": "cloned", "text": "Hello robot.", "reference": "voice.wav", "seed": 5},
        {"id": "plain", "text": "Battery low, going home.", "language": "en", "seed": 6},
        {"id": "again", "text": "Same voice again.", "reference": "voice.wav", "seed": 7, "instruction": "calm"},
    ]
    out = tmp_path / "out"
    assert batch(demo_config, write_jsonl(tmp_path / "list.jsonl", list(lines)), out) == 0
    # The same requests in the same order on a model of its own, the clip given as a file.
    with Synthesizer.from_config_file(demo_config) as synth:
        for line in lines:
            request = {key: value for key, value in line.items() if key not in ("id", "text")}
            if "reference" in request:
                del request["reference"]
                request["voice"] = clip
            expected = synth.synthesize(line["text"], **request)
            written, rate = sf.read(out / f"{line['id']}.wav", dtype="int16")
            assert rate == expected.sample_rate
            assert written.tobytes() == float_to_pcm16(expected.audio), line["id"]
    rows = summary_rows(out)
    assert [(row["id"], row["status"], row["seed"]) for row in rows] == [
        ("cloned", "done", 5),
        ("plain", "done", 6),
        ("again", "done", 7),
    ]
    for row in rows:
        assert row["audio_s"] == pytest.approx(sf.info(out / f"{row['id']}.wav").duration, abs=1e-3)
        # generation_s is rounded to 1 ms, which on a short line is a few percent of the ratio
        rounding = 0.0005 / row["audio_s"] + 0.00005
        assert row["real_time_factor"] == pytest.approx(row["generation_s"] / row["audio_s"], rel=0.01, abs=rounding)
        assert row["stop_reason"] == "end" and row["error"] is None


def test_jsonl_takes_the_speakers_a_prefix_and_every_field_as_synthesize_does(
    demo_config: Path, tmp_path: Path
) -> None:
    """The keys of docs/continuation.md, each line's output equal to ``synthesize()`` of the same request."""
    alice, bob = write_clip(tmp_path / "v" / "alice.wav"), write_clip(tmp_path / "v" / "bob.wav", pitch=0.03)
    butler = tmp_path / "v" / "butler.npy"
    np.save(butler, np.random.default_rng(9).integers(0, 1024, size=(36, 32)))
    fields = {"quality": "high", "tokens": 40, "sound_event": "a bell", "ambient_sound": "wind", "seed": 3}
    butler_says = {"prefix": "v/butler.npy", "prefix_text": "Good evening.", "seed": 4}
    alice_says = {"reference": "v/alice.wav", "prefix": "v/alice.wav", "prefix_text": "Hm.", "seed": 5}
    lines = [
        {"id": "two", "text": "[S1]Hello. [S2]Hi.", "references": ["v/alice.wav", None, "v/bob.wav"], **fields},
        {"id": "goes-on", "text": "Dinner is served.", **butler_says},
        {"id": "both", "text": "And dessert.", **alice_says},
    ]
    out = tmp_path / "out"
    assert batch(demo_config, write_jsonl(tmp_path / "list.jsonl", list(lines)), out) == 0
    requests = [
        {"voice": [alice, None, bob], **fields},
        {"prefix": butler, "prefix_text": "Good evening.", "seed": 4},
        {"voice": alice, "prefix": alice, "prefix_text": "Hm.", "seed": 5},
    ]
    with Synthesizer.from_config_file(demo_config) as synth:
        for line, request in zip(lines, requests, strict=True):
            expected = synth.synthesize(line["text"], **request)
            written, _ = sf.read(out / f"{line['id']}.wav", dtype="int16")
            assert written.tobytes() == float_to_pcm16(expected.audio), line["id"]
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"id": "six", "text": "Hi.", "references": ["v/alice.wav"] * 6},
            {"id": "twice", "text": "Hi.", "reference": "v/alice.wav", "references": ["v/bob.wav"]},
            {"id": "zero", "text": "Hi.", "tokens": 0},
            {"id": "gone", "text": "Hi.", "prefix": "v/gone.wav"},
        ],
    )
    reasons = [entry.reason for entry in read_list(bad) if isinstance(entry, BadLine)]
    assert "references must be a list of 1 to 5 clips" in reasons[0]
    assert "reference (one voice) or references (one per speaker), not both" in reasons[1]
    assert "tokens must be an integer >= 1" in reasons[2] and "gone.wav" in reasons[3]


def test_resume_skips_existing_outputs_and_force_redoes_them(
    demo_config: Path, tmp_path: Path, synthesized: list[str]
) -> None:
    listing = tmp_path / "phrases.txt"
    listing.write_text("One.\nTwo.\nThree.\n")
    out = tmp_path / "out"
    assert batch(demo_config, listing, out) == 0
    assert synthesized == ["One.", "Two.", "Three."]
    wavs = sorted(out.glob("*.wav"))
    inodes = {wav: wav.stat().st_ino for wav in wavs}

    synthesized.clear()
    wavs[1].unlink()
    assert batch(demo_config, listing, out) == 0
    assert synthesized == ["Two."]
    assert all(inodes[wav] == wav.stat().st_ino for wav in (wavs[0], wavs[2]))  # untouched

    synthesized.clear()
    inodes = {wav: wav.stat().st_ino for wav in wavs}
    assert batch(demo_config, listing, out, "--force") == 0
    assert synthesized == ["One.", "Two.", "Three."]
    assert all(inodes[wav] != wav.stat().st_ino for wav in wavs)  # each replaced by a rename
    assert len(summary_rows(out)) == 3 + 1 + 3  # appended, run after run


def test_bad_lines_are_recorded_and_skipped_and_the_rest_done(demo_config: Path, tmp_path: Path) -> None:
    write_clip(tmp_path / "voice.wav")
    (tmp_path / "noise.wav").write_text("not audio")
    listing = write_jsonl(
        tmp_path / "list.jsonl",
        [
            {"id": "good", "text": "Hello robot.", "seed": 1},
            '{"id": "broken", "text": ',
            {"id": "no-clip", "text": "Hi.", "reference": "missing.wav"},
            {"id": "empty", "text": "   "},
            {"id": "good", "text": "Same id again."},
            {"id": "../escape", "text": "Hi."},
            {"id": "a/b", "text": "Hi."},
            {"id": ".hidden", "text": "Hi."},
            {"id": "typo", "txt": "Hi."},
            {"id": "negative", "text": "Hi.", "seed": -3},
            {"id": "unreadable", "text": "Hi.", "reference": "noise.wav"},
            {"id": "unreadable-too", "text": "Hi.", "reference": "noise.wav"},
            {"id": "cloned", "text": "Still done.", "reference": "voice.wav", "seed": 2},
        ],
    )
    out = tmp_path / "out"
    done = run_cli("batch", listing, "--out", out, "--config", demo_config)
    assert done.returncode == 1, done.stderr
    reasons = {row["line"]: (row["id"], row["error"]) for row in summary_rows(out) if row["status"] == "failed"}
    assert reasons.keys() == set(range(2, 13))
    assert reasons[2][0] is None and "not valid JSON" in reasons[2][1]
    assert "reference clip not found" in reasons[3][1] and "missing.wav" in reasons[3][1]
    assert reasons[4] == ("empty", "empty text")
    assert reasons[5] == ("good", "duplicate id (first on line 1)")
    assert all("cannot name a file" in reasons[line][1] for line in (6, 7, 8))
    assert "unknown key(s) txt" in reasons[9][1]
    assert "seed must be an integer >= 0" in reasons[10][1]
    assert reasons[11][1] == reasons[12][1] and "noise.wav" in reasons[11][1]
    assert sorted(path.name for path in out.iterdir()) == ["cloned.wav", "good.wav", SUMMARY]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["list.jsonl", "noise.wav", "out", "voice.wav"]
    assert "done 2, skipped 0" in done.stdout and "failed 11" in done.stdout
    assert "line 7 (a/b): id 'a/b' cannot name a file" in done.stderr


def test_a_clip_shared_by_several_lines_is_encoded_once(
    demo_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_clip(tmp_path / "voices" / "shared.wav")
    write_clip(tmp_path / "voices" / "other.wav", pitch=0.03)
    encoded: list[int] = []
    original = OnnxCodec.encode

    def spy(self: OnnxCodec, samples: np.ndarray) -> np.ndarray:
        encoded.append(samples.size)
        return original(self, samples)

    monkeypatch.setattr(OnnxCodec, "encode", spy)
    listing = tmp_path / "meta.lst"
    listing.write_text(
        "a|transcript|voices/shared.wav|One.\n"
        "b|transcript|voices/other.wav|Two.\n"
        "c|transcript|./voices/../voices/shared.wav|Three.\n"  # the same file, spelled otherwise
        f"d|transcript|{tmp_path / 'voices' / 'shared.wav'}|Four.\n"
    )
    assert batch(demo_config, listing, tmp_path / "out") == 0
    assert len(encoded) == 2


def test_ctrl_c_stops_after_the_current_line_and_a_rerun_does_the_rest(
    demo_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts: list[str] = []
    interrupt_at = 2  # the call, counted from each run's start, during which Ctrl-C is pressed
    original = Synthesizer.synthesize
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest runs in the background (nohup, &)

    def interrupted_during_the_second(self: Synthesizer, text: str, **request: Any) -> Any:
        texts.append(text)
        if len(texts) == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, text, **request)

    monkeypatch.setattr(Synthesizer, "synthesize", interrupted_during_the_second)
    listing = tmp_path / "phrases.txt"
    listing.write_text("One.\nTwo.\nThree.\nFour.\n")
    out = tmp_path / "out"
    assert batch(demo_config, listing, out) == 130
    assert texts == ["One.", "Two."]
    rows = summary_rows(out)
    assert [row["status"] for row in rows] == ["done", "done"]
    assert sorted(path.name for path in out.iterdir()) == sorted([f"{row['id']}.wav" for row in rows] + [SUMMARY])
    assert signal.getsignal(signal.SIGINT) is handler_before  # put back

    texts.clear()  # the rerun is interrupted during its last line: nothing is left, so it ends as a whole run
    assert batch(demo_config, listing, out) == 0
    assert texts == ["Three.", "Four."]
    assert [row["status"] for row in summary_rows(out)] == ["done"] * 4


def test_bad_arguments_exit_2(demo_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ("--out", out, "--config", demo_config)
    assert "not found" in bad_input_message("batch", tmp_path / "none.lst", *base)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    assert "no lines to synthesize" in bad_input_message("batch", blank, *base)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\xe9.\n".encode("latin-1"))
    assert "not UTF-8" in bad_input_message("batch", latin, *base)
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("Hello.\n")
    assert "unknown config key" in bad_input_message("batch", phrases, *base, "--set", "llama.gpu_layers=3")
    assert run_cli("batch", phrases, *base, "--format", "csv").returncode == 2
    assert not out.exists() or not any(out.iterdir())


def test_the_progress_bar_shows_items_done_and_the_time_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    progress = Progress(sys.stderr)
    monkeypatch.setattr(progress, "enabled", True)
    progress.bar(0, 8, None, "first")
    progress.bar(2, 8, 3725.0, "third")
    progress.done()
    shown = capsys.readouterr().err.split("\r")
    assert shown[1].rstrip() == f"[{'.' * 24}] 0/8 ETA --:-- first"
    assert shown[2] == f"[{'#' * 6}{'.' * 18}] 2/8 ETA 1:02:05 third\n"


@pytest.mark.parametrize(
    ("extra", "rate", "channels"),
    [((), 48000, 2), (("--set", "audio.output_sample_rate=16000", "--set", "audio.output_channels=mono"), 16000, 1)],
    ids=["model-48k-stereo", "set-16k-mono"],
)
def test_nano_lines_are_written_as_the_audio_is_given_out(
    nano_demo_config: Path, tmp_path: Path, extra: tuple[str, ...], rate: int, channels: int
) -> None:
    """MOSS-TTS-Nano's lines: 48 kHz stereo WAVs, or what the output keys set, a voice cloned from a 24 kHz clip."""
    write_clip(tmp_path / "voice.wav")
    lines = [
        {"id": "plain", "text": "Battery low.", "seed": 1},
        # seeded: the tiny random model may end a line at its first frame with some seeds, and then no file has frames
        {"id": "cloned", "text": "Hi.", "reference": "voice.wav", "seed": 2},
    ]
    out = tmp_path / "out"
    assert batch(nano_demo_config, write_jsonl(tmp_path / "list.jsonl", lines), out, *extra) == 0
    for line in lines:
        info = sf.info(out / f"{line['id']}.wav")
        assert (info.samplerate, info.channels) == (rate, channels) and info.frames > 0
