"""Subtitles from timed words: cues, and their SubRip (.srt) and WebVTT (.vtt) text.

A cue never spans two utterances; inside one it holds at most MAX_LINES lines of at most
`max_line_chars` columns (Netflix's guideline: 42 characters, 2 lines; a wide CJK character takes
two columns, so 21 of them), filled word by word; words join as the text writes them (no space
between two words of Chinese or Japanese: text.py).
A cue runs from its first word's start to its last word's end.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .text import join_words, unspaced, width

MAX_LINE_CHARS = 42
MAX_LINES = 2


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    lines: tuple[str, ...]


def cues(utterances: Iterable[list[dict]], max_line_chars: int = MAX_LINE_CHARS) -> list[Cue]:
    """Cues for utterances given as lists of words ({"word", "start", "end"}, in order)."""
    out: list[Cue] = []
    for words in utterances:
        for group in _cue_groups(words, max_line_chars):
            lines = tuple(join_words(w["word"] for w in line) for line in group)
            start, end = group[0][0]["start"], group[-1][-1]["end"]
            out.append(Cue(start, max(start, end), lines))
    return out


def _cue_groups(words: list[dict], max_line_chars: int) -> list[list[list[dict]]]:
    """Words -> cues -> lines: a word goes on the current line if it fits, else on a new line,
    else (MAX_LINES full) into a new cue. A word longer than a line gets a line of its own."""
    groups: list[list[list[dict]]] = []
    used = 0
    for word in words:
        size = width(word["word"])
        if groups:
            last = groups[-1][-1][-1]["word"]
            gap = 0 if last and word["word"] and unspaced(last[-1]) and unspaced(word["word"][0]) else 1
            if used + gap + size <= max_line_chars:
                groups[-1][-1].append(word)
                used += gap + size
                continue
        if groups and len(groups[-1]) < MAX_LINES:
            groups[-1].append([word])
        else:
            groups.append([[word]])
        used = size
    return groups


def srt(items: list[Cue]) -> str:
    blocks = [f"{i}\n{_time(c.start, ',')} --> {_time(c.end, ',')}\n" + "\n".join(c.lines) for i, c in enumerate(items, 1)]
    return "".join(block + "\n\n" for block in blocks)


def vtt(items: list[Cue]) -> str:
    blocks = [f"{_time(c.start, '.')} --> {_time(c.end, '.')}\n" + "\n".join(_escape(line) for line in c.lines)
              for c in items]
    return "WEBVTT\n\n" + "".join(block + "\n\n" for block in blocks)


def _time(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def _escape(text: str) -> str:
    """WebVTT cue text: `&` and `<` start markup, and with `>` escaped no `-->` can appear."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
