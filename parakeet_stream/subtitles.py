"""Subtitles from timed words: cues, and their SubRip (.srt) and WebVTT (.vtt) text.

A cue never spans two utterances; inside one it holds at most MAX_LINES lines of at most
`max_line_chars` columns (Netflix's guideline: 42 characters, 2 lines; a wide CJK character takes
two columns, so 21 of them), filled word by word; words join as the text writes them (no space
between two words of Chinese or Japanese: text.py).
A cue runs from its first word's start to its last word's end. Words with a `speaker` (a diarized
transcript) give cues of one speaker each, named A, B, ... in the order they first speak: WebVTT
writes it as the cue's voice (`<v A>`), SubRip before its first line (`[A] `).
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
    speaker: str | None = None


def cues(utterances: Iterable[list[dict]], max_line_chars: int = MAX_LINE_CHARS) -> list[Cue]:
    """Cues for utterances given as lists of words ({"word", "start", "end"}, in order)."""
    out: list[Cue] = []
    name = SpeakerNames()
    for words in utterances:
        for turn in speaker_turns(words):
            speaker = turn[0].get("speaker")
            for group in _cue_groups(turn, max_line_chars):
                lines = tuple(join_words(w["word"] for w in line) for line in group)
                start, end = group[0][0]["start"], group[-1][-1]["end"]
                out.append(Cue(start, max(start, end), lines, None if speaker is None else name(speaker)))
    return out


def speaker_turns(words: list[dict]) -> list[list[dict]]:
    """The words in runs of one speaker each (one run where they have none)."""
    turns: list[list[dict]] = []
    for word in words:
        if not turns or word.get("speaker") != turns[-1][-1].get("speaker"):
            turns.append([])
        turns[-1].append(word)
    return turns


class SpeakerNames:
    """Speakers' names in the order they first speak: the first one named A, the next B, ..."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def __call__(self, speaker: int) -> str:
        return self._names.setdefault(speaker, speaker_name(len(self._names)))


def speaker_name(k: int) -> str:
    """The k-th speaker's name as OpenAI's diarized transcripts write it: A, B, ..., Z, AA, AB, ..."""
    return speaker_name(k // 26 - 1) + chr(65 + k % 26) if k >= 26 else chr(65 + k)


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
    blocks = [f"{i}\n{_time(c.start, ',')} --> {_time(c.end, ',')}\n" + "\n".join(_named(c.lines, c.speaker, "[{}] "))
              for i, c in enumerate(items, 1)]
    return "".join(block + "\n\n" for block in blocks)


def vtt(items: list[Cue]) -> str:
    blocks = [f"{_time(c.start, '.')} --> {_time(c.end, '.')}\n" +
              "\n".join(_named([_escape(line) for line in c.lines], c.speaker and _escape(c.speaker), "<v {}>"))
              for c in items]
    return "WEBVTT\n\n" + "".join(block + "\n\n" for block in blocks)


def _named(lines, speaker: str | None, form: str) -> list[str]:
    """The lines, the first preceded by the speaker's name in `form` where there is one."""
    lines = list(lines)
    if speaker is not None and lines:
        lines[0] = form.format(speaker) + lines[0]
    return lines


def _time(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def _escape(text: str) -> str:
    """WebVTT cue text: `&` and `<` start markup, and with `>` escaped no `-->` can appear."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
