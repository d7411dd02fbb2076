"""The streaming cutter: text that arrives in fragments, cut into settled pieces (text/cutter.py)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from moss_tts_node.text.cutter import TextCutter
from moss_tts_node.text.normalize import normalize_text
from moss_tts_node.text.pauses import PAUSE_MARKER
from moss_tts_node.text.split import split_text


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def cut_stream(
    fragments: Sequence[str], clean: Callable[[str], str] = normalize_text, max_run: int = 60, min_piece: int = 0
) -> list[tuple[int, str]]:
    """Each piece with the number of fragments pushed when it came out (len(fragments): at the end)."""
    cutter = TextCutter(clean, max_run, min_piece=min_piece)
    out = []
    for number, fragment in enumerate(fragments, start=1):
        cutter.push(fragment)
        out += [(number, piece) for piece in cutter.cut()]
    return out + [(len(fragments), piece) for piece in cutter.cut(ended=True)]


def pieces(fragments: Sequence[str], **options: object) -> list[str]:
    return [piece for _, piece in cut_stream(fragments, **options)]  # type: ignore[arg-type]


def fragmented(text: str, cuts: Sequence[int]) -> list[str]:
    bounds = [0, *sorted({cut % (len(text) + 1) for cut in cuts}), len(text)]
    return [text[start:end] for start, end in itertools.pairwise(bounds) if end > start]


def test_a_sentence_comes_out_once_the_next_word_has_arrived_whole() -> None:
    fragments = ["Hello", " there", ".", " How", " are", " you", "?", " I", " am", " fine", "."]
    assert cut_stream(fragments) == [(5, "Hello there."), (9, "How are you?"), (11, "I am fine.")]


def test_cjk_sentences_come_out_at_the_next_character() -> None:
    fragments = ["今天", "天气", "很好", "。", "我们", "去", "公园", "吧", "！", "好"]
    assert cut_stream(fragments) == [(5, "今天天气很好。"), (10, "我们去公园吧！"), (10, "好")]


def test_after_the_first_sentence_pieces_pack_sentences_up_to_a_size() -> None:
    text = "Sure. Yes. I can. The kitchen is past the blue door. Bye."
    fragments = [word + " " for word in text.split(" ")]
    assert pieces(fragments, min_piece=12, max_run=40) == [
        "Sure.",  # the first piece: speech starts at once
        "Yes. I can.",  # 11 characters: short of 12 until the next sentence...
        "The kitchen is past the blue door.",  # ...which would take it past 40: it goes alone, and is 12 or more
        "Bye.",  # the end: what is left
    ]
    with pytest.raises(ValueError, match="min_piece <= max_run"):
        TextCutter(normalize_text, 10, min_piece=11)


def test_a_number_or_a_run_of_marks_is_waited_for() -> None:
    # "3." might be "3.14", "Wait." might become "Wait...": nothing is cut until the next word and the
    # marks after it are whole
    fragments = ["Pi is 3", ".", "14", " today", ".", " Wait", ".", ".", ".", " what", "?", " Oh", "."]
    assert cut_stream(fragments) == [(10, "Pi is 3.14 today."), (12, "Wait。"), (13, "what?"), (13, "Oh.")]


def test_a_line_break_ends_a_sentence_with_the_stop_the_clean_up_puts_there() -> None:
    fragments = ["## Plan\n", "1. Open", " the door\n", "2. Walk", " in\n", "Done"]
    assert pieces(fragments) == ["Plan。", "Open the door。", "Walk in。", "Done"]
    assert squeeze("".join(pieces(fragments))) == squeeze(normalize_text("".join(fragments)))
    # without the clean-up a line break still ends the piece
    assert pieces(["one\ntwo", " three\nfour"], clean=str) == ["one", "two three", "four"]


def test_an_open_bracket_holds_the_cut_until_it_closes() -> None:
    """Once closed, "[a -> b. c]" is kept verbatim; open, its arrow would be cleaned into a pause."""
    fragments = ["See [a -> b. Then", " c] said", " he.", " Next", " one."]
    assert cut_stream(fragments) == [(2, "See [a -> b."), (5, "Then c] said he."), (5, "Next one.")]
    assert squeeze("".join(pieces(fragments))) == squeeze(normalize_text("".join(fragments)))


def test_a_long_run_is_cut_at_a_clause_then_a_word_within_the_limit() -> None:
    text = "First we open the door, then we walk down the long corridor to the lab and we wait there"
    got = pieces([word + " " for word in text.split(" ")], max_run=40)
    assert got[0] == "First we open the door,"
    assert all(len(piece) <= 40 for piece in got[:-1])
    assert squeeze("".join(got)) == squeeze(text)
    cjk = "机器人走进房间向大家挥手然后坐下来开始讲一个很长的故事"  # no mark: cut between characters
    got = pieces(list(cjk), max_run=10)
    assert [len(piece) for piece in got] == [10, 10, 7] and "".join(got) == cjk


def test_a_pause_closes_the_piece_at_its_last_word_end() -> None:
    cutter = TextCutter(normalize_text, 60)
    cutter.push("I think that the ans")
    assert cutter.cut() == []
    assert cutter.cut(paused=True) == ["I think that the"]
    cutter.push("wer is 42, and")
    assert cutter.cut(paused=True) == ["answer is 42,"]  # a clause end is a word end too
    cutter.push("这个问题")
    assert cutter.cut(paused=True) == ["and 这个问题"]  # a wide character ends a word
    cutter.push(" [unclosed bracket")
    assert cutter.cut(paused=True) == []  # a pause does not cut inside an open span either
    assert cutter.cut(ended=True) == ["[unclosed bracket"]


def test_a_pause_marker_is_one_unit_and_an_unfinished_one_is_waited_for() -> None:
    fragments = ["Hello. [pau", "se 0.", "8s]", " World", " is", " here.", " Bye"]
    assert cut_stream(fragments) == [(5, "Hello."), (7, "[pause 0.8s] World is here."), (7, "Bye")]
    # a marker alone is no piece: it goes with the next sentence, or at the end with the last
    assert pieces(["Hi.\n[pause 2s]\nThere you", " are.", " [pause 1s]"]) == [
        "Hi.",
        "[pause 2s]。There you are. [pause 1s]",
    ]
    long = "one two three four [pause 1s] five six seven eight nine ten"
    got = pieces([word + " " for word in long.split(" ")], max_run=24)
    assert got[0] == "one two three four" and "[pause 1s]" in got[1]  # cut before the marker, not inside


def test_marks_alone_are_no_piece() -> None:
    cutter = TextCutter(normalize_text, 60)
    cutter.push("Well.")
    assert cutter.cut(paused=True) == ["Well."]
    cutter.push(" ...")
    assert cutter.cut(paused=True) == []
    assert cutter.cut(ended=True) == []


# Texts an LLM writes: Latin and CJK sentences, numbers, markdown, brackets, quotes, line breaks.
_LATIN_WORDS = ["the", "robot", "walks", "in", "Hello", "3.14", "v2.3.1", "42", "ok", "x", "I", "**bold**", "e.g"]
_CJK_WORDS = ["今天", "天气", "很好", "机器人", "你好", "世界", "こんにちは", "我们"]
_MARKS = [".", ",", "!", "?", ";", ":", "...", "!!", "。", "，", "！", "？", "、", "…", "——", "--", " -> "]
_OPENERS = [
    "[1]",
    "[note",
    "]",
    "[pause 0.5s]",
    "[pause",
    " 2s]",
    "「",
    "」",
    "【公告】",
    "(aside)",
    "“",
    "”",
    "《书》",
    "[link](http://a.b/c)",
]
_LINE_STARTS = ["\n", "\n\n", "\n- ", "\n1. ", "\n## ", "\n> ", "\n```\n", "\n---\n", "\n| a | b |"]


@st.composite
def llm_texts(draw: st.DrawFn) -> str:
    parts = draw(
        st.lists(
            st.one_of(
                st.sampled_from(_LATIN_WORDS).map(lambda word: " " + word),
                st.sampled_from([*_LATIN_WORDS, " ", "  "]),
                st.sampled_from(_CJK_WORDS),
                st.sampled_from(_MARKS),
                st.sampled_from(_OPENERS),
                st.sampled_from(_LINE_STARTS),
            ),
            min_size=1,
            max_size=60,
        )
    )
    return "".join(parts)


_PAIRS = {"[": "]", "{": "}", "【": "】", "〖": "〗", "『": "』", "「": "」", "《": "》"}


def span_crosses_a_line(text: str) -> bool:
    """Whether a bracket left open on a line closes on a later one: the clean-up joins the lines first and
    keeps such a span whole, where the cutter, released by the line break, may have cut it."""
    lines = text.split("\n")
    for number, line in enumerate(lines[:-1]):
        later = "\n".join(lines[number + 1 :])
        for opener, closer in _PAIRS.items():
            open_at = line.rfind(opener)
            if open_at >= 0 and closer not in line[open_at:] and closer in later:
                return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    text=llm_texts(),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
    min_piece=st.sampled_from([0, 12]),
)
def test_any_fragmentation_gives_the_same_pieces_which_concatenate_to_the_cleaned_text(
    text: str, cuts: list[int], min_piece: int
) -> None:
    assume(not span_crosses_a_line(text))
    whole = pieces([text], max_run=25, min_piece=min_piece)
    assert pieces(fragmented(text, cuts), max_run=25, min_piece=min_piece) == whole  # the cuts: the text's alone
    cleaned = normalize_text(text)
    speakable = re.search(r"\w", PAUSE_MARKER.sub("", cleaned))  # marks and pause markers alone are not spoken
    assert squeeze("".join(whole)) == (squeeze(cleaned) if speakable else "")  # nothing lost, doubled or reordered
    assert all(piece and piece == piece.strip() for piece in whole)


@settings(max_examples=200, deadline=None)
@given(text=llm_texts(), cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_without_the_clean_up_the_pieces_are_the_text_itself(text: str, cuts: list[int]) -> None:
    got = pieces(fragmented(text, cuts), clean=str, max_run=25)
    assert got == pieces([text], clean=str, max_run=25)
    assert squeeze("".join(got)) == squeeze(text) or not re.search(r"\w", PAUSE_MARKER.sub("", text))


@pytest.mark.parametrize(
    "text", ["The robot walks in. It waves! Does it speak? Yes.", "今天天气很好。我们去公园散步吧！"]
)
def test_pieces_are_the_long_text_splitters_sentences(text: str) -> None:
    """The same rules as split.py: fed word by word, the pieces are its sentences (limit 1: one each)."""
    words = re.findall(r"\S+\s*|\s+", text) if " " in text else list(text)
    assert pieces(words) == split_text(text, 1, lambda piece: len(re.findall(r"[.!?。！？]", piece)))
