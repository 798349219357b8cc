"""Words with times, made from a segment's results; called by the protocols that send words
(native, Deepgram) and by file transcripts (protocols/files/transcript.py).

A token whose piece starts with '\u2581' starts a word, and so does every piece in a script
written without spaces (Chinese, Japanese, Thai: text.py). A word is complete when the next one
starts, at an end of utterance (<EOU>), or when the caller closes it (at the final result). It
runs from its first token's frame to the end of its last token's frame, cut at the next word's
start and at a limit: the audio known so far.

Confidence (NeMo's aggregation of token confidences): a token's is the probability the joint gave
its label (model/greedy.py); a word's is the lowest of its tokens' (NeMo's default `min`: one unsure
piece makes the word unsure, whatever its length); a transcript's (an alternative, an utterance) is
the mean of its words' (`mean`: `min` would make every long transcript look as unsure as its worst
word, `prod` would fall with length alone).
"""
from __future__ import annotations

import functools
from operator import itemgetter
from typing import TYPE_CHECKING

from ...text import unspaced

if TYPE_CHECKING:
    from ...engine import EngineInfo, StreamResult
    from ...model.tokenizer import Tokenizer

WORD_START = "\u2581"  # sentencepiece's word-boundary mark

TimedToken = tuple[int, float, float]  # (token id, seconds of its frame, confidence)


class Pieces:
    """What the word rules need to know of each token id, read once per tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        ids = range(tokenizer.vocab_size)
        self.text = frozenset(ids) - tokenizer.special_ids  # not <EOU>, <EOB>, ..., nor the blank
        self.word_starts = frozenset(i for i in ids if _starts_word(tokenizer.piece(i)))
        self.eou_id = tokenizer.eou_id
        self.decode = tokenizer.decode


def _starts_word(piece: str) -> bool:
    return piece.startswith(WORD_START) or (piece != "" and unspaced(piece[0]))


@functools.lru_cache(maxsize=8)
def pieces(tokenizer: Tokenizer) -> Pieces:
    return Pieces(tokenizer)


def first_text_time(tokenizer: Tokenizer, result: StreamResult) -> float | None:
    """Stream seconds of the result's first text token, None if it has none."""
    text = pieces(tokenizer).text
    return next((seconds for token, seconds in zip(result.token_ids, result.token_times) if token in text), None)


def last_text_time(tokenizer: Tokenizer, result: StreamResult) -> float | None:
    """Stream seconds of the result's last text token, None if it has none."""
    text = pieces(tokenizer).text
    return next((seconds for token, seconds in zip(reversed(result.token_ids), reversed(result.token_times))
                 if token in text), None)


def timed_tokens(result: StreamResult, offset: float = 0.0) -> list[TimedToken]:
    """Every token of the result as (id, seconds + offset, confidence)."""
    return [(token, seconds + offset, p)
            for token, seconds, p in zip(result.token_ids, result.token_times, result.token_confidences)]


def transcript_confidence(words: list[dict]) -> float:
    """The confidence of a transcript made of these words (0.0 without words)."""
    return round(sum(w["confidence"] for w in words) / len(words), 3) if words else 0.0


class WordTracker:
    """Completes words across the results of a connection's segments, on the caller's clock
    (each segment's token times shifted by its offset)."""

    def __init__(self, info: EngineInfo) -> None:
        self._pieces = pieces(info.tokenizer)
        self._frame = info.frame_seconds  # one encoder frame: a token's span
        self._open: list[TimedToken] = []  # the word not complete yet

    def update(self, result: StreamResult, limit: float, close: bool = False, offset: float = 0.0) -> list[dict]:
        """The words `result` completes, as {word, start, end, confidence}; `close`: complete the last one too."""
        pieces, tokens, closed = self._pieces, self._open, False
        for timed in timed_tokens(result, offset):
            if timed[0] == pieces.eou_id:
                closed = True
            elif timed[0] in pieces.text:
                tokens.append(timed)
                closed = False
        groups = _group(pieces, tokens)
        self._open = [] if closed or close or not groups else groups.pop()
        return _timed(pieces, self._frame, groups, self._open[0][1] if self._open else limit)

    def open_word(self, limit: float) -> list[dict]:
        """The word not complete yet (none or one), cut at `limit`."""
        return _timed(self._pieces, self._frame, [self._open], limit) if self._open else []


def timed_words(info: EngineInfo, tokens: list[TimedToken], limit: float) -> list[dict]:
    """The words of text tokens (e.g. one utterance's), all complete, the last one cut at `limit`."""
    return time_groups(info, group_words(info.tokenizer, tokens), limit)


def group_words(tokenizer: Tokenizer, tokens: list[TimedToken]) -> list[list[TimedToken]]:
    """Text tokens split into words (a group per word)."""
    return _group(pieces(tokenizer), tokens)


def time_groups(info: EngineInfo, groups: list[list[TimedToken]], limit: float) -> list[dict]:
    """{word, start, end, confidence} per group (see the module docstring); a group with no text gives none."""
    return _timed(pieces(info.tokenizer), info.frame_seconds, groups, limit)


def _group(pieces: Pieces, tokens: list[TimedToken]) -> list[list[TimedToken]]:
    groups: list[list[TimedToken]] = []
    for timed in tokens:
        if not groups or timed[0] in pieces.word_starts:
            groups.append([])
        groups[-1].append(timed)
    return groups


def _timed(pieces: Pieces, frame: float, groups: list[list[TimedToken]], limit: float) -> list[dict]:
    """{word, start, end, confidence} per group: `limit` also stands for the start of the word after the last."""
    words = []
    for i, group in enumerate(groups):
        start = min(group[0][1], limit)
        cut = groups[i + 1][0][1] if i + 1 < len(groups) else limit
        end = max(start, min(group[-1][1] + frame, cut, limit))
        if word := pieces.decode(list(map(itemgetter(0), group))).strip():
            words.append({"word": word, "start": round(start, 3), "end": round(end, 3),
                          "confidence": word_confidence(group)})
    return words


def word_confidence(tokens: list[TimedToken]) -> float:
    """The lowest confidence of the word's tokens (see the module docstring)."""
    # to 3 decimals, never 0: the best of V labels has a probability of at least 1/V
    return max(round(min(p for _, _, p in tokens), 3), 0.001)
