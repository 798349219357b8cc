"""Key phrases a stream asks to have boosted (names, products, jargon): the one validated form
every API maps its own field to (native `phrases`, Deepgram `keyterm`/`keywords`, Riva
`speech_contexts`, OpenAI `prompt`, `parakeet-transcribe --phrases`), and its limits.

A phrase's `weight` scales the decoder's default bonus: 1.0 is the default boost, 2.0 twice it.
The engine tokenizes phrases with the model's tokenizer when the stream is created and refuses a
phrase longer than MAX_PHRASE_TOKENS tokens there (the count depends on the model)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Iterable

from .errors import EngineError

MAX_PHRASES = 100  # per stream
MAX_PHRASE_CHARS = 100
MAX_PHRASE_TOKENS = 32
DEFAULT_WEIGHT = 1.0
MAX_WEIGHT = 10.0


@dataclass(frozen=True)
class Phrase:
    text: str
    weight: float = DEFAULT_WEIGHT


class PhraseError(EngineError):
    def __init__(self, message: str):
        super().__init__("invalid_phrases", message)


def check_phrases(items: Iterable[str | tuple[str, float | None] | Phrase]) -> tuple[Phrase, ...]:
    """Phrases as a client gave them (text, or text and weight; weight None = default) -> the
    validated tuple, duplicates merged (the larger weight wins); PhraseError names the first
    limit broken. An empty input is no phrases."""
    merged: dict[str, float] = {}
    for item in items:
        phrase = _one(item)
        merged[phrase.text] = max(phrase.weight, merged.get(phrase.text, 0.0))
        if len(merged) > MAX_PHRASES:
            raise PhraseError(f"at most {MAX_PHRASES} phrases per stream")
    return tuple(Phrase(text, weight) for text, weight in merged.items())


def _one(item) -> Phrase:
    if isinstance(item, Phrase):
        text, weight = item.text, item.weight
    elif isinstance(item, tuple) and len(item) == 2:
        text, weight = item
    else:
        text, weight = item, None
    if not isinstance(text, str):
        raise PhraseError("a phrase must be a string")
    text = " ".join(text.split())
    if not text:
        raise PhraseError("a phrase must not be empty")
    if len(text) > MAX_PHRASE_CHARS:
        raise PhraseError(f"a phrase must be at most {MAX_PHRASE_CHARS} characters")
    if any(unicodedata.category(ch).startswith("C") for ch in text):
        raise PhraseError("a phrase must not contain control or invisible characters")
    if weight is None:
        weight = DEFAULT_WEIGHT
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
        raise PhraseError(f"a phrase weight must be a number above 0 and at most {MAX_WEIGHT:g}")
    return Phrase(text, float(weight))
