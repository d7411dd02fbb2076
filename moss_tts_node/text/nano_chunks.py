"""Long text cut as MOSS-TTS-Nano's upstream cuts it for voice cloning (docs/nano.md, "Long text").

Upstream (``_split_text_into_best_sentences``, with its runtime's budget of ``CHUNK_TOKENS``) readies the text
(newlines to spaces, single spaces; a CJK text ends on 。 unless it ends a sentence; another text gets a capital
first letter, a full stop after a last letter or digit, and eight spaces before it when it has under five words),
cuts it after each sentence end (keeping closing quotes and brackets with it), cuts a sentence over the budget
after each clause mark, and a clause still over it at the longest prefix within the budget, moved back to a space
or mark among its last 25 characters. Then it packs the pieces greedily into chunks within the budget, joined with a
space (none where either side is CJK). A text that makes one chunk is spoken as it was given, unreadied; between
chunks go ``pause_after(chunk)`` seconds of silence.
"""

from __future__ import annotations

from collections.abc import Callable

SENTENCE_ENDS = frozenset(".!?。！？；;")
CLAUSE_MARKS = frozenset(",，、；;：:")
CLOSING_MARKS = frozenset("\"'”’)]}）】》」』")
# upstream's runtimes (ort_cpu_runtime.py, moss_tts_nano_runtime.py) speak chunks of at most 75 tokens; the model's
# own inference() defaults to 50.
CHUNK_TOKENS = 75
# Where a cut at the budget looks back for a space or a mark, in characters.
CUT_LOOKBACK = 25
SHORT_CHUNK_WORDS = 4
SHORT_CHUNK_PAUSE_S = 0.40
LONG_CHUNK_PAUSE_S = 0.24
_CJK_RANGES = (("\u4e00", "\u9fff"), ("\u3400", "\u4dbf"), ("\u3040", "\u30ff"), ("\uac00", "\ud7af"))


def has_cjk(text: str) -> bool:
    """Whether ``text`` has a Han, kana or Hangul character (the ranges upstream checks)."""
    return any(low <= ch <= high for ch in text for low, high in _CJK_RANGES)


def readied(text: str) -> str:
    """``text`` as upstream readies it for cutting (the module's docstring); ValueError when it is empty."""
    text = text.strip().replace("\n", " ").replace("\r", " ")
    if not text:
        raise ValueError("the text is empty")
    while "  " in text:
        text = text.replace("  ", " ")
    if has_cjk(text):
        return text if text[-1] in SENTENCE_ENDS else text + "。"
    if not text[0].isupper():
        text = text[0].upper() + text[1:]
    if text[-1].isalnum():
        text += "."
    return " " * 8 + text if len(text.split()) < 5 else text


def cut_after(text: str, marks: frozenset[str]) -> list[str]:
    """``text`` cut after each of ``marks`` (and the closing marks right after it), each part stripped."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        current.append(text[i])
        if text[i] in marks:
            i += 1
            while i < len(text) and text[i] in CLOSING_MARKS:
                current.append(text[i])
                i += 1
            if part := "".join(current).strip():
                parts.append(part)
            current = []
            while i < len(text) and text[i].isspace():
                i += 1
            continue
        i += 1
    if tail := "".join(current).strip():
        parts.append(tail)
    return parts


def cut_at_budget(text: str, budget: int, count: Callable[[str], int]) -> list[str]:
    """``text`` cut into parts of at most ``budget`` tokens: each the longest prefix that fits (found by bisection),
    ended at a space or mark among its last CUT_LOOKBACK characters where there is one."""
    rest = text.strip()
    parts: list[str] = []
    boundaries = CLAUSE_MARKS | SENTENCE_ENDS | {" "}
    while rest:
        if count(rest) <= budget:
            parts.append(rest)
            break
        low, high, longest = 1, len(rest), 1
        while low <= high:
            middle = (low + high) // 2
            candidate = rest[:middle].strip()
            if candidate and count(candidate) <= budget:
                longest, low = middle, middle + 1
            elif candidate:
                high = middle - 1
            else:
                low = middle + 1
        cut = longest
        for i in range(longest - 1, max(-1, longest - CUT_LOOKBACK), -1):
            if rest[i] in boundaries:
                cut = i + 1
                break
        part = rest[:cut].strip()
        if not part:
            part, cut = rest[:longest].strip(), longest
        parts.append(part)
        rest = rest[cut:].strip()
    return parts


def joined(left: str, right: str) -> str:
    if not left or not right:
        return left or right
    return left + right if has_cjk(left) or has_cjk(right) else f"{left} {right}"


def nano_chunks(text: str, count: Callable[[str], int], budget: int = CHUNK_TOKENS) -> list[str]:
    """The chunks upstream speaks ``text`` in, ``count`` giving a text's tokens: the text as given when it makes one."""
    ready = readied(text)
    pieces: list[tuple[int, str]] = []
    for sentence in cut_after(ready, SENTENCE_ENDS) or [ready.strip()]:
        if (n := count(sentence)) <= budget:
            pieces.append((n, sentence))
            continue
        clauses = cut_after(sentence, CLAUSE_MARKS)
        for clause in clauses if len(clauses) > 1 else [sentence]:
            if (n := count(clause)) <= budget:
                pieces.append((n, clause))
            else:
                pieces.extend((count(part), part) for part in cut_at_budget(clause, budget, count))
    chunks: list[str] = []
    current, current_tokens = "", 0
    for tokens, piece in pieces:
        if not current:
            current, current_tokens = piece, tokens
        elif current_tokens + tokens > budget:
            chunks.append(current.strip())
            current, current_tokens = piece, tokens
        else:
            current = joined(current, piece)
            current_tokens = count(current)
    if current:
        chunks.append(current.strip())
    chunks = chunks or [ready.strip()]
    return chunks if len(chunks) > 1 else [text]


def pause_after(chunk: str) -> float:
    """Seconds of silence upstream puts after a chunk that another follows."""
    return SHORT_CHUNK_PAUSE_S if len(chunk.strip().split()) <= SHORT_CHUNK_WORDS else LONG_CHUNK_PAUSE_S
