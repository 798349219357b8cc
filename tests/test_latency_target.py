"""The latency target on a simulated clock: p95 from a chunk's last sample to its result at the
client stays under the target up to the load where no policy could keep it, and degrades
gracefully beyond.

Real-time streams start unaligned; a step's time varies around its mean (lognormal, as measured
steps do: another process, a cache miss), and a result reaches its client some milliseconds after
it is published (the server's event loop). The Scheduler's parts run as in the engine: policy.decide,
StepCost and the Timeline predicting steps, LatencyTarget learning delivery and the prediction's
error, the busy fraction turning the holding rule on and off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest

from parakeet_stream.engine.latency import LatencyTarget, Recent
from parakeet_stream.engine.policy import LOADED, SATURATED, Ready, Situation, StepCost, Timeline, decide

PERIOD = 0.16  # seconds of audio per chunk
TARGET = 0.22  # about a chunk and a loaded step: where holding for batching and the target compete
SPREAD = 0.25  # sigma of a step's lognormal time around its mean
DELIVERY, DELIVERY_SPREAD = 0.005, 0.015  # a result reaches its client after 5 ms + exponential (mean 15 ms)
CAPACITY = 7  # most streams whose p95 the target can hold on this clock (8: 0.22-0.25 s, seed by seed)


def round_seconds(rows: int) -> float:
    return 0.04 + 0.01 * rows  # a fixed part (reading the weights) plus a part per stream


@dataclass
class Talk:
    """One utterance of a stream slot: its audio runs from `start` to `end`, then its final."""

    start: float
    end: float
    made: int = 0  # whole chunks arrived
    pending: deque = field(default_factory=deque)  # arrival of each chunk not yet scheduled
    final: bool = False  # the final arrived (its last, partial chunk is ready)

    def due(self) -> float:
        return self.start + (self.made + 1) * PERIOD


def simulate(streams: int, learn: bool, seconds: float = 40.0, seed: int = 0) -> dict:
    """`streams` slots, each running utterances of 2-6 s one after the other, 0.2-1 s apart, a
    client's final at the end of each; learn: the budget is the target less what LatencyTarget
    learned (else the whole target: the budget spent, as before). Returns the latencies (s) of
    every chunk's result and of the finals', the first fifth of the run left out (learning)."""
    rng = np.random.default_rng(seed)
    cost, timeline, latency = StepCost(), Timeline(), LatencyTarget(TARGET)

    def talk(start: float) -> Talk:
        return Talk(start, start + float(rng.uniform(2, 6)))

    talks = [talk(float(rng.uniform(0, 1))) for _ in range(streams)]
    busy: deque = deque()  # (end, seconds) of steps in the last second
    now, chunks, finals = 0.0, [], []
    while now < seconds:
        for t in talks:
            while t.start <= now and t.due() <= min(now, t.end):
                t.pending.append(t.due())
                t.made += 1
            t.final = t.final or now >= t.end
        while busy and busy[0][0] < now - 1.0:
            busy.popleft()
        loaded = LOADED <= sum(s for _, s in busy) < SATURATED
        running = [i for i, t in enumerate(talks) if t.start <= now]
        ready = [Ready(talks[i].pending[0] if talks[i].pending else talks[i].end, i, len(talks[i].pending))
                 for i in running if talks[i].pending or talks[i].final]
        upcoming = [talks[i].due() for i in running if not talks[i].pending and not talks[i].final]
        budget = latency.budget if learn else TARGET
        chosen, wait = decide(Situation(ready, upcoming, [], len(running), now, timeline, cost, budget, 64, 8, loaded, False))
        if not chosen:
            events = [e for t in talks for e in (t.start, min(t.due(), t.end)) if e > now]
            now = min(events) if wait is None else min(now + wait, *events)
            continue
        taken = {i: min(n, len(talks[i].pending)) for i, n in chosen}
        live = [(talks[i].pending[0] if talks[i].pending else talks[i].end, n) for i, n in taken.items()]
        timeline.add(live, [n for _, n in live], now, cost)
        predicted = timeline.free_at if cost.measured else None
        rows = [max(n, 1) for n in taken.values()]
        took = sum(round_seconds(sum(1 for n in rows if n > r)) for r in range(max(rows)))
        took *= float(rng.lognormal(0, SPREAD))
        now += took
        timeline.settle(now)
        busy.append((now, took))
        cost.record_step(rows, took)
        if predicted is not None:
            latency.step_done(now - predicted)
        for i, n in taken.items():
            t, delivered = talks[i], now + DELIVERY + float(rng.exponential(DELIVERY_SPREAD))
            latency.delivered(delivered - now)
            chunks += [(now, delivered - t.pending.popleft()) for _ in range(n)]
            if t.final and not t.pending:
                finals.append((now, delivered - t.end))
                talks[i] = talk(t.end + float(rng.uniform(0.2, 1.0)))
    settled = seconds / 5
    waiting = [now - (t.pending[0] if t.pending else t.end) for t in talks if t.pending or t.final]
    return {"chunks": [lat for at, lat in chunks if at > settled], "finals": [lat for at, lat in finals if at > settled],
            "oldest_waiting": max(waiting, default=0.0)}


def p95(run: dict, kind: str = "chunks") -> float:
    return float(np.percentile(run[kind], 95))


@pytest.mark.parametrize("streams", range(1, CAPACITY + 1))
def test_p95_stays_under_the_target_up_to_capacity(streams):
    run = simulate(streams, learn=True)
    assert p95(run) <= TARGET and p95(run, "finals") <= TARGET


def test_the_budget_spent_whole_misses_the_target_where_holding_pays():
    """What the learned budget fixes: planning steps to end at the target itself, with steps that
    vary and a delivery after them, lands p95 past the target at moderate load."""
    missed = [n for n in (3, 5) if max(p95(run := simulate(n, learn=False)), p95(run, "finals")) > TARGET]
    assert missed == [3, 5]


@pytest.mark.parametrize("streams", [CAPACITY + 1, CAPACITY + 2])
def test_beyond_capacity_latency_grows_gracefully(streams):
    run = simulate(streams, learn=True)
    assert p95(run) <= 2 * TARGET and p95(run, "finals") <= 2 * TARGET


def test_at_the_throughput_limit_nobody_starves():
    """11 streams: a round of them takes as long as a chunk of audio. Latency is high but bounded,
    and every stream's results keep coming (earliest deadline first)."""
    run = simulate(CAPACITY + 4, learn=True)
    assert max(run["chunks"]) < 3 and run["oldest_waiting"] < 3


