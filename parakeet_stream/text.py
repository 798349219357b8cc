"""Text in scripts written without spaces between words (Chinese, Japanese, Thai, ...): what a word
is there, how words join back into text, and how wide they show.

A multilingual model's pieces in these scripts carry no word-boundary mark, so there every piece is
its own word (the finest unit with a time of its own, as Deepgram's and Riva's word lists split
such text into short units), and words join without a space where both sides are in such a
script. Wide (East Asian) characters count two columns on a subtitle line.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

# Unicode blocks of scripts written without spaces between words
UNSPACED = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x2E80, 0x2FDF), (0x3000, 0x303F),
            (0x3040, 0x30FF), (0x3100, 0x312F), (0x31A0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
            (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))


def unspaced(ch: str) -> bool:
    """Whether `ch` belongs to a script written without spaces (Thai, Lao, Myanmar, Khmer, CJK, kana)."""
    code = ord(ch)
    return any(low <= code <= high for low, high in UNSPACED)


def join_words(words: Iterable[str]) -> str:
    """Words as text: a space between two words, none where both sides are unspaced script."""
    out = ""
    for word in words:
        if out and word and not (unspaced(out[-1]) and unspaced(word[0])):
            out += " "
        out += word
    return out


def width(text: str) -> int:
    """Columns `text` takes on a line: two for a wide or full-width character, one otherwise."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
