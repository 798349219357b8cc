"""Key phrases a stream asks to have boosted (names, products, jargon): the one validated form
every API maps its own field to (native `phrases`, Deepgram `keyterm`/`keywords`, Riva
`speech_contexts`, OpenAI `prompt`, `parakeet-transcribe --phrases`), and its limits.

A phrase's `weight` scales what a full match of it earns (1.0: the default; 2.0: twice that); below
1.0 it also lowers the pull of each of its tokens, which above 1.0 stays the default's (so a large
weight cannot drag a phrase in token by token against the audio). The engine tokenizes phrases with
the model's tokenizer when the stream is created and refuses a phrase longer than MAX_PHRASE_TOKENS
tokens there (the count depends on the model), then builds the stream's boosting tree once
(`boosting_tree`); the decoder's side is model/boosting.py and model/beam.py: a stream with phrases
is decoded by a beam search that scores them."""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterable

from ..model.boosting import BoostingTree, BoostLimits, PhrasePath
from ..model.tokenizer import Tokenizer
from .errors import EngineError

MAX_PHRASES = 100  # per stream
MAX_PHRASE_CHARS = 100
MAX_PHRASE_TOKENS = 32
DEFAULT_WEIGHT = 1.0
MAX_WEIGHT = 10.0
# Log-probability a phrase token earns at weight 1.0 (a phrase's first token: FIRST_SHARE of it,
# model/boosting.py), plus PRIOR_LOAN of what the model's own prior of the token without audio
# (GreedyDecoder.label_prior) takes from it. A phrase's labels need, for its reward, EVIDENCE per
# label plus PRIOR_SHARE of their prior: with 1.0, the audio must make them e**0.9 times likelier
# than the model expects of them unheard. A match the audio does not support earns nothing (and
# gives its loan back). All four picked on the tuning half of evaluations/phrase_eval.py's set
# (docs/performance.md, "Key phrases").
BONUS = 2.0
PRIOR_LOAN = 1.0
EVIDENCE = 0.9
PRIOR_SHARE = 1.0
BEAM = 4  # hypotheses per stream with phrases
SYMBOLS = 4  # labels per encoder frame at most, in the beam search
MAX_LAG_SECONDS = 1.0  # text is committed from the best hypothesis once it is this old (engine/runner/beams.py)
COMMIT_MARGIN = 3.0  # nats: a hypothesis further behind (with and without its loans) does not hold text back
# What the slot pool holds per stream: every phrase starting with its own token, every token its
# own node; deeper arcs (children and failure-arc shortcuts) up to twice the nodes, at most
# ARC_WIDTH from one node (a fixed-shape gather per label).
ARC_WIDTH = 128
LIMITS = BoostLimits(root_width=MAX_PHRASES, nodes=1 + MAX_PHRASES * MAX_PHRASE_TOKENS,
                     arcs=2 * MAX_PHRASES * MAX_PHRASE_TOKENS, arc_width=ARC_WIDTH)


@dataclass(frozen=True)
class Phrase:
    text: str
    weight: float = DEFAULT_WEIGHT
    hint: bool = False  # read out of a prompt: left out, not refused, where the model cannot write it


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


def boosting_tree(phrases: tuple[Phrase, ...], tokenizer: Tokenizer | None,
                  prior: Callable[[list[list[int]]], list] | None = None) -> BoostingTree | None:
    """The boosting tree of a stream's checked phrases, tokenized with the model's tokenizer (lower
    case for a model that writes none, accents dropped where the model writes the letters without
    them); None for no phrases. `prior`: the model's label prior (GreedyDecoder.label_prior; None:
    a tree only checked, never decoded with). PhraseError for a phrase past MAX_PHRASE_TOKENS or with
    characters the model cannot write (its tokenizer's unknown piece: boosting it would only push
    that piece), or phrases the slot pool cannot hold; a hint the model cannot take is left out
    instead."""
    if not phrases:
        return None
    if tokenizer is None:
        raise PhraseError("this model has no tokenizer to read phrases with")
    items = []
    for phrase in phrases:
        tokens = _tokens(phrase.text, tokenizer)
        if phrase.hint and (tokens is None or len(tokens) > MAX_PHRASE_TOKENS):
            continue
        if tokens is None:
            unwritable = sorted({ch for ch in phrase.text if _tokens(ch, tokenizer) is None})
            raise PhraseError(f"the phrase {phrase.text!r} has characters this model cannot write: "
                              f"{''.join(unwritable)!r}")
        if len(tokens) > MAX_PHRASE_TOKENS:
            raise PhraseError(f"the phrase {phrase.text!r} is {len(tokens)} tokens for this model: "
                              f"at most {MAX_PHRASE_TOKENS}")
        pull = min(phrase.weight, 1.0)
        items.append(PhrasePath(tokens, BONUS * pull, phrase.weight, pull=pull))
    if not items:
        return None
    if prior is not None:
        priors = prior([item.tokens for item in items])
        items = [replace(item, prior=tuple(p.tolist())) for item, p in zip(items, priors)]
    try:
        return BoostingTree(items, LIMITS, EVIDENCE, PRIOR_SHARE, PRIOR_LOAN)
    except ValueError as exc:
        raise PhraseError(str(exc)) from None


class LabelPriors:
    """The model's label prior (GreedyDecoder.label_prior) of phrases' token sequences, kept for the
    `size` most recent: the streams of one voice agent list the same phrases, and the prior of 100
    phrases costs a run of the prediction network (10 ms on a CPU) where the tree costs 1.6 ms.
    Callable as label_prior is; safe from several threads."""

    def __init__(self, label_prior: Callable[[list[list[int]]], list], size: int = 4096):
        self.label_prior, self.size = label_prior, size
        self._known: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, sequences: list[list[int]]) -> list:
        keys = [tuple(seq) for seq in sequences]
        with self._lock:
            found = {key: self._known[key] for key in keys if key in self._known}
            for key in found:
                self._known.move_to_end(key)
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        if missing:
            found.update(zip(missing, self.label_prior([list(key) for key in missing])))
            with self._lock:
                for key in missing:
                    self._known[key] = found[key]
                while len(self._known) > self.size:
                    self._known.popitem(last=False)
        return [found[key] for key in keys]


def as_written(phrase: Phrase, tokenizer: Tokenizer | None) -> str:
    """The phrase as the model will write it where it is heard ("Zoë Ünal" -> "zoe unal" for a
    lower-case model without accents): what the APIs echo. A phrase the model cannot write (a
    hint left out) is echoed as given."""
    tokens = _tokens(phrase.text, tokenizer) if tokenizer is not None else None
    return phrase.text if tokens is None else tokenizer.decode(tokens).strip()


def _tokens(text: str, tokenizer: Tokenizer) -> list[int] | None:
    """The tokens of `text` as the model writes it ("Zoë" -> "zoe" for an uncased model without
    "ë"); None where some character has no piece."""
    if _uncased(tokenizer):
        text = text.lower()
    tokens = tokenizer.encode(text)
    if tokenizer.unk_id in tokens:
        tokens = tokenizer.encode(_unaccented(text))
    return None if tokenizer.unk_id in tokens else tokens


def _unaccented(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))


@lru_cache(maxsize=8)
def _uncased(tokenizer: Tokenizer) -> bool:
    """The model writes no upper-case letter (none in its pieces, control and byte pieces aside)."""
    pieces = (tokenizer.piece(i) for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids)
    return not any(ch.isupper() for p in pieces if not re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", p) for ch in p)