def test_the_budget_is_the_target_less_delivery_and_margin_at_p95_never_below_half():
    lt = LatencyTarget(0.3)
    assert lt.budget == 0.3 and lt.figures()["delivery_p95"] == 0.0  # nothing learned yet: the whole target
    for ms in range(1, 101):  # delivery 1..100 ms: p95 95.05 ms
        lt.delivered(ms / 1000)
    for _ in range(100):
        lt.step_done(-0.01)  # steps early: no margin (never a negative one)
    assert lt.margin == 0.0 and lt.budget == pytest.approx(0.3 - 0.09505)
    for _ in range(256):
        lt.step_done(0.02)
    assert lt.budget == pytest.approx(0.3 - 0.09505 - 0.02)
    for _ in range(256):
        lt.step_done(1.0)
    assert lt.budget == 0.15


def test_a_target_of_zero_or_less_is_refused():
    with pytest.raises(ValueError, match="above 0"):
        LatencyTarget(0.0)


def test_the_recent_window_percentile_is_numpys_over_the_last_measurements():
    rng = np.random.default_rng(0)
    recent, values = Recent(50), rng.normal(0.05, 0.03, 300).tolist()
    for n, value in enumerate(values, 1):
        recent.append(value)
        assert recent.high() == pytest.approx(max(np.percentile(values[max(0, n - 50) : n], 95), 0.0), abs=1e-12)
