"""The decisions behind Deepgram Flux's turn events (server/protocols/flux_turns.py), stretch by
stretch: when a turn starts, when the model's <EOU> probability, firmed by the silence after it,
ends it, eager ends and resumptions, the timeout and the client's own end, and the hold where the
words so far cannot end a sentence."""
from __future__ import annotations

import pytest

from parakeet_stream.sentence_ends import unfinished
from parakeet_stream.server.protocols.flux_turns import FIRMING, HOLD, Thresholds, TurnTaking


def names(events) -> list[str]:
    return [event.name for event in events]


def test_nothing_before_the_first_word_then_a_start_and_updates():
    turns = TurnTaking(Thresholds())
    assert turns.follow(None, 0.95, 0.1, 0.2) == []  # an <EOU> before any word starts nothing
    assert names(turns.follow(0.5, 0.0, None, 0.64)) == ["StartOfTurn"]
    assert names(turns.follow(None, 0.1, None, 0.8)) == ["Update"]
    assert names(turns.follow(0.9, 0.0, None, 0.96)) == ["Update"]


def test_a_sure_end_ends_the_turn_at_once_and_the_next_turn_counts_on():
    turns = TurnTaking(Thresholds(eager_eot_threshold=0.5))
    turns.follow(0.5, 0.0, None, 0.64)
    events = turns.follow(None, 0.97, 1.1, 1.12)
    assert names(events) == ["EagerEndOfTurn", "EndOfTurn"] and events[-1].trigger == "model"
    assert events[-1].index == 0 and events[-1].confidence >= 0.97
    start = turns.follow(2.0, 0.0, None, 2.08)
    assert names(start) == ["StartOfTurn"] and start[0].index == 1 and start[0].start == 1.12


def test_an_unsure_end_firms_up_over_the_silence_after_it():
    turns = TurnTaking(Thresholds(eager_eot_threshold=0.5))
    turns.follow(0.5, 0.0, None, 0.64)
    assert names(turns.follow(None, 0.52, 1.0, 1.04)) == ["EagerEndOfTurn"]  # 0.52 + 0.48 * 0.04 / 0.5
    assert turns.confidence(1.04) == pytest.approx(0.52 + 0.48 * 0.04 / FIRMING)
    assert names(turns.follow(None, 0.0, None, 1.12)) == ["Update"]  # 0.64
    end = turns.follow(None, 0.0, None, 1.2)  # 0.712
    assert names(end) == ["EndOfTurn"] and end[0].trigger == "model" and end[0].confidence == pytest.approx(0.712)


def test_a_word_before_the_end_takes_it_back_and_resumes_the_turn():
    turns = TurnTaking(Thresholds(eot_threshold=0.9, eager_eot_threshold=0.5))
    turns.follow(0.5, 0.0, None, 0.64)
    assert names(turns.follow(None, 0.6, 1.0, 1.04)) == ["EagerEndOfTurn"]
    assert names(turns.follow(1.1, 0.0, None, 1.2)) == ["TurnResumed"]
    assert turns.confidence(1.6) == 0.0  # the <EOU> before the word no longer counts
    assert names(turns.follow(None, 0.3, None, 1.6)) == ["Update"]


def test_without_an_end_from_the_model_the_timeout_ends_the_turn():
    turns = TurnTaking(Thresholds(eot_timeout_ms=1000))
    turns.follow(1.0, 0.0, None, 1.12)
    assert names(turns.follow(None, 0.4, None, 1.9)) == ["Update"]
    end = turns.follow(None, 0.4, None, 2.0)
    assert names(end) == ["EndOfTurn"] and end[0].trigger == "timeout" and end[0].confidence == 0.4


def test_the_clients_end_ends_a_started_turn_only():
    turns = TurnTaking(Thresholds())
    assert turns.end(0.5, "manual") == []
    turns.follow(0.5, 0.0, None, 0.64)
    (end,) = turns.end(0.8, "manual")
    assert end.name == "EndOfTurn" and end.trigger == "manual" and turns.end(0.9, "manual") == []


def test_a_pause_where_the_sentence_cannot_end_does_not_end_the_turn():
    """"send it to the": the model's sure <EOU> in the pause is held over HOLD seconds of silence."""
    turns = TurnTaking(Thresholds(eager_eot_threshold=0.5))
    turns.follow(0.5, 0.0, None, 0.64, "send it to the")
    assert names(turns.follow(None, 0.97, 1.0, 1.04)) == ["Update"]  # at once without the hold
    assert turns.confidence(1.04) == pytest.approx((0.97 + 0.03 * 0.04 / FIRMING) * (1.04 - 0.5) / HOLD)
    assert names(turns.follow(1.4, 0.0, None, 1.52, "send it to the office")) == ["Update"]  # the speaker goes on
    end = turns.follow(None, 0.97, 1.6, 1.6)
    assert names(end) == ["EagerEndOfTurn", "EndOfTurn"] and end[-1].confidence == pytest.approx(0.97)


def test_an_unfinished_turn_left_hanging_ends_when_its_silence_has_lasted():
    turns = TurnTaking(Thresholds())
    turns.follow(0.5, 0.0, None, 0.64, "i think that")
    turns.follow(None, 0.9, 0.7, 0.72)
    at = 0.5 + 0.7 * HOLD  # firmed to 1 long before: 0.7 of HOLD after the last word
    assert names(turns.follow(None, 0.0, None, at - 0.04)) == ["Update"]
    end = turns.follow(None, 0.0, None, at + 0.04)
    assert names(end) == ["EndOfTurn"] and end[0].trigger == "model"


@pytest.mark.parametrize("text, held", [("send it to the", True), ("i think that", True), ("and", True),
                                              ("send it to the office", False), ("Send it to the.", False),
                                              ("yes", False), ("", False)])
def test_only_words_a_sentence_cannot_end_with_hold_the_turn(text, held):
    assert unfinished(text) == held
