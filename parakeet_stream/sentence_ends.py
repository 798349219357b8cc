"""Whether English words so far can end a sentence: the chance, read off counts of how often written
sentences end after the same last words (Debian's `fortunes`, counted by demo_model/sentence_ends.py
into data/sentence_ends.json.gz).

The turn-taking (server/protocols/flux_turns.py, and openai_realtime.py's `semantic_vad`) asks it
whether a pause comes where a sentence cannot end ("at the end of", "send it to the"): there
a speaker is searching for the next word, so the turn waits longer for them. The chance backs off
from the last three words to the last two, the last one and no word at all, each step shrunk toward
the one before by SHRINK counts (32,000 sentences: a rare context says little). Words are lower case,
with the punctuation a model writes taken off; text ending in '.', '?' or '!' is a sentence's end.
"""
from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "sentence_ends.json.gz"
UNFINISHED = 0.005  # words after which fewer sentences than this end cannot end one (a speaker goes on)
SHRINK = 2.0  # pseudo-counts toward the shorter context's chance
ORDER = 3  # words of context, at most
START = "<s>"  # before a sentence's first word
TAIL = 200  # characters of a text read: enough for its last ORDER words, whatever its length
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


@functools.cache
def _table() -> tuple[float, dict[str, tuple[int, int]]]:
    data = json.loads(gzip.decompress(TABLE.read_bytes()))
    return data["base"], {context: (ends, total) for context, (ends, total) in data["contexts"].items()}


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def end_chance(text: str) -> float:
    """The chance that a sentence ends after `text` (1.0 where it ends in '.', '?' or '!')."""
    if text.rstrip().endswith((".", "?", "!")):
        return 1.0
    base, contexts = _table()
    padded = [START] * (ORDER - 1) + words_of(text[-TAIL:])
    chance = base
    for n in range(1, ORDER + 1):
        ends, total = contexts.get(" ".join(padded[-n:]), (0, 0))
        if not total:
            break
        chance = (ends + SHRINK * chance) / (total + SHRINK)
    return chance


def unfinished(text: str) -> bool:
    """Whether a speaker who stopped after `text` is most likely looking for the next word."""
    return end_chance(text) < UNFINISHED
