"""When a speaker's turn starts and ends, from the model's words and its end-of-utterance
probability: the decisions behind Deepgram Flux's `TurnInfo` events (flux.py sends them).

A turn starts at its first word. Its end-of-turn confidence is the highest `<EOU>` probability the
model gave since the turn's last word; once the model wrote `<EOU>`, the silence after it firms that
up, closing the rest of the way to 1 over FIRMING seconds of audio (so a decision written with 0.52
does not wait for the timeout, and words before FIRMING passed take it back). On a model without
`<EOU>` the probability is the engine's trailing silence as a share of its endpoint silence.
The turn ends once the confidence reaches `eot_threshold` (trigger `model`) or `eot_timeout_ms` of
audio passed since its last word (`timeout`); `end` ends it on the client's word (`manual`).

Where the words so far cannot end a sentence ("at the end of", "send it to the": fewer than
one written sentence in 200 ends there, sentence_ends.py), the speaker is looking for the next word,
not done: the confidence is scaled by the silence since the last word over HOLD seconds, so a turn
left hanging still ends (at a confidence of 1, after 0.7 x HOLD of silence at the default threshold),
and a hesitation there does not end it, whatever the model says of the pause.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...sentence_ends import unfinished

FIRMING = 0.5  # seconds of silence after the model's <EOU> that take its confidence to 1
HOLD = 2.0  # seconds of silence after an unfinished turn's last word that take its confidence to full


@dataclass
class Thresholds:
    eot_threshold: float = 0.7
    eager_eot_threshold: float | None = None  # None: no EagerEndOfTurn
    eot_timeout_ms: int = 5000


@dataclass(frozen=True)
class Event:
    name: str  # StartOfTurn, Update, EagerEndOfTurn, TurnResumed, EndOfTurn
    index: int  # the turn's
    start: float  # where the turn's audio window starts (connection seconds)
    confidence: float
    trigger: str | None = None  # EndOfTurn's: model, timeout, manual


@dataclass
class Turn:
    index: int = 0
    start: float = 0.0
    started: bool = False  # its first word came
    eager: bool = False  # EagerEndOfTurn was sent and no word came since
    seen: float = 0.0  # the highest <EOU> probability since the last word
    written: tuple[float, float] | None = None  # the model's <EOU> since the last word: (when, its probability)
    last_word: float = 0.0
    unfinished: bool = False  # its words so far cannot end a sentence


class TurnTaking:
    def __init__(self, thresholds: Thresholds) -> None:
        self.thresholds = thresholds
        self.turn = Turn()

    def follow(self, last_word: float | None, p: float, written: float | None, now: float,
               text: str = "") -> list[Event]:
        """One stretch of results up to `now` (connection seconds): `last_word` its last word's time
        (None: no word), `p` the <EOU> probability at its end, `written` when the model wrote the
        <EOU> that ends it (None: none), `text` the turn's words up to it. The events it causes, in order."""
        turn, thresholds, events = self.turn, self.thresholds, []
        if last_word is not None:
            name = "Update" if turn.started and not turn.eager else "TurnResumed" if turn.started else "StartOfTurn"
            turn.started, turn.eager, turn.seen, turn.written, turn.last_word = True, False, p, None, last_word
            turn.unfinished = unfinished(text)
            events.append(name)
        turn.seen = max(turn.seen, p)
        if written is not None:
            turn.written = (written, p)
        if not turn.started:
            return []
        confidence = self.confidence(now)
        ends = confidence >= thresholds.eot_threshold
        timeout = not ends and now - turn.last_word >= thresholds.eot_timeout_ms / 1000
        eager = thresholds.eager_eot_threshold
        if eager is not None and not turn.eager and confidence >= eager:  # also right before the end it crossed with
            turn.eager = True
            events.append("EagerEndOfTurn")
        if ends or timeout or len(events) > 1:  # an Update only where nothing else says more
            events = [name for name in events if name != "Update"]
        elif not events:
            events.append("Update")
        found = [Event(name, turn.index, turn.start, confidence) for name in events]
        if ends or timeout:
            found += self.end(now, "model" if ends else "timeout")
        return found

    def end(self, now: float, trigger: str) -> list[Event]:
        """End the turn in progress, if one started: its EndOfTurn; the next turn's window starts at `now`."""
        turn = self.turn
        if not turn.started:
            return []
        self.turn = Turn(index=turn.index + 1, start=now)
        return [Event("EndOfTurn", turn.index, turn.start, self._confidence(turn, now), trigger)]

    def confidence(self, now: float) -> float:
        return self._confidence(self.turn, now)

    @staticmethod
    def _confidence(turn: Turn, now: float) -> float:
        confidence = turn.seen
        if turn.written is not None:
            at, p = turn.written
            confidence = max(confidence, p + (1 - p) * min(1.0, max(0.0, now - at) / FIRMING))
        if turn.unfinished:
            confidence *= min(1.0, max(0.0, now - turn.last_word) / HOLD)
        return confidence
