"""The languages MOSS-TTS-v1.5 speaks: 31 codes and their English names, as upstream's model card lists them.

A request's language goes into the prompt's ``- Language:`` field, which upstream's processor prints as it is
given: a code (``fr``) or a name (``French``), both in upstream's own material (docs/model.md, "MOSS-TTS-v1.5").
``language_tag`` accepts either, in any letter case, and returns the spelling of upstream's table, so that
``FR`` and ``french`` reach the model as ``fr`` and ``French``; anything else is refused with the list.
"""

from __future__ import annotations

# Upstream's table, in its order; 1.0 was trained on the 20 that are not in ADDED_IN_V1_5.
LANGUAGES: dict[str, str] = {
    "zh": "Chinese",
    "yue": "Cantonese",
    "en": "English",
    "ar": "Arabic",
    "cs": "Czech",
    "da": "Danish",
    "nl": "Dutch",
    "fi": "Finnish",
    "fr": "French",
    "de": "German",
    "el": "Greek",
    "he": "Hebrew",
    "hi": "Hindi",
    "hu": "Hungarian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "mk": "Macedonian",
    "ms": "Malay",
    "fa": "Persian",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "es": "Spanish",
    "sw": "Swahili",
    "sv": "Swedish",
    "tl": "Tagalog",
    "th": "Thai",
    "tr": "Turkish",
    "vi": "Vietnamese",
}
# The languages v1.5's continued training added to 1.0's 20.
ADDED_IN_V1_5 = ("yue", "nl", "fi", "hi", "mk", "ms", "ro", "sw", "tl", "th", "vi")

_SPELLINGS = {spelling.casefold(): spelling for pair in LANGUAGES.items() for spelling in pair}
_CODES = {spelling.casefold(): code for code, name in LANGUAGES.items() for spelling in (code, name)}


def language_tag(value: str) -> str:
    """The spelling the prompt gets for ``value``, a code or an English name of ``LANGUAGES`` in any case;
    ValueError, saying what to give instead, for anything else."""
    spelling = _SPELLINGS.get(value.strip().casefold()) if isinstance(value, str) else None
    if spelling is None:
        raise ValueError(
            f"unknown language {value!r}: give one of the codes {', '.join(LANGUAGES)}, or its English name "
            '(e.g. French); docs/usage.md, "Languages", lists them'
        )
    return spelling


def language_code(value: str) -> str:
    """The code of ``value``, a code or an English name of ``LANGUAGES`` in any case, so that two spellings of one
    language compare equal ("French" and "fr"); ValueError as ``language_tag``."""
    language_tag(value)  # refuses what is not a language, with the message
    return _CODES[value.strip().casefold()]
