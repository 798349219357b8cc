"""Key phrases as the APIs name them, turned into the engine's validated phrases
(engine/phrases.py): what OpenAI's `keywords` and `prompt` ask for, the rule that reads phrases
out of a prompt, and the refusal the streaming protocols send (docs/protocol.md, "Key phrases").
Each API words a refusal in its own shape; the code is `invalid_phrases` everywhere.

OpenAI documents its prompt as a hint whose words are boosted; what that means here:
- a prompt with control characters (other than tab, newline and carriage return) is refused;
  an empty prompt names nothing;
- it splits into pieces at newlines, commas and semicolons, and a label that ends a piece's first
  word(s) with a colon names nothing ("Names: Anya Okafor, Kubernetes" -> "Anya Okafor", "Kubernetes");
- a piece of one to LIST_ITEM_WORDS words is one phrase, as written ("kubectl", "Anya Okafor");
- in a longer piece (a sentence), each run of consecutive name-like words is one phrase: a word
  that starts with a capital letter, or has a digit or a capital after its first letter
  ("Kubernetes", "iPhone", "GPT-4o", "k8s"), and is not a COMMON word ("The", "Please");
- punctuation around a word is not part of it; phrases are taken in order, each once, as many
  as there is room for beside the explicit keywords (MAX_PHRASES in all);
- a phrase the model cannot write (a character it has no piece for, accents aside) is left out,
  where an explicit keyword would be refused.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import replace

from ...engine.phrases import MAX_PHRASES, Phrase, PhraseError, check_phrases
from ..transport.codes import ProtocolError

LIST_ITEM_WORDS = 4
PUNCTUATION = ".,;:!?\"'()[]{}<>«»“”‘’…*"
PIECES = re.compile(r"[\n\r,;]")
LABEL = re.compile(r"\A[^:]*:(?=\s|\Z)")  # "Names:" (not the colon of "10:30")
# words that start a sentence with a capital without naming anything
COMMON = frozenset(
    """a about after all also an and any are as at be because but by can could do does for from has have he her
    here his how i if in is it its just let me my no not now of on or our please she so some that the their them
    then there these they this those to transcribe transcript us was we were what when where which who why will
    with words would yes you your hello hi hey okay ok expect names terms speaker speakers""".split()
)


class FieldPhraseError(PhraseError):
    """A refusal that names the API's field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def refused(exc: PhraseError, what: str = "") -> ProtocolError:
    """The streaming protocols' refusal (`what`: the API's field, said first)."""
    return ProtocolError(exc.code, f"{what}: {exc.message}" if what else exc.message)


def openai_phrases(keywords: Iterable[str], prompt: str | None) -> tuple[Phrase, ...]:
    """OpenAI's `keywords` (each one phrase) then what its `prompt` names; raises
    FieldPhraseError naming "keywords" or "prompt"."""
    try:
        explicit = check_phrases(keywords)
    except PhraseError as exc:
        raise FieldPhraseError("keywords", exc.message) from None
    try:
        named = prompt_phrases(prompt or "")
    except PhraseError as exc:
        raise FieldPhraseError("prompt", exc.message) from None
    taken = {phrase.text for phrase in explicit}
    return (*explicit, *[phrase for phrase in named if phrase.text not in taken][: MAX_PHRASES - len(explicit)])


def prompt_phrases(prompt: str) -> tuple[Phrase, ...]:
    """The phrases a prompt names (the rule in the module's docstring), at most MAX_PHRASES."""
    if any(unicodedata.category(ch).startswith("C") and ch not in "\t\n\r" for ch in prompt):
        raise PhraseError("the prompt must not contain control or invisible characters")
    found: dict[str, None] = {}
    for piece in PIECES.split(prompt):
        words = [word for raw in LABEL.sub("", piece).split() if (word := raw.strip(PUNCTUATION))]
        for text in [" ".join(words)] if len(words) <= LIST_ITEM_WORDS else _names(words):
            if text and len(found) < MAX_PHRASES:
                found.setdefault(text)
    return tuple(replace(phrase, hint=True) for phrase in check_phrases(found))


def _names(words: list[str]) -> list[str]:
    """The runs of consecutive name-like words of a sentence."""
    runs, run = [], []
    for word in words:
        if _name_like(word):
            run.append(word)
        elif run:
            runs.append(" ".join(run))
            run = []
    return [*runs, " ".join(run)] if run else runs


def _name_like(word: str) -> bool:
    if word.lower() in COMMON:
        return False
    inner = any(ch.isdigit() or ch.isupper() for ch in word[1:]) and any(ch.isalpha() for ch in word)
    return word[0].isupper() or inner
