"""Robustness cleanup of the text a robot is asked to speak.

MOSS-TTS's original HF processor cleans the text before building the prompt; upstream's llama.cpp
port skips that step (docs/model.md, "Upstream"). A robot's text often comes from an LLM and is full of
markdown, so we do it here. The cleanup is **non-semantic**: it never expands numbers, units, dates or amounts, it only
removes or replaces symbols that a speech model would stumble over. It is **idempotent**:
``normalize_text(normalize_text(x)) == normalize_text(x)``.

Pipeline (one small function per rule family, in this order)::

    _clean_characters        line breaks unified, odd spaces to " ", control/zero-width chars dropped
    _flatten_markdown        links, ** and `, line markers (# > - * + 1. 1)), rules, table bars;
                             empty lines dropped, the rest joined with "。"
    _mask_brackets           [...] and {...} hidden behind placeholders (kept verbatim)
    _replace_separators      arrows (->  =>  <-  →  ⇒ ...) and table bars | become "，"
    _mask_tokens             URLs, e-mails, @mentions, r/ u/ names, #hashtags, .dotfiles,
                             file/version-like tokens hidden behind placeholders
    _replace_dashes          ——  --  become "。"
    _collapse_punctuation    ...  ……  。。  ，，  !!  ??  ?!  (again after unwrapping)
    _unwrap_brackets         【x】 〖x〗 『x』 「x」 at a sentence start, stand-alone 《title》
    _normalize_spaces        spacing rules by script
    _restore_spans           placeholders back to the original text

Protected spans are replaced by one private-use character each (plane 15 for tokens, plane 16 for
brackets), so no later rule can see inside them, and restored at the end. User text cannot collide
with a placeholder: ``_clean_characters`` removes every private-use character first.

Idempotence: every rule only creates what a later rule handles (runs may contain spaces because
spacing comes last, the collapse order is fixed, ...), so ordinary text is stable after one pass.
In symbol soup two rules can still feed each other (unwrapping ``【- x】`` at the text start
exposes a list marker), so ``normalize_text`` re-applies the pipeline until the output is a
verified fixed point: one extra pass for ordinary text, which is cheap next to synthesis.

Decisions where the rules of docs/model.md ("Text clean-up") leave room (chosen for what a listener expects):

- ``[...]`` / ``{...}`` "contents kept": the whole span, brackets included, stays verbatim
  (``[S1]``, ``{whisper}``, ``[1]``); it is not a Latin token for the CJK spacing rule. So a pause marker
  (``[pause 3.2s]``, ``text/pauses.py``) stays one unit, and the spaces on either side of it stay as written:
  no rule joins it to a word or removes it.
- Lines are joined with ``。`` only when the previous line does not already end in a pause mark;
  after ``.!?;:,`` (ASCII) they are joined with a space, after CJK pause marks with nothing,
  so ``"Done.\\nNext"`` becomes ``"Done. Next"``, not ``"Done.。Next"``. No ``。`` is added at
  the very end of the text.
- Numbered items are ``1.``..``999.`` / ``1)`` followed by a space, so a line starting with a
  year (``2024. ...``) keeps it. Line markers are stripped repeatedly (``> - 1. x`` -> ``x``);
  a line starting with an arrow, a dash run, an ellipsis or a stray ``。，、；`` loses it too,
  otherwise it would leave a leading pause.
- Beyond those rules, because LLM output is full of them: ``**`` runs and backticks are removed,
  code-fence lines (```` ``` ````, ``~~~``), horizontal rules and table separator rows
  (lines of only ``-*_=|:+`` and spaces) are dropped, ``•`` is a bullet too, and ``- [ ]`` /
  ``- [x]`` task boxes are dropped. Single ``*``/``_`` emphasis is left alone (``2*3``, ``__init__``).
- ``[text](target)`` accepts any target without parentheses or newline; a link title
  (``"..."``) is dropped; images (``![alt](src)``) are treated the same way.
- Control characters are Unicode categories Cc, Cf (zero-width, BOM, bidi marks, soft hyphen),
  Co and Cs; tab and every other Unicode space (NBSP, thin space, U+3000) become ``" "``;
  U+2028/U+2029/NEL/VT/FF are line breaks.
- "CJK" means Han and Japanese kana (Hangul is written with spaces and is left alone).
  "Latin-letter token" means a run of ASCII digits and Latin letters with at least one letter
  (``npm``, ``v2``, ``3D``, ``5G``) or a protected token; so ``5G网络`` -> ``5G 网络``.
- The space before ``.`` is kept when the dot starts a token (``x .5``, ``open .env``): removing
  it would glue them into a new file-like token.
- Collapsed runs use the full-width marks the rules name, in English too (``Wow!! Really?``
  -> ``Wow！Really?``): they are CJK punctuation then, so no space follows them.
- Arrows: ``<=`` and ``>=`` are comparisons, not arrows; ``<==`` and ``==>`` are arrows.
  ``↑``/``↓`` (up/down, "rises/falls") are not flow arrows and stay.
- Dashes: runs of two or more of ``-—–―`` (so ``——``, ``--``, ``---``); a single em dash stays.
- A single ``…`` is an ellipsis too and becomes ``。`` like ``...`` and ``……``.
- Structural brackets at a sentence start (text start or after ``。！？!?；;.``) become a
  sentence: ``【公告】今天`` -> ``公告。今天``; no ``。`` is added when punctuation or the end of
  the text follows. Elsewhere (``他说「你好」``) they are quotation marks and stay; an empty
  ``【 】`` stays too.
- ``《title》`` is stand-alone when it starts a sentence and is followed by the end of the text,
  a sentence mark or a comma; it is then unwrapped. Otherwise it is kept.
- After ``。！？!?`` a ``，`` (left by an arrow or a bar) is dropped, and ``，,`` before them too.
- Beyond the rules: a ``|`` is a pause like an arrow, so a table row ``| a | b |`` reads ``a，b``.
  ``x <- 5`` (R assignment) reads ``x，5``; the arrow reading wins, as the rules list ``<-``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

__all__ = ["has_something_to_say", "normalize_text"]

# --- character classes --------------------------------------------------------------------------

# Scripts written without spaces between words: Han (incl. extension A, compatibility, planes 2-3)
# and Japanese kana.
_CJK = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
# Latin letters: ASCII plus Latin-1 and Latin Extended-A/B (without × and ÷).
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
# CJK punctuation: no space belongs on either side of these.
_CJK_PUNCT = "，。！？；：、（）【】《》〈〉「」『』〖〗〔〕"

# Placeholders: one private-use character per protected span. Tokens (URLs, file names...) live in
# plane 15 and count as Latin tokens for spacing; bracket spans live in plane 16 and do not.
_TOKEN_BASE = 0xF0000
_BRACKET_BASE = 0x100000
_MAX_SPANS = 0xFFFE  # in all; a robot's utterance never comes near it (later spans stay unmasked)
_TOKEN_PH = "\U000f0000-\U000ffffd"
_PLACEHOLDER_RE = re.compile("[\U000f0000-\U000ffffd\U00100000-\U0010fffd]")

# Upper bound on pipeline passes (see normalize_text); symbol-soup fuzzing never needed more than 2.
_MAX_PASSES = 6

# --- _clean_characters ---------------------------------------------------------------------------

_LINE_BREAK_RE = re.compile("\r\n|[\r\x0b\x0c\x85\u2028\u2029]")
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})

# --- _flatten_markdown ---------------------------------------------------------------------------

# [text](target) and ![alt](src); an optional "title" after the target is dropped.
_LINK_RE = re.compile(r'!?\[([^\[\]\n]*)\]\(\s*([^()\n]*?)(?:\s+"[^"\n]*")?\s*\)')
_CODE_FENCE_RE = re.compile(r"^(?:`{3,}|~{3,})")
# Horizontal rules, setext underlines and table separator rows: nothing to say.
_RULE_LINE_RE = re.compile(r"^[-*_=|:+\s]+$")
# Emphasis/code marks with no speakable meaning. Single * and _ are left alone (2*3, __init__).
# Backticks go first: removing them can bring two stars together ("*`*").
_BACKTICK_RE = re.compile(r"`+")
_BOLD_RE = re.compile(r"\*{2,}")
_ARROW = r"<?-+>|<?=+>|<-+|<={2,}|[←→↔⇐⇒⇔⟵⟶⟷⟸⟹⟺↦⟼➔➜➝➞➟➠➡⬅]"
_DASH_RUN = r"[-—–―]{2,}"
_ELLIPSIS = r"\.(?: *\.){2,}|…(?: *…)*"  # spaced too: later steps remove the spaces
# A run of line-start markers: "> - 1. x" loses all three in one match.
_LINE_MARKERS_RE = re.compile(
    r"^(?:"
    r"#{1,6}(?:\s+|$)"  # heading
    r"|>(?!=)\s*"  # block quote (not ">=")
    r"|[-*+•](?:\s+|$)(?:\[[ xX]\](?:\s+|$))?"  # bullet, with an optional task box
    r"|\d{1,3}[.)](?:\s+|$)"  # numbered item
    r"|\|\s*"  # table row (its inner bars become pauses with the arrows)
    rf"|(?:{_ARROW}|{_DASH_RUN}|{_ELLIPSIS}|[。，、；,;])\s*"  # would leave a leading pause
    r")+"
)
_HEADING_RE = re.compile(r"#{1,6}(?:\s|$)")
_HEADING_CLOSE_RE = re.compile(r"\s+#+$")
_TRAILING_BAR_RE = re.compile(r"\s*\|+$")
_TRAILING_CLOSERS = "\"')]}）】》〉」』”’"
_CJK_PAUSES = "。！？；：，、…"
_ASCII_PAUSES = ".!?;:,"

# --- _mask_brackets / _mask_tokens -----------------------------------------------------------------

_BRACKET_RE = re.compile(r"\[[^\[\]\n]*\]|\{[^{}\n]*\}")
# Ends before CJK text or punctuation ("见https://x.y/z文件") and before trailing ASCII punctuation
# ("see https://x.y/z.").
_URL_RE = re.compile(
    rf"(?<![A-Za-z0-9_])(?:https?|ftp)://[^\s<>\"'{_CJK}{_CJK_PUNCT}\U000f0000-\U0010fffd]+"
    r"(?<![.,;:!?)\]'\"])"
)
_EMAIL_RE = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
    r"(?![A-Za-z0-9_]|-[A-Za-z0-9])"  # may be followed by a dash run: "a@b.com--"
)
_MENTION_RE = re.compile(r"(?<![A-Za-z0-9_.])@[A-Za-z0-9_]{1,32}")
_REDDIT_RE = re.compile(r"(?<![A-Za-z0-9_/])[ru]/[A-Za-z0-9_]+")
# \w is Unicode here, so "#张雪峰" is a hashtag; "&#39;" (HTML entity) and "C# " are not.
_HASHTAG_RE = re.compile(r"(?<![A-Za-z0-9_&])#\w[\w-]*")
# .env, .gitignore, .map (must contain a letter, so ".5" stays a number).
_DOT_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9_.])\.[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*(?![A-Za-z0-9_])")
# app.js.map, v2.3.1, 3.0.0-rc.1, fabric-api-0.91.3+1.20.2.jar, foo/bar.py: alphanumeric runs
# joined by single separators. "foo--bar" is not one (the dash run is a pause).
_FILE_LIKE_RE = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z0-9_]+(?:[._+:/-][A-Za-z0-9_]+)+(?![A-Za-z0-9_])")
_HAS_LETTER_RE = re.compile(r"[A-Za-z]")

# --- _replace_separators / _replace_dashes --------------------------------------------------------

_SEPARATOR_RE = re.compile(rf"\s*(?:{_ARROW}|\|)\s*")
_DASH_RE = re.compile(rf"\s*{_DASH_RUN}\s*")

# --- _unwrap_brackets ------------------------------------------------------------------------------

_SENTENCE_LEAD = r"(?P<lead>^|[。！？!?；;.])\s*"
_STRUCTURAL = r"【[^【】]*】|〖[^〖〗]*〗|『[^『』]*』|「[^「」]*」"
# A whole chain at once ("『a』「b」【c】"), so a long chain costs one pass, not one per bracket.
_STRUCTURAL_CHAIN_RE = re.compile(_SENTENCE_LEAD + rf"(?P<chain>(?:(?:{_STRUCTURAL})\s*)+)")
_STRUCTURAL_ITEM_RE = re.compile(_STRUCTURAL)
_STANDALONE_TITLE_RE = re.compile(_SENTENCE_LEAD + r"《(?P<title>[^《》]+)》(?=\s*(?:$|[。！？!?；;.，,]))")
_SENTENCE_MARKS = "。！？!?；;.，,：:、"

# --- _collapse_punctuation ------------------------------------------------------------------------

_ELLIPSIS_RE = re.compile(_ELLIPSIS)
# Runs may contain spaces: _normalize_spaces removes them afterwards, and a run it would
# create must already be collapsed here, or a second pass would change the text.
_FULL_STOP_RUN_RE = re.compile(r"[。．](?: *[。．])+")
_COMMA_RUN_RE = re.compile(r"[，,](?: *[，,])+")
_BANG_QUESTION_RUN_RE = re.compile(r"[!?！？](?: *[!?！？])+")
# A comma touching a stop adds nothing (an arrow or bar next to a line end leaves one).
_COMMA_AFTER_STOP_RE = re.compile(r"(?<=[。！？!?]) *，+")
_COMMA_BEFORE_STOP_RE = re.compile(r"[，,]+ *(?=[。！？!?])")

# --- _normalize_spaces ----------------------------------------------------------------------------

_SPACE_RUN_RE = re.compile(r" {2,}")
_SPACE_BETWEEN_CJK_RE = re.compile(rf"(?<=[{_CJK}]) +(?=[{_CJK}])")
_SPACE_CJK_DIGIT_RE = re.compile(rf"(?<=[{_CJK}]) +(?=[0-9])|(?<=[0-9]) +(?=[{_CJK}])")
# CJK followed by a Latin-letter token (possibly digit-led: "3D") or a protected token.
_CJK_THEN_LATIN_RE = re.compile(rf"(?<=[{_CJK}]) ?(?=[0-9]*[{_LATIN}]|[{_TOKEN_PH}])")
# A Latin-letter token (possibly digit-trailed: "v2") or a protected token followed by CJK.
_LATIN_THEN_CJK_RE = re.compile(rf"([{_LATIN}{_TOKEN_PH}][0-9]*) ?(?=[{_CJK}])")
_SPACE_AROUND_CJK_PUNCT_RE = re.compile(rf" *([{_CJK_PUNCT}]) *")
# Not before a "." that starts a token (".5", ".env"): removing the space would glue "x .5" into
# the file-like token "x.5".
_SPACE_BEFORE_ASCII_PUNCT_RE = re.compile(rf" +(?=[,;!?]|\.(?![A-Za-z0-9_{_TOKEN_PH}]))")


def normalize_text(text: str) -> str:
    """Return ``text`` cleaned for speech; ``""`` when nothing speakable is left.

    Never raises on any ``str``; the caller decides what an empty result means.
    """
    # Re-apply until the output is a verified fixed point (see the module docstring); ordinary
    # text needs one pass plus one check.
    result = _normalize_once(text)
    for _ in range(_MAX_PASSES - 1):
        again = _normalize_once(result)
        if again == result:
            break
        result = again
    return result


def has_something_to_say(text: str) -> bool:
    """Whether ``text`` (as ``normalize_text`` left it) holds a letter or a digit of any script: Unicode
    categories L and N. Emoji, symbols, punctuation, marks and spaces alone are nothing to say; a bracket
    tag (``[laugh]``), kept verbatim, has letters."""
    return any(unicodedata.category(char)[0] in "LN" for char in text)


def _normalize_once(text: str) -> str:
    """One pass of the pipeline described in the module docstring."""
    text = _clean_characters(text)
    text = _flatten_markdown(text)
    spans: list[str] = []
    text = _mask_brackets(text, spans)
    text = _replace_separators(text)
    text = _mask_tokens(text, spans)
    text = _replace_dashes(text)
    text = _collapse_punctuation(text)  # first, so "……【注意】" sees the "。" it starts after
    text = _unwrap_brackets(text)
    text = _collapse_punctuation(text)  # unwrapping can join two marks: "【好!】!"
    text = _normalize_spaces(text)
    return _restore_spans(text, spans)


# --- steps -----------------------------------------------------------------------------------------


def _clean_characters(text: str) -> str:
    """Unify line breaks, turn every kind of space into " ", drop invisible characters."""
    text = _LINE_BREAK_RE.sub("\n", text)
    out: list[str] = []
    for char in text:
        if char == "\n":
            out.append(char)
            continue
        category = unicodedata.category(char)
        if char == "\t" or category == "Zs":  # U+3000, NBSP, thin space...
            out.append(" ")
        elif category not in _DROPPED_CATEGORIES:  # zero-width, BOM, controls, private use
            out.append(char)
    return "".join(out)


def _flatten_markdown(text: str) -> str:
    """Markdown to plain speech text, one sentence run: the result has no newline."""
    text = _LINK_RE.sub(_link_to_text, text)
    lines: list[str] = []
    for raw in text.split("\n"):
        line = raw.strip()
        if _CODE_FENCE_RE.match(line):
            continue
        line = _strip_line_markers(_BOLD_RE.sub("", _BACKTICK_RE.sub("", line)))
        # Checked after the markers went: "- ---" or "> ***" are rules too.
        if line and not _RULE_LINE_RE.match(line):
            lines.append(line)
    joined = lines[0] if lines else ""
    for line in lines[1:]:
        joined += _line_separator(joined) + line
    return joined


def _link_to_text(match: re.Match[str]) -> str:
    label, target = match.group(1).strip(), match.group(2).strip()
    return f"{label} {target}".strip()


def _strip_line_markers(line: str) -> str:
    is_heading = _HEADING_RE.match(line) is not None
    while True:
        stripped = _TRAILING_BAR_RE.sub("", _LINE_MARKERS_RE.sub("", line)).strip()
        if stripped == line:
            break
        line = stripped
    if is_heading:  # "## Title ##": the closing hashes are decoration too
        line = _HEADING_CLOSE_RE.sub("", line)
    return line


def _line_separator(previous: str) -> str:
    """What goes between two joined lines: "。" unless the previous one already pauses."""
    last = previous.rstrip(_TRAILING_CLOSERS)[-1:]
    if last and last in _CJK_PAUSES:
        return ""
    if last and last in _ASCII_PAUSES:
        return " "
    return "。"


def _mask(
    pattern: re.Pattern[str], text: str, spans: list[str], base: int, accept: Callable[[str], bool] | None = None
) -> str:
    """Replace each match of ``pattern`` by a placeholder character; remember the original."""

    def to_placeholder(match: re.Match[str]) -> str:
        original = match.group(0)
        if (accept is not None and not accept(original)) or len(spans) >= _MAX_SPANS:
            return original
        spans.append(original)
        return chr(base + len(spans) - 1)

    return pattern.sub(to_placeholder, text)


def _mask_brackets(text: str, spans: list[str]) -> str:
    """Hide [...] and {...}: their contents (speaker tags, events, citations) stay verbatim."""
    return _mask(_BRACKET_RE, text, spans, _BRACKET_BASE)


def _replace_separators(text: str) -> str:
    """Flow arrows and table bars are a pause between items: "A -> B" reads "A，B"."""
    return _SEPARATOR_RE.sub("，", text)


def _mask_tokens(text: str, spans: list[str]) -> str:
    """Hide tokens whose dots, slashes and dashes are part of the word, not punctuation."""
    for pattern in (_URL_RE, _EMAIL_RE, _MENTION_RE, _REDDIT_RE, _HASHTAG_RE):
        text = _mask(pattern, text, spans, _TOKEN_BASE)
    # Dot and file-like tokens need a letter: "1.5" and "2024-05-01" are plain numbers.
    for pattern in (_DOT_TOKEN_RE, _FILE_LIKE_RE):
        text = _mask(pattern, text, spans, _TOKEN_BASE, accept=_HAS_LETTER_RE.search)
    return text


def _replace_dashes(text: str) -> str:
    """A dash run ("——", "--") separates two thoughts: make it a sentence boundary."""
    return _DASH_RE.sub("。", text)


def _unwrap_brackets(text: str) -> str:
    """【公告】今天 -> 公告。今天; a stand-alone 《title》 loses its marks; embedded ones stay."""
    while True:  # again only for nesting: "【「a」】" -> "「a」" -> "a"
        unwrapped = _STRUCTURAL_CHAIN_RE.sub(_chain_to_sentences, text)
        if unwrapped == text:
            break
        text = unwrapped
    return _STANDALONE_TITLE_RE.sub(r"\g<lead>\g<title>", text)


def _chain_to_sentences(match: re.Match[str]) -> str:
    """Each bracket of the chain becomes a sentence: "【a】「b」x" -> "a。b。x"."""
    pieces: list[str] = []
    for item in _STRUCTURAL_ITEM_RE.finditer(match.group("chain")):
        content = item.group(0)[1:-1].strip()
        if not content:  # "【 】": nothing to say, leave it
            pieces.append(item.group(0))
            continue
        pieces.append(content)
        if content[-1] not in _SENTENCE_MARKS:  # "「你好。」" has its stop already
            pieces.append("。")
    following = match.string[match.end() : match.end() + 1]
    if pieces[-1] == "。" and (not following or following in _SENTENCE_MARKS):
        pieces.pop()  # the end of the text, or a mark that is there already, needs no stop
    return match.group("lead") + "".join(pieces)


def _collapse_punctuation(text: str) -> str:
    """Runs of pause marks become one mark; an ellipsis is a full stop."""
    # Order matters: each step may only create what a later step handles.
    text = _ELLIPSIS_RE.sub("。", text)
    text = _COMMA_RUN_RE.sub("，", text)
    text = _COMMA_AFTER_STOP_RE.sub("", text)
    text = _COMMA_BEFORE_STOP_RE.sub("", text)  # "。，。" -> "。。": stop runs come after
    text = _FULL_STOP_RUN_RE.sub("。", text)
    return _BANG_QUESTION_RUN_RE.sub(_bang_question, text)


def _bang_question(match: re.Match[str]) -> str:
    run = match.group(0)
    has_question = "?" in run or "？" in run
    has_bang = "!" in run or "！" in run
    if has_question and has_bang:
        return "？！"
    return "？" if has_question else "！"


def _normalize_spaces(text: str) -> str:
    """Spaces by script: Latin keeps one, CJK none, one at a CJK/Latin border."""
    text = _SPACE_RUN_RE.sub(" ", text)
    text = _SPACE_BETWEEN_CJK_RE.sub("", text)
    text = _SPACE_CJK_DIGIT_RE.sub("", text)
    text = _CJK_THEN_LATIN_RE.sub(" ", text)
    text = _LATIN_THEN_CJK_RE.sub(r"\1 ", text)
    text = _SPACE_AROUND_CJK_PUNCT_RE.sub(r"\1", text)
    text = _SPACE_BEFORE_ASCII_PUNCT_RE.sub("", text)
    return text.strip()


def _restore_spans(text: str, spans: list[str]) -> str:
    def original(match: re.Match[str]) -> str:
        code = ord(match.group(0))
        return spans[code - (_BRACKET_BASE if code >= _BRACKET_BASE else _TOKEN_BASE)]

    return _PLACEHOLDER_RE.sub(original, text)
