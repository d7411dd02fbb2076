"""Pause markers ``[pause X.Ys]`` as one unit wherever text is cut: the splitter, the normalizer, the marker grammar."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from moss_tts_node.choices import PAUSE_MARKER_MODES
from moss_tts_node.text.normalize import normalize_text
from moss_tts_node.text.pauses import (
    MAX_PAUSE_SECONDS,
    check_pause_lengths,
    find_markers,
    resolve_pause_mode,
    split_at_markers,
    unfinished_marker_start,
)
from moss_tts_node.text.split import CLAUSE, SENTENCE, WORD, cut_positions, split_text

MARKER = re.compile(r"\[pause [0-9.]+s\]")
MARKER_UNIT = re.compile(r"\[pause [0-9.]+s\][^\w\s\[]*")  # a marker and the punctuation after it


def markers_of(text: str) -> list[str]:
    return [text[m.start : m.end] for m in find_markers(text)]


def check(text: str, limit: int, measure: Callable[[str], int] = len) -> list[str]:
    """Split, and check what must hold of markers in every split: each arrives whole, in a piece of its own
    or between whitespace/punctuation, and nothing is lost or reordered."""
    pieces = split_text(text, limit, measure)
    assert all(piece == piece.strip() and piece for piece in pieces)
    assert re.sub(r"\s+", "", "".join(pieces)) == re.sub(r"\s+", "", text)
    assert [m for piece in pieces for m in markers_of(piece)] == markers_of(text)  # none cut, none lost
    for piece in pieces:
        assert "[pause" not in MARKER.sub("", piece), (piece, pieces)
        if measure(piece) > limit:  # only a marker (and the punctuation after it) may measure more than the limit
            assert MARKER_UNIT.fullmatch(piece), (piece, pieces)
    return pieces


def test_the_grammar_is_upstreams_and_lenient_where_people_are() -> None:
    text = "a [pause 3.2s] b [pause 2s] c [Pause 0.5 s] d [ pause  1.25s ] e"
    assert [m.seconds for m in find_markers(text)] == [3.2, 2.0, 0.5, 1.25]
    for not_a_marker in ("[S1]", "[pause]", "[pause 3.2]", "[pause abc s]", "[pause -1s]", "pause 3s", "[pauses 1s]"):
        assert find_markers(not_a_marker) == [], not_a_marker


@pytest.mark.parametrize(
    ("text", "limit", "pieces"),
    [
        # the case: a cut between words must not fall inside the marker
        ("First part here. Then [pause 0.8s] go on. Last part.", 12, None),
        ("First. Then [pause 0.8s] go on.", 12, ["First.", "Then", "[pause 0.8s]", "go on."]),
        ("Then [pause 0.8s] go on.", 12, ["Then", "[pause 0.8s]", "go on."]),
        # after a sentence end, after a clause mark, before either
        ("It is done. [pause 1.5s] Now the next one.", 20, ["It is done.", "[pause 1.5s]", "Now the next one."]),
        ("Yes, [pause 1s] and no, [pause 2s] maybe.", 16, ["Yes, [pause 1s]", "and no,", "[pause 2s]", "maybe."]),
        ("Wait [pause 1s].", 8, ["Wait", "[pause 1s]."]),  # the punctuation after a marker stays with it
        # at the start and at the end of the text
        ("[pause 2s] Good morning to all of you.", 14, ["[pause 2s]", "Good morning", "to all of you."]),
        ("Good morning to all of you. [pause 2s]", 14, ["Good morning", "to all of you.", "[pause 2s]"]),
        # adjacent markers, with and without a space
        ("Look. [pause 1s][pause 2s] There.", 10, ["Look.", "[pause 1s]", "[pause 2s]", "There."]),
        ("Look. [pause 1s] [pause 2s] There.", 12, ["Look.", "[pause 1s]", "[pause 2s]", "There."]),
        # glued to the words around it: cut there, never part of a word
        ("wait[pause 1s]go now please", 9, ["wait", "[pause 1s]", "go now", "please"]),
        # inside CJK text, without and with spaces, and before CJK punctuation
        ("它的名字是[pause 3.2s]静夜思！", 6, ["它的名字是", "[pause 3.2s]", "静夜思！"]),
        ("它的名字是 [pause 3.2s] 静夜思！", 6, ["它的名字是", "[pause 3.2s]", "静夜思！"]),
        ("我们走吧[pause 1s]，好吗？", 8, ["我们走吧", "[pause 1s]，", "好吗？"]),
        # a marker that alone measures more than the limit is still never cut
        ("abc [pause 12.5s] def", 4, ["abc", "[pause 12.5s]", "def"]),
        ("abcdefghij[pause 1s]klmnop", 4, ["abcd", "efgh", "ij", "[pause 1s]", "klmn", "op"]),
    ],
)
def test_markers_are_never_cut_at_any_kind_of_boundary(text: str, limit: int, pieces: list[str] | None) -> None:
    got = check(text, limit)
    if pieces is not None:
        assert got == pieces


def test_a_text_that_fits_keeps_its_markers_where_they_are() -> None:
    text = "Hello [pause 1s] world. 你好[pause 0.5s]世界。"
    assert split_text(text, 100) == [text]


def test_markers_survive_every_split_of_random_mixed_text() -> None:
    """Random text of words, CJK runs, punctuation and markers, cut at random limits, by characters and by words."""
    rng = random.Random(7)
    atoms = [
        "word",
        "robot",
        "go",
        "你好",
        "机器人走进房间",
        ".",
        ",",
        "。",
        "，",
        "!",
        "？",
        "[pause 1s]",
        "[pause 0.25s]",
    ]
    for _ in range(400):
        text = "".join(rng.choice(atoms) + rng.choice(["", " ", "  "]) for _ in range(rng.randint(1, 25))).strip()
        if not text:
            continue
        check(text, rng.randint(1, 30))
        check(text, rng.randint(1, 6), lambda piece: len(piece.split()))


def test_cut_positions_are_the_shared_rule_and_never_fall_inside_a_marker() -> None:
    text = "Go on. Then [pause 0.8s], wait[pause 1s]go."
    first, second = text.index("[pause 0.8s]"), text.index("[pause 1s]")
    assert cut_positions(text, SENTENCE) == [len("Go on. ")]  # markers are no sentence ends
    assert cut_positions(text, CLAUSE) == [first, first + len("[pause 0.8s], "), second, second + len("[pause 1s]")]
    words = cut_positions(text, WORD)
    assert not any(m.start < cut < m.end for m in find_markers(text) for cut in words)
    assert {first, second, second + 10} <= set(words)


def test_an_unfinished_marker_at_the_end_of_arriving_text_is_found() -> None:
    for head in (
        "[",
        "[p",
        "[pau",
        "[pause",
        "[pause ",
        "[pause 3",
        "[pause 3.",
        "[pause 3.2",
        "[pause 3.2s",
        "[ Pause 2 s",
    ):
        assert unfinished_marker_start("Then " + head) == 5, head
    for done in (
        "Then",
        "Then [pause 3.2s]",
        "Then [pause 3.2s] go",
        "Then [S1",
        "Then [x",
        "a [pausex",
        "[pause 1s] b",
    ):
        assert unfinished_marker_start(done) is None, done


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("它的名字是[pause 3.2s]静夜思！", "它的名字是[pause 3.2s]静夜思！"),  # upstream's own example
        ("Hello [pause 1s] world.", "Hello [pause 1s] world."),
        ("Hello[pause 1s]world", "Hello[pause 1s]world"),  # nothing added, nothing joined
        ("它 [pause 1s] 静", "它 [pause 1s] 静"),
        ("[pause 1s] first", "[pause 1s] first"),
        ("last [pause 1s]", "last [pause 1s]"),
        ("Wait... [pause 2s] go!!", "Wait。[pause 2s] go！"),
        ("- [pause 1s] item\n- next", "[pause 1s] item。next"),
        ("a -> [pause 1s] -> b", "a，[pause 1s]，b"),
        ("**[pause 1s]**[pause 2s]", "[pause 1s][pause 2s]"),
        ("5G[pause 1s]网络", "5G[pause 1s]网络"),
    ],
)
def test_the_normalizer_keeps_markers_whole_and_never_joins_them_to_words(text: str, normalized: str) -> None:
    assert normalize_text(text) == normalized
    assert normalize_text(normalized) == normalized


def test_speech_between_markers_and_adjacent_markers_adding_up() -> None:
    assert split_at_markers("它的名字是[pause 3.2s]静夜思！") == ["它的名字是", 3.2, "静夜思！"]
    assert split_at_markers("[pause 1s] Hi. [pause 0.5s] [pause 0.25s] Bye. [pause 2s]") == [
        1.0,
        "Hi.",
        0.75,
        "Bye.",
        2.0,
    ]
    assert split_at_markers("No markers here.") == ["No markers here."]
    assert split_at_markers("[pause 1s]") == [1.0]


def test_pause_lengths_are_bounded_and_auto_follows_the_checkpoint() -> None:
    check_pause_lengths(f"ok [pause {MAX_PAUSE_SECONDS:g}s]")
    with pytest.raises(ValueError, match=r"'\[pause 61s\]' asks for more than 60 s: split the request"):
        check_pause_lengths("too long [pause 61s]")
    assert resolve_pause_mode("auto", True) == "model"
    assert resolve_pause_mode("auto", False) == "silence"  # 1.0 reads a marker out
    assert resolve_pause_mode("auto", None) == "silence"  # unknown: exact on either checkpoint
    for mode in set(PAUSE_MARKER_MODES) - {"auto"}:
        assert resolve_pause_mode(mode, None) == resolve_pause_mode(mode, True) == mode
