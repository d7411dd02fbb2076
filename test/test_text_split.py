"""Splitting long text at sentence, clause and word boundaries (CJK and Latin)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from moss_tts_node.text.split import split_text


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def check(text: str, limit: int, measure: Callable[[str], int] = len, turns: bool = False) -> list[str]:
    """Split, and check the invariants every split must keep."""
    pieces = split_text(text, limit, measure, turns)
    assert all(piece == piece.strip() and piece for piece in pieces)
    assert all(measure(piece) <= limit for piece in pieces), pieces
    assert squeeze("".join(pieces)) == squeeze(text)  # nothing lost, nothing reordered
    return pieces


def test_short_text_is_one_piece_and_empty_text_none() -> None:
    assert split_text("  Hello there.  ", 100) == ["Hello there."]
    assert split_text(" \n ", 10) == []
    with pytest.raises(ValueError, match="at least 1"):
        split_text("Hello.", 0)


def test_latin_sentences_are_packed_up_to_the_limit() -> None:
    text = "The robot walks in. It waves! Does it speak? Yes. It says hello to all of you."
    assert check(text, 40) == [
        "The robot walks in. It waves!",
        "Does it speak? Yes.",
        "It says hello to all of you.",
    ]


def test_latin_periods_inside_numbers_names_and_versions_do_not_end_sentences() -> None:
    text = "Pi is 3.14 and v2.3.1 shipped on example.com today. Next sentence here."
    assert check(text, 55) == ["Pi is 3.14 and v2.3.1 shipped on example.com today.", "Next sentence here."]


def test_closing_quotes_and_brackets_stay_with_their_sentence() -> None:
    text = 'He said "stop here." Then (after a pause.) he went on. 她说：“好的。”然后走了。'
    pieces = check(text, 22)
    assert pieces[0] == 'He said "stop here."'
    assert "“好的。”" in "".join(pieces) and any(piece.endswith("“好的。”") for piece in pieces)


def test_cjk_sentences_split_without_spaces() -> None:
    text = "今天天气很好。我们去公园散步吧！你觉得怎么样？好的，那我们走吧。"
    assert check(text, 10) == ["今天天气很好。", "我们去公园散步吧！", "你觉得怎么样？", "好的，那我们走吧。"]
    assert check(text, 16) == ["今天天气很好。我们去公园散步吧！", "你觉得怎么样？好的，那我们走吧。"]


def test_an_over_long_sentence_falls_back_to_clauses_then_words() -> None:
    text = "First, we open the door; then, carefully, we walk through the long corridor to the lab."
    clauses = check(text, 30)
    assert clauses[0] == "First, we open the door; then,"  # clause marks, packed
    words = check("one two three four five six seven eight nine ten", 14)
    assert words == ["one two three", "four five six", "seven eight", "nine ten"]


def test_cjk_without_punctuation_is_cut_by_characters_as_a_last_resort() -> None:
    assert check("一二三四五六七八九十一二三四", 6) == ["一二三四五六", "七八九十一二", "三四"]
    assert check("Supercalifragilisticexpialidocious", 10)[0] == "Supercalif"


def test_long_clause_inside_a_cjk_sentence_is_cut_at_its_commas() -> None:
    text = "机器人走进房间，向大家挥手，然后坐下来开始讲一个很长的故事。"
    assert check(text, 8) == ["机器人走进房间，", "向大家挥手，", "然后坐下来开始讲", "一个很长的故事。"]


def test_mixed_scripts_and_a_token_like_measure() -> None:
    text = "Hello world. 你好世界。This is a test! 这是一个测试。"

    def words(piece: str) -> int:  # a rough "token" count: Latin words plus CJK characters
        return len(re.findall(r"[A-Za-z]+|[\u4e00-\u9fff]", piece))

    pieces = check(text, 6, words)
    assert pieces == ["Hello world. 你好世界。", "This is a test!", "这是一个测试。"]


def test_speaker_tags_stay_whole_and_with_their_speech_and_a_turn_may_end_before_the_next() -> None:
    text = "[S1]Hello there, how are you today[S2] Fine thanks and you[S1]我也很好谢谢你们大家"
    pieces = check(text, 36)
    assert pieces == ["[S1]Hello there, how are you today", "[S2] Fine thanks and you", "[S1]我也很好谢谢你们大家"]
    # by words, by characters: never "[S2]" alone, nor "[S" | "1]"
    assert check("[S1] one two three [S2] four five six", 9) == ["[S1] one", "two three", "[S2] four", "five six"]
    assert check("[S1]一二三四五六七八", 5) == ["[S1]一", "二三四五六", "七八"]


def test_a_dialogue_is_cut_between_turns_and_a_long_turn_at_its_sentences() -> None:
    text = "[S1]Hi. How are you? [S2]Fine. And you? [S1]Good. Thanks for asking, really. [S2]Bye."
    # Turns packed whole while they fit, where sentences packed would end pieces inside turns.
    turns = ["[S1]Hi. How are you?", "[S2]Fine. And you?", "[S1]Good. Thanks for asking, really.", "[S2]Bye."]
    assert check(text, 36, turns=True) == turns
    assert check(text, 36) == [
        "[S1]Hi. How are you? [S2]Fine.",
        "And you? [S1]Good.",
        "Thanks for asking, really. [S2]Bye.",
    ]
    # A turn longer than the limit is cut at its sentences, then clauses, as any text.
    assert check(text, 20, turns=True) == [*turns[:2], "[S1]Good.", "Thanks for asking,", "really.", "[S2]Bye."]
