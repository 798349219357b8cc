"""The batching policy: when to run the next step and which streams' chunks go in it.

Two kinds of stream. A live stream's chunk has a deadline: the arrival of the last sample it
needs plus the budget, the share of the latency target (`--latency-target`, a p95 promise up to
the client) that the delivery of its result and the error of these predictions leave to the
step that carries it (latency.py). A bulk stream (a file: its audio is all there at once) has no
deadline; it has the lowest priority and takes whatever capacity the live streams leave.

Live chunks (`plan`): earliest deadline first. A step's cost grows slowly with its batch (a step
is mostly reading the weights). While a step runs, whatever arrives batches into the next one by
itself; when the model falls idle under load, it pays to hold a ready chunk until the other
streams' chunks, due shortly, can share its step, as long as the earliest deadline still holds.
Under light load nothing waits; while bulk work is waiting nothing waits either: the idle time
that holding would trade goes to bulk work instead.

Bulk chunks (`fill`): after the live chunks, a step takes bulk work at the largest batch first
(every bulk stream, up to the batch limit), then as many of each one's backlogged chunks
(rounds) as fit. A `Timeline` keeps two predicted clocks: when the work handed to the model is
done, and when its live part alone would be (the step without its bulk work, started when its
first live chunk arrived or the live work before it was done). A step with bulk work must end
- with live chunks in it: by their deadlines (a live chunk nobody foresaw, a final, waits for its
  live work anyway);
- without: early enough that a live chunk nobody foresaw, arriving just as it starts, is still
  served by the next step within the budget; with no live stream running, that chunk is a new
  stream's first, which comes no sooner than `lead` (the audio it needs) from now;
- at most BULK_DELAY (a fraction of a one-stream step) after the live clock says its live
  chunks, and the next live arrival that real-time pacing predicts (a late one counts as coming
  now, until a budget late), would be served without bulk work.
A step of bulk work alone also waits while a step with live chunks is in flight: the stages of
two steps in flight share the machine (on a CPU, its cores); bulk work may still ride along in the
next live step. Behind bulk work in flight, the next bulk step waits until a round of every bulk
stream fits rather than start a narrow one: the widest batch is the cheapest per chunk, and the
model is busy meanwhile. Measured on the live clock, delays do not add up
over a run of busy steps: bulk work holds any live chunk at most BULK_DELAY (beyond prediction
errors) and never past its deadline. It fills the gaps between live steps and rides along in
live steps only where that costs them little. Bulk work is never starved on an idle model: when
no bulk step fits and nothing in flight or due will make room (a model slower than the budget, or
a cost learned from a cold first step), the smallest bulk step runs. Bulk streams take the model's longest lookahead:
the largest chunk, the cheapest per second of audio.

Pure functions of their inputs (and the Timeline, a plain value), so the policy is tested on a
simulated clock.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Generic, NamedTuple, TypeVar

import numpy as np

T = TypeVar("T")

GRACE = 0.005  # arrivals are predicted from real-time pacing: allow this much jitter
# An idle model waits for due chunks only between these busy fractions: below, there is no
# need; above, the model has no idle time to trade for bigger steps (measured on CPU: waiting
# there raised p95 latency 2-3x at 8 streams; see docs/performance.md).
LOADED, SATURATED = 0.5, 0.8
BULK_DELAY = 0.1  # bulk work may hold a live chunk this fraction of a one-stream step beyond its time without it


class StepCost:
    """Measured seconds of one round by its batch (moving average), to predict steps not yet run.

    A step of one chunk per stream is one round; a step whose streams take several chunks runs
    them in rounds, one after the other (runner/model_runner.py). Seconds are the model's time for a
    step: from scheduling (or, if it queued behind the step before, from that one's end) to
    results, what the Timeline adds end to end. Counting the wait too would count it twice, and
    make steps that overlap look dearer the more they overlap.
    """

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._seconds: dict[int, float] = {}
        # the measured batches and their costs made monotone, what predictions interpolate: no batch
        # costs more than a larger one was measured to (a step of fewer streams does no more work;
        # on a CPU a narrow step timed under contention could cost more than a wide one, and the
        # policy's bisection over batch sizes then settled on narrow steps, two per round of files)
        self._batches: list[int] = []
        self._costs: list[float] = []
        self._line: tuple[float, float] | None = None

    @property
    def measured(self) -> bool:
        return bool(self._seconds)

    def knows(self, batch: int) -> bool:
        """A batch this size or smaller was measured: its cost is not just bounded by a larger one's."""
        return bool(self._batches) and self._batches[0] <= batch

    def record(self, batch: int, seconds: float) -> None:
        old = self._seconds.get(batch)
        self._seconds[batch] = seconds if old is None else old + self.alpha * (seconds - old)
        self._batches = sorted(self._seconds)
        self._costs = list(itertools.accumulate((self._seconds[b] for b in reversed(self._batches)), min))[::-1]
        self._line = None

    def line(self) -> tuple[float, float] | None:
        """(fixed, per stream) seconds of a round, a least-squares line through the measured batches;
        None before two batch sizes were measured. What admission extrapolates with: a step's fixed
        part (the weights' read) and its per-stream part (the host's work, the arithmetic) both show
        in the steps of any load, where `__call__`'s proportional extrapolation beyond the largest
        batch measured would price a GPU's flat steps as if every stream paid the fixed part."""
        if self._line is None and len(self._seconds) >= 2:
            x = np.array(list(self._seconds), dtype=float)
            y = np.array(list(self._seconds.values()))
            slope = max(float(np.polyfit(x, y, 1)[0]), 0.0) if np.ptp(x) else 0.0
            self._line = (max(float(np.mean(y - slope * x)), 0.0), slope)
        return self._line

    def most_streams(self, seconds: float, limit: int) -> int:
        """The most streams (up to `limit`) whose round the line predicts within `seconds`; `limit`
        before the line is known."""
        line = self.line()
        if line is None:
            return limit
        fixed, per_stream = line
        if per_stream <= 0:
            return limit if fixed <= seconds else 0
        return max(0, min(limit, int((seconds - fixed) / per_stream + 1e-9)))

    def record_step(self, chunks: list[int], seconds: float) -> None:
        """A step with `chunks` per stream (at least 1 each) took `seconds`: its rounds at their mean batch."""
        rounds = max(chunks)
        self.record(round(sum(chunks) / rounds), seconds / rounds)

    def step(self, chunks: list[int]) -> float:
        """Predicted seconds of a step with `chunks` per stream (at least 1 each)."""
        return sum(self(sum(1 for c in chunks if c > r)) for r in range(max(chunks, default=0)))

    def __call__(self, batch: int) -> float:
        if batch <= 0 or not self._batches:
            return 0.0
        batches, costs = self._batches, self._costs
        i = bisect.bisect_left(batches, batch)
        if i == len(batches):  # beyond what was measured: no cheaper per stream than the largest batch
            return costs[-1] * batch / batches[-1]
        if batches[i] == batch or i == 0:  # (a smaller batch than any measured: at most the smallest's cost)
            return costs[i]
        lower, upper = batches[i - 1], batches[i]
        return costs[i - 1] + (costs[i] - costs[i - 1]) * (batch - lower) / (upper - lower)


class Ready(NamedTuple):  # a tuple: one is made per ready stream at every plan (no Generic: Python 3.10)
    ready_at: float  # arrival of the last sample its oldest unscheduled chunk needs
    item: Any  # the stream
    chunks: int = 1  # its ready chunks not scheduled (0: only its last, partial chunk is left)


@dataclass
class Backlog(Generic[T]):
    since: float  # arrival of its oldest chunk not scheduled: bulk streams are served first come, first served
    chunks: int  # whole chunks ready (0: only its last, partial chunk is left)
    item: T


@dataclass
class Timeline:
    """Predicted ends of the work handed to the model: all of it (`free_at`), and its live part
    alone (`live_free_at`); the gap is how late bulk work has made the live work."""

    free_at: float = 0.0
    live_free_at: float = 0.0

    def live_done(self, live: list[tuple[float, int]], now: float, cost: StepCost) -> float:
        """When a step of these live chunks ((ready_at, chunks) each) would be done without bulk work."""
        if not live:
            return max(now, self.live_free_at)
        return max(min(t for t, _ in live), self.live_free_at) + cost.step([max(c, 1) for _, c in live])

    def add(self, live: list[tuple[float, int]], chunks: list[int], now: float, cost: StepCost) -> float:
        """A step was handed to the model: its live chunks and every stream's chunks. Returns its predicted seconds."""
        if live:
            self.live_free_at = self.live_done(live, now, cost)
        seconds = cost.step([max(c, 1) for c in chunks])
        self.free_at = max(now, self.free_at) + seconds
        return seconds

    def settle(self, now: float, pending: float = 0.0) -> None:
        """A step is done; `pending`: the predicted seconds of the steps still in flight. Predictions
        are reset to what is known, so their errors do not add up while the model never falls idle
        (a step's measured cost holds its wait behind the one in flight: added end to end, the
        predicted ends would run away from the real ones)."""
        self.free_at = now + pending
        self.live_free_at = min(self.live_free_at, self.free_at)


@dataclass(frozen=True)
class Situation(Generic[T]):
    """What one decision looks at: the streams' work, the machine's state and the Scheduler's limits."""

    ready: list[Ready]  # live streams with a ready chunk (or their final)
    upcoming: list[float]  # predicted arrivals of the other live streams' next chunks
    backlogs: list[Backlog[T]]  # bulk streams with work
    live_streams: int  # live streams running
    now: float
    timeline: Timeline
    cost: StepCost
    budget: float  # seconds a live chunk may wait before its step (latency.py)
    max_batch: int
    max_rounds: int  # chunks one stream may take in a step
    loaded: bool  # the model is idle but loaded (see `plan`'s align)
    live_in_flight: bool  # a step with live chunks is in flight: a step of bulk work alone waits for it
    lead: float = 0.0  # `fill`'s
    busy: bool = False  # `fill`'s


def decide(s: Situation[T]) -> tuple[list[tuple[T, int]], float | None]:
    """The next step as (stream, chunks to take) pairs: live streams by `plan`, each taking its
    ready chunks up to `max_rounds`, then bulk work by `fill`; or ([], seconds to wait before
    deciding again, None: until something changes). With a live step in flight bulk work does not
    start alone (the stages of two steps in flight share the machine: on a CPU, the cores)."""
    ready, upcoming, backlogs, now, max_rounds = s.ready, s.upcoming, s.backlogs, s.now, s.max_rounds
    live_in_flight, cost, budget, max_batch = s.live_in_flight, s.cost, s.budget, s.max_batch
    live, timeout = plan(ready, upcoming, now, cost, budget, max_batch, align=s.loaded and not backlogs)
    if live_in_flight and not live:  # bulk work rides along in a live step, or waits for the live one in flight
        backlogs = []
    chunks = [(r.ready_at, min(r.chunks, max_rounds)) for r in live] if backlogs else []  # (only `fill` reads them)
    bulk, wait = fill(backlogs, chunks, upcoming, s.live_streams, now, s.timeline, cost, budget, max_batch, max_rounds,
                      s.lead, s.busy or live_in_flight)
    if live or bulk:
        return [(r.item, max_rounds) for r in live] + bulk, None
    return [], min((t for t in (timeout, wait) if t is not None), default=None)


def plan(ready: list[Ready], upcoming: list[float], now: float, cost: StepCost, budget: float,
         max_batch: int, align: bool) -> tuple[list[Ready], float | None]:
    """Decide the next step.

    ready: streams with a ready chunk; upcoming: predicted times at which the other
    running streams' next chunks are ready; align: hold ready chunks for due ones (the scheduler asks for it
    when the model is idle but loaded: with a step running, what arrives meanwhile batches anyway).
    Returns (the entries of `ready` to run now, None), or ([], seconds to wait before deciding again); with
    nothing ready, ([], None): wait for an arrival.
    """
    if not ready:
        return [], None
    ready = sorted(ready, key=itemgetter(0))  # earliest deadline first
    batch = ready[:max_batch]
    if len(ready) >= max_batch or not align:
        return batch, None
    deadline = ready[0].ready_at + budget
    coming = sorted(t for t in upcoming if t > now - GRACE)
    joined = 0
    for i, t in enumerate(coming[: max_batch - len(batch)]):
        if max(t, now) + GRACE + cost(len(batch) + i + 1) > deadline:
            break
        joined = i + 1
    if joined == 0:
        return batch, None
    return [], max(coming[joined - 1] + GRACE - now, 0.0005)


def fill(backlogs: list[Backlog[T]], live: list[tuple[float, int]], upcoming: list[float], live_streams: int,
         now: float, timeline: Timeline, cost: StepCost, budget: float, max_batch: int, max_rounds: int,
         lead: float = 0.0, busy: bool = False) -> tuple[list[tuple[T, int]], float | None]:
    """Bulk work for the next step, after its live chunks (see the module docstring).

    backlogs: bulk streams with work; live: (ready_at, chunks) of the live streams in the step;
    upcoming: predicted arrivals of the other live streams' next chunks; live_streams: live
    streams running; timeline: the work in flight; lead: seconds of audio a new live stream sends
    before its first chunk is ready (0: it may come at once); busy: a step is in flight.
    Returns ([(stream, chunks to take)], None), or, when no bulk work fits, ([], seconds to wait
    before deciding again: until the earliest predicted live arrival is stale) or ([], None).
    """
    room = max_batch - len(live)
    # what bulk work adds to live chunks is known only once a step of theirs alone was measured
    if not backlogs or room <= 0 or (live and not cost.knows(len(live))):
        return [], None
    start = max(now, timeline.free_at)
    live_chunks = [max(c, 1) for _, c in live]
    # a chunk late on its prediction is still coming (a client's pacing jitters) until a budget has passed
    due = [t for t in upcoming if t > now - budget]
    end = _latest_end(live, due, live_streams, now, timeline.live_done(live, now, cost), cost, budget, lead)
    queue = sorted(backlogs, key=lambda b: b.since)[:room]

    def fits(rows: int, rounds: int) -> bool:
        bulk = [min(max(b.chunks, 1), rounds) for b in queue[:rows]]
        return start + cost.step(live_chunks + bulk) <= end

    if busy and not live and not due and not fits(len(queue), 1):
        # the model is busy: a step of every bulk stream follows the work in flight once the clock
        # lets it (or once it is done), rather than a narrow one now (the widest batch is the cheapest per chunk)
        wait = start + cost.step([1] * len(queue)) - end
        return [], max(wait, 0.0005) if now + wait < start else None
    rows = _most(lambda n: fits(n, 1), len(queue))  # the largest batch first,
    if rows == 0:
        if live or due or start > now:  # room comes once that live work or the work in flight is done
            return [], max(min(due) + budget - now, 0.0005) if due and not live else None
        # Nothing to wait for: the bound moves with the clock, so waiting would never make room (a model
        # slower than the budget allows, or a cost learned from a cold first step). Bulk work is never
        # starved on an idle model: the smallest step runs.
        rows = 1
    # then as many rounds as fit (one until a step was measured: an unmeasured step costs 0)
    rounds = max(_most(lambda n: fits(rows, n), max_rounds if cost.measured else 1), 1)
    return [(b.item, min(b.chunks, rounds)) for b in queue[:rows]], None


def _latest_end(live: list[tuple[float, int]], due: list[float], live_streams: int, now: float,
                live_done: float, cost: StepCost, budget: float, lead: float) -> float:
    """When a step carrying bulk work must be done; live_done: when the live clock says its live
    chunks (or, with none, the live work before it) would be done without bulk work."""
    tolerance = BULK_DELAY * cost(1)  # a live chunk takes at least a step of its own: at most BULK_DELAY more
    if live:  # a live chunk nobody foresaw waits for this step's live work anyway: bulk work adds the tolerance
        end = min(min(t for t, _ in live) + budget, live_done + tolerance)
    else:  # one that arrives now (a final; with no live stream, a new stream's first, `lead` away) is served in time
        end = now + budget - GRACE - cost(live_streams + 1) + (0.0 if live_streams else lead)
    if due:  # the next live arrival, served when it comes (now, if late) or when the live work before it is done
        end = min(end, max(live_done, min(max(t, now) for t in due) - GRACE) + tolerance)
    return end


def _most(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n in 0..limit that fits (0 if none), for `fits` true up to some n and false beyond."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def bulk_lookahead(modes: list[tuple[int, int]]) -> tuple[int, int]:
    """The mode bulk streams take unless told: the longest lookahead (the largest chunk: fewest steps per second)."""
    return max(modes, key=lambda mode: mode[1])
