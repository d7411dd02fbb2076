"""Dialogues (docs/family.md, "Dialogues"): a MOSS-TTSD text longer than one generation is cut between speaker turns,
each piece opened with its speaker's tag, and each piece after the first continues the audio the piece before it
generated (its frames as the prefix, its text as their transcript), the first the request's prefix (the speakers'
clips one after the other, from the library's voices and their transcripts); the stream is the codec's decode of
each piece after the audio it continues, as offline, on codec-tiny's real architecture. That a continuation's rows
are upstream's, token for token, is ``test_family_reference.py``'s."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import bad_input_message, linked_copy, prompt_text, run_cli

from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.errors import RequestError
from moss_tts_node.model.delay import apply_delay, remove_delay
from moss_tts_node.model.family import MOSS_TTSD
from moss_tts_node.model.identity import RECORD_KEY, ModelIdentity
from moss_tts_node.model.layout import CONFIG_FILE
from moss_tts_node.model.rates import SAMPLES_PER_FRAME
from moss_tts_node.synthesis.dialogue import DialoguePieces
from moss_tts_node.synthesis.pipeline import Generated
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.text.normalize import normalize_text
from moss_tts_node.text.pieces import Piece, PiecePlanner
from moss_tts_node.text.prompt import PromptFields
from moss_tts_node.text.speakers import SPEAKER_TAG
from moss_tts_node.timing import StopReason
from moss_tts_node.tools.dev.demo_weights import DIALOGUE_TEMPLATE

TURNS = [
    "[S1]Hello there, robot. The quick brown fox jumps over the lazy dog.",
    "[S2]Speech synthesis on a small computer. Hello, robot.",
]
DIALOGUE = " ".join(TURNS * 4)
ALICE = np.random.default_rng(31).integers(0, 1024, size=(20, 16))
BOB = np.random.default_rng(32).integers(0, 1024, size=(15, 16))
PREFIX_TEXT = "[S1] Hello robot. [S2] Hello."
SMALL_CONTEXT = {"llama.n_ctx": 1024}  # the demo's 2048 holds the whole dialogue in one piece


@pytest.fixture(scope="module")
def dialogue_config(family_demo: Callable[[str], Path]) -> Path:
    return family_demo("moss-ttsd")


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A voice directory: alice and bob with their transcripts, carol without one."""
    directory = tmp_path_factory.mktemp("voices")
    for name, codes in (("alice", ALICE), ("bob", BOB), ("carol", BOB)):
        np.save(directory / f"{name}.npy", codes)
    (directory / "alice.txt").write_text("Hello robot.", encoding="utf-8")
    (directory / "bob.txt").write_text("[S2] Good day.", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def dialogue(dialogue_config: Path, voices: Path) -> Iterator[Synthesizer]:
    overrides = {**SMALL_CONTEXT, "voices.directories": [str(voices)]}
    with Synthesizer.from_config_file(dialogue_config, overrides) as loaded:
        yield loaded


class Spoken:
    """Each piece a dialogue spoke, in order, and what it generated (``DialoguePieces.spoken``, recorded)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pieces: list[tuple[Piece, Generated]] = []
        original = DialoguePieces.spoken

        def spoken(source: DialoguePieces, piece: Piece, generated: Generated) -> None:
            self.pieces.append((piece, generated))
            original(source, piece, generated)

        monkeypatch.setattr(DialoguePieces, "spoken", spoken)


# -- the plan -------------------------------------------------------------------------------------------------


def test_a_dialogue_is_cut_between_turns_with_room_to_carry_each_piece_beside_the_next(dialogue: Synthesizer) -> None:
    planner = dialogue.planner
    long_turn = "[S2]" + " ".join(["Speech synthesis on a small computer."] * 12)
    text = f"{DIALOGUE} {long_turn} {TURNS[0]}"
    references = [ALICE, BOB]
    pieces = [p for p in planner.plan(PromptFields(text=text), references, 600) if isinstance(p, Piece)]
    texts = [piece.fields.text for piece in pieces if piece.fields is not None]
    assert len(texts) == len(pieces) > 4
    assert all(SPEAKER_TAG.match(piece) for piece in texts)  # every piece says who speaks
    # Between turns, where they fit: only the long turn is cut inside, and each of its pieces opens with [S2] again.
    inside = [piece for piece in texts if piece.startswith("[S2]Speech synthesis on a small computer. Speech")]
    assert len(inside) > 1 and all(SPEAKER_TAG.findall(piece) == ["[S2]"] for piece in inside)
    assert sum(len(SPEAKER_TAG.findall(piece)) for piece in texts) == len(SPEAKER_TAG.findall(text)) + len(inside) - 1
    assert all(piece.count("[S") == 1 or piece.endswith(".") for piece in texts)
    # Each piece, had it spoken as long as planned, can be carried beside the next.
    for previous, piece in itertools.pairwise(pieces):
        frames = np.zeros((previous.expected_frames, 16), dtype=np.int64)
        assert planner.continued(piece, previous, frames, references, True) is not None


def test_a_piece_is_not_made_to_carry_more_than_its_room(dialogue: Synthesizer) -> None:
    """In the context: its carried frames, then the frames it expects to make and the ramp; in the codec window: the
    frames it decodes after, and its own."""
    planner: PiecePlanner = dialogue.planner
    first, second = [p for p in planner.plan(PromptFields(text=DIALOGUE), [], 600) if isinstance(p, Piece)][:2]

    def carrying(frames: int) -> Piece | None:
        return planner.continued(second, first, np.zeros((frames, 16), dtype=np.int64), [], True)

    one = carrying(1)
    assert one is not None and one.prefix_frames == 1 and one.max_steps == min(second.max_steps, 1024 - len(one.prompt))
    before = one.prompt.shape[0] - 1  # the rows but the carried frames'
    room = min(planner.codec_frames, 1024 - before - 16) - second.expected_frames
    assert carrying(room) is not None and carrying(room + 1) is None


# -- each piece continues the one before ---------------------------------------------------------------------


def test_each_piece_continues_the_audio_the_piece_before_generated(
    dialogue: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    spoken = Spoken(monkeypatch)
    prefix = np.concatenate([ALICE, BOB])
    stream = dialogue.stream(
        DIALOGUE, voice=[ALICE, BOB], prefix=prefix, prefix_text=PREFIX_TEXT, scene="a lab", seed=1
    )
    list(stream)
    assert stream.codes is not None and len(spoken.pieces) >= 3
    first = spoken.pieces[0][0]
    assert first.prefix_frames == prefix.shape[0]  # the first continues the request's prefix
    assert f"- Text:\n{normalize_text(f'{PREFIX_TEXT} {TURNS[0]}')}" in prompt_text(dialogue, first.prompt)
    for (previous, generated), (piece, _) in zip(spoken.pieces, spoken.pieces[1:], strict=False):
        assert generated.stop is StopReason.END
        frames = generated.frames
        assert piece.prefix_frames == frames.shape[0] > 0
        carried = piece.prompt[piece.prompt.shape[0] - frames.shape[0] :, 1:]
        np.testing.assert_array_equal(carried, apply_delay(frames, 1024)[: frames.shape[0]])
        assert piece.fields is not None and previous.fields is not None and piece.fields.text is not None
        text = prompt_text(dialogue, piece.prompt)
        said = normalize_text(f"{previous.fields.text} {piece.fields.text}")
        assert f"- Scene:\na lab\n- Text:\n{said}\n</user_inst>" in text
        assert text.count("[S1]:\n<|audio_start|>") == text.count("[S2]:\n<|audio_start|>") == 1  # the references
    # The stream is each piece's new frames, in order.
    np.testing.assert_array_equal(stream.codes, np.concatenate([g.frames for _, g in spoken.pieces]))


def test_a_piece_after_one_cut_short_continues_the_requests_prefix(
    dialogue: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece stopped by max_new_tokens did not say all its text: it is not carried as if it had."""
    spoken = Spoken(monkeypatch)
    prefix = np.concatenate([ALICE, BOB])
    request: dict[str, Any] = {"voice": [ALICE, BOB], "prefix": prefix, "prefix_text": PREFIX_TEXT}
    list(dialogue.stream(DIALOGUE, seed=1, max_new_tokens=30, **request))
    assert len(spoken.pieces) >= 3
    assert all(g.stop is StopReason.MAX_NEW_TOKENS for _, g in spoken.pieces)
    assert all(piece.prefix_frames == prefix.shape[0] for piece, _ in spoken.pieces)


def test_the_speakers_clips_and_transcripts_are_the_first_pieces_prefix(dialogue: Synthesizer) -> None:
    """As upstream's MOSS-TTSD card builds it: the clips one after the other, each transcript opened by its tag."""
    alice, bob, carol = (dialogue.voices[name] for name in ("alice", "bob", "carol"))
    stream = dialogue.stream(TURNS[0], voice=[alice, bob], seed=1)
    assert stream.prompt is not None
    frames = ALICE.shape[0] + BOB.shape[0]
    audio = stream.prompt[stream.prompt.shape[0] - frames :, 1:]
    np.testing.assert_array_equal(audio, apply_delay(np.concatenate([ALICE, BOB]), 1024)[:frames])
    assert f"- Text:\n[S1] Hello robot. [S2] Good day. {TURNS[0]}\n" in prompt_text(dialogue, stream.prompt)
    # Bob's turn goes on where his transcript ends: one turn, as upstream's app joins a speaker's turns.
    bobs = dialogue.stream(TURNS[1], voice=[alice, bob], seed=1)
    assert bobs.prompt is not None
    assert f"- Text:\n[S1] Hello robot. [S2] Good day. {TURNS[1][4:]}\n" in prompt_text(dialogue, bobs.prompt)
    # A speaker without a transcript: no prefix, the references alone (the prompt ends on audio_start).
    plain = dialogue.stream(TURNS[0], voice=[alice, carol], seed=1)
    assert plain.prompt is not None and plain.prompt[-1, 0] == dialogue.spec.audio_start_token_id
    limits = replace(dialogue.config.limits, max_reference_seconds=2.0)
    with pytest.raises(RequestError, match=r"the prefix made of the speakers' clips lasts 2\.8 s, longer than the 2 s"):
        dialogue.stream(TURNS[0], voice=[alice, bob], config=replace(dialogue.config, limits=limits))


def test_text_that_arrives_in_fragments_is_spoken_the_same_way(
    dialogue: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    spoken = Spoken(monkeypatch)
    list(dialogue.stream_text(iter(DIALOGUE.split(" ")), voice=[ALICE, BOB], seed=1))
    continued = [piece for piece, _ in spoken.pieces[1:] if piece.prefix_frames]
    assert len(spoken.pieces) > 2 and len(continued) == len(spoken.pieces) - 1


def test_low_memory_speaks_a_dialogue_alike(
    dialogue: Synthesizer, dialogue_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """There every piece is generated before any is decoded: each is still made to continue the one before."""
    spoken = Spoken(monkeypatch)
    with Synthesizer.from_config_file(dialogue_config, {**SMALL_CONTEXT, "model.low_memory": True}) as low:
        turns = low.synthesize(DIALOGUE, seed=3)
    assert len(spoken.pieces) > 2 and all(piece.prefix_frames for piece, _ in spoken.pieces[1:])
    usual = dialogue.synthesize(DIALOGUE, seed=3)
    np.testing.assert_array_equal(turns.codes, usual.codes)
    np.testing.assert_array_equal(turns.audio, usual.audio)


def test_moss_tts_does_not_speak_in_turns(synth: Synthesizer) -> None:
    """MOSS-TTS's long texts stay as they were: each piece on its own (the existing tests pin its audio)."""
    assert not synth.spec.identity.dialogue and MOSS_TTSD.dialogue


# -- the audio: the codec's decode of each piece after the audio it continues --------------------------------


@pytest.fixture(scope="module")
def stateful_dialogue(
    demo_config: Path, codec_tiny_streaming_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Synthesizer]:
    """The 32-codebook demo recorded as a dialogue model with MOSS-TTSD's template, speaking through codec-tiny's stream
    decoder. The stream decoder graphs decode the codec's 32 quantizers only (a 16-codebook model streams with the
    windowed scheme), so the dialogue's audio path is checked at 32: it does not depend on the count."""
    weights = linked_copy(demo_config.parent, tmp_path_factory.mktemp("dialogue32"), skip=[CONFIG_FILE])
    config = json.loads((demo_config.parent / CONFIG_FILE).read_text())
    config[RECORD_KEY] = ModelIdentity(MOSS_TTSD, template=DIALOGUE_TEMPLATE).to_record(32)
    (weights / CONFIG_FILE).write_text(json.dumps(config))
    overrides = {**SMALL_CONTEXT, "model.codec_dir": str(codec_tiny_streaming_dir)}
    with Synthesizer.from_config_file(weights / "config.yaml", overrides) as loaded:
        yield loaded


def test_a_dialogue_streams_what_the_codec_decodes_after_the_audio_each_piece_continues(
    stateful_dialogue: Synthesizer, codec_tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synth = stateful_dialogue
    assert synth.spec.identity.dialogue and synth.stages.stream_decoding is not None
    spoken = Spoken(monkeypatch)
    stream = synth.stream(DIALOGUE, seed=2)
    audio = np.concatenate([chunk.samples for chunk in stream])
    assert stream.report is not None and stream.report.codec_decode == "stateful stream"
    pieces = list(spoken.pieces)
    assert len(pieces) >= 3 and all(piece.prefix_frames for piece, _ in pieces[1:])
    whole = synth.synthesize(DIALOGUE, seed=2)  # offline: each piece decoded with what it continues
    np.testing.assert_allclose(audio, whole.audio, rtol=0, atol=1e-6)
    # Each piece's audio is the codec's decode of the frames it continues (as it completed them) and its own.
    codec = OnnxCodec(codec_tiny_dir / "decoder.onnx", provider="cpu")
    start = pieces[0][1].frames.shape[0] * SAMPLES_PER_FRAME
    for piece, generated in pieces[1:]:
        context = piece.prefix_frames
        rows = np.concatenate([piece.prompt[piece.prompt.shape[0] - context :, 1:], generated.rows[:, 1:]])
        completed = remove_delay(rows)[:context]
        expected = codec.decode(np.concatenate([completed, generated.frames]))[context * SAMPLES_PER_FRAME :]
        np.testing.assert_allclose(audio[start : start + expected.shape[0]], expected, rtol=0, atol=1e-6)
        start += expected.shape[0]
    assert start == audio.shape[0]


def test_the_cli_takes_a_scene_where_the_model_has_one(
    dialogue: Synthesizer, dialogue_config: Path, demo_config: Path, tmp_path: Path
) -> None:
    tokens, out = tmp_path / "tokens.npz", tmp_path / "out.wav"
    scene = ("--scene", "a lab", "--output", out)
    done = run_cli("synth", "--config", dialogue_config, "--text", TURNS[0], *scene, "--save-tokens", tokens)
    assert done.returncode == 0, done.stderr
    assert "- Scene:\na lab\n- Text:\n" in prompt_text(dialogue, np.load(tokens)["prompt"])
    assert "prompt has no scene field" in bad_input_message("synth", "--config", demo_config, "--text", "Hi.", *scene)
