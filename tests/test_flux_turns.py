"""The decisions behind Deepgram Flux's turn events (server/protocols/flux_turns.py), stretch by
stretch: when a turn starts, when the model's <EOU> probability, firmed by the silence after it,
ends it, eager ends and resumptions, the timeout and the client's own end."""
from __future__ import annotations

import pytest

from parakeet_stream.server.protocols.flux_turns import FIRMING, Thresholds, TurnTaking


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
