"""Which script a character is written in, pure: what the gateway's chunker (where Japanese and
Chinese sentences end, how long they are to say) and the model server's G2P (which language
voices a text) both read."""

from __future__ import annotations

# a CJK character takes about as long to say as this many letters of English (a kana is a
# syllable): Japanese agent sentences spoke 0.156-0.169 s a character with jf_alpha and jm_kumo,
# English prose 0.065 s (docs/measured.md, 2026-12-07 early morning)
CJK_CHAR_WEIGHT = 2.5


def is_cjk(char: str) -> bool:
    """Whether `char` is written in Japanese or Chinese script: kana, CJK ideographs, CJK
    punctuation, the full-width and half-width forms."""
    code = ord(char)
    return (
        0x3000 <= code <= 0x30FF  # CJK punctuation, hiragana, katakana
        or 0x3400 <= code <= 0x4DBF  # ideographs, extension A
        or 0x4E00 <= code <= 0x9FFF  # ideographs
        or 0xF900 <= code <= 0xFAFF  # compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # full-width and half-width forms
    )
