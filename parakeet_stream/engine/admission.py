"""Admission by measured capacity: whether a live stream may take a free slot now.

A live stream takes a slot only while the measured step cost (StepCost's line through the steps
run so far: a round's fixed part and its part per stream) predicts a round of every live stream
within HEADROOM of the shortest chunk period among them; past that it waits in the queue, however
many slots are free, and is admitted as streams end or as steps prove cheaper. The line is fitted to
every batch size measured, however long ago, so what the last live step's round serves at its cost
shared among its streams counts too: steps held up for a while left the sizes that ran then dear,
and the line alone held a recovered machine to one live stream. Beyond that point
every stream would fall behind together: each step takes longer than the audio it serves, and the
next step is larger.

The line is fitted to the steps run so far, and a machine whose host work grows with contention
(the interpreter lock, the server's own threads on a CPU's cores) can cost more per stream at a
load it has not run yet. So beyond the most live streams it has *proven* (at least PROVEN), live
streams are let in a step at a time, at most a quarter more than are running (RAMP at least)
between two steps or in PACE, and none for BEHIND_HOLD seconds after a step delivered a live chunk
later than the latency target (chunks that came while their stream waited in the queue do not
count: they are a backlog the stream catches up on; such a step also takes back what it had
proven). A step proves its live streams only when it was in time *with room to spare*: its rounds
took at most HEADROOM of the chunk period. And past what was proven, a live stream is let in only
where the last step with live chunks, with the line's cost per stream added for every live stream
its round did not hold and one more, keeps its round within HEADROOM: the line is fitted to the
steps of every load so far and a running server's own work (its connections' protocol on the same
cores) makes its next steps dearer than the line says, so a burst on a fresh replica was let in
past what the machine holds while the line still said yes; the last step measures the machine as it
is now. The engine measures two batch sizes of steady chunks when it starts (calibration.py), so
the line is known before the first client; without it, slots and that pace alone decide until steps
are measured.
Bulk streams (files) have no deadline: they fill what live streams leave, so slots alone decide
for them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque

from .policy import SATURATED, StepCost
from .sequence import Sequence

log = logging.getLogger(__name__)

BUSY_WINDOW = 1.0  # seconds over which the model's busy fraction is measured
HEADROOM = SATURATED  # share of a chunk period a round of every live stream may take
PROVEN = 16  # live streams admitted without pacing on any machine
RAMP = 4  # live streams that may be admitted between two steps, however few run
BEHIND_HOLD = 1.0  # seconds without live admissions after a live chunk came later than the target
PACE = 0.1  # seconds: at most max(RAMP, a quarter of those running) live admissions in each, or per step


class LiveStreams:
    """The live (not bulk) streams holding a slot that are not dead: how many, and how many of
    each chunk period. Admission asks for both at every step and at every admission: counted as
    streams come and go, not by a loop over every stream."""

    def __init__(self) -> None:
        self._ids: set[int] = set()
        self._periods: Counter[int] = Counter()  # samples per chunk -> streams

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, seq: Sequence) -> None:
        if not seq.bulk and seq.stream_id not in self._ids:
            self._ids.add(seq.stream_id)
            self._periods[seq.inbox.chunk_samples] += 1

    def discard(self, seq: Sequence) -> None:
        if seq.stream_id in self._ids:
            self._ids.remove(seq.stream_id)
            period = seq.inbox.chunk_samples
            self._periods[period] -= 1
            if not self._periods[period]:
                del self._periods[period]

    def shortest_period(self, new: Sequence | None = None) -> int | None:
        """The shortest chunk period among them (in samples), `new` counted in; None without any."""
        periods = [*self._periods, *([new.inbox.chunk_samples] if new else [])]
        return min(periods, default=None)


class Admission:
    """The measured step cost, the live streams, and the pace and holds past what steps proved.
    The Scheduler calls it under its lock."""

    def __init__(self, max_num_streams: int, sample_rate: int):
        self.max_num_streams = max_num_streams
        self.sample_rate = sample_rate
        self.live = LiveStreams()
        self.forget()
        self._refused: str | None = None  # why the queue's head waits, as last logged

    def forget(self) -> None:
        """Start the measurements over (after the start-up measurement, calibration.py)."""
        self.cost = StepCost()
        self._busy: deque[tuple[float, float]] = deque()  # (end, seconds) of recent steps
        self._behind_until = 0.0  # no live admissions before then (a live chunk came late)
        self._admitted = 0  # live streams admitted since the last step was taken back, or PACE
        self._paced_at = 0.0
        self._proven = PROVEN  # the most live streams a step has served in time, with room to spare
        self._last_round: tuple[int, float] | None = None  # the last live step's (streams a round, seconds)

    def refusal(self, seq: Sequence, free_slots: int) -> str | None:
        """Why `seq` cannot take a slot now (None: it can), in words for the log."""
        if not free_slots:
            return "every slot is taken"
        if seq.bulk:
            return None
        live = len(self.live)
        if live >= self._proven:  # past what has been proven: paced, and held while behind
            now = time.monotonic()
            if now < self._behind_until:
                return f"a live chunk came later than the target: no live admissions for {BEHIND_HOLD:g} s"
            if (full := self._full(seq)) is not None:
                return full
            if now - self._paced_at >= PACE:
                self._paced_at, self._admitted = now, 0
            if self._admitted >= max(RAMP, (live - self._admitted) // 4):  # those running at the last step
                return f"past the {self._proven} live streams served in time so far, they are let in a step at a time"
        capacity = self.capacity(seq)
        if live >= capacity:
            return f"the measured step cost serves {capacity} live streams in real time"
        return None

    def admitted(self, seq: Sequence) -> None:
        if not seq.bulk and len(self.live) >= self._proven:  # past what was proven: paced
            self._admitted += 1
        self.live.add(seq)

    def step_done(self, chunks: list[int], seconds: float, late: bool | None, busy: float, now: float) -> None:
        """A step (not failed) with `chunks` per stream took `seconds` of the model, `busy` of its
        stages; `late`: a live chunk of it came later than the target (None: it had no live chunk,
        and says nothing about the live streams)."""
        self.cost.record_step(chunks, seconds)
        live = len(self.live)
        if late:
            self._behind_until = now + BEHIND_HOLD
            self._proven = max(PROVEN, min(self._proven, live - 1))
        rounds = max(chunks, default=1)
        if late is not None:
            self._last_round = (round(sum(chunks) / rounds), seconds / rounds)
        if late is False and self._with_room(seconds / rounds):
            self._proven = max(self._proven, live)
        self._admitted = 0
        self._busy.append((now, busy))
        if log.isEnabledFor(logging.DEBUG):  # what moved the capacity, step by step
            line = self.cost.line()
            log.debug("admission: a step of %d stream(s) a round took %.1f ms a round (late: %s); live %d, line %s, "
                      "capacity %d", round(sum(chunks) / rounds), seconds / rounds * 1000, late, live,
                      line and f"{line[0] * 1000:.1f} ms + {line[1] * 1000:.2f} ms a stream", self.capacity(None))

    def busy_fraction(self, now: float) -> float:
        while self._busy and self._busy[0][0] < now - BUSY_WINDOW:
            self._busy.popleft()
        return sum(seconds for _, seconds in self._busy) / BUSY_WINDOW

    def capacity(self, new: Sequence | None) -> int:
        """The most live streams the measured step cost serves in real time, with `new` among them:
        what the line says, or what the last live step's round serves at its cost shared among its
        streams, if more (`_serves_now`); at least one."""
        samples = self.live.shortest_period(new)
        if samples is None:
            return self.max_num_streams
        budget = HEADROOM * samples / self.sample_rate
        # at least one: a machine slower than real time still serves a stream at a time, late
        return max(1, self.cost.most_streams(budget, self.max_num_streams), self._serves_now(budget))

    def _serves_now(self, budget: float) -> int:
        """The most streams a round within `budget` holds, priced as the last live step's round shared
        among its streams (a round with a fixed part never costs more than that: the line's own model,
        on the machine as it is now); 0 before a live step. The line, and each batch size's moving
        average, are made of steps of every load so far, and a size's average moves only while steps of
        that size run: one step held up for a while at a size (the CPU taken by other work; a first
        chunk, dearer, among them) kept that size dear, and the line alone held a recovered machine to
        one live stream."""
        if self._last_round is None:
            return 0
        streams, seconds = self._last_round
        if seconds <= 0:
            return self.max_num_streams
        return min(self.max_num_streams, int(budget * streams / seconds + 1e-9))

    def tell_why(self, refusal: str | None, waiting: int) -> None:
        """Log why streams wait in the queue, each time the reason changes."""
        if refusal != self._refused:
            if refusal is not None:
                log.info("admission: %d stream(s) wait: %s", waiting, refusal)
            self._refused = refusal

    def _with_room(self, round_seconds: float, new: Sequence | None = None) -> bool:
        """A round of `round_seconds` takes at most HEADROOM of the shortest live chunk period."""
        samples = self.live.shortest_period(new)
        return samples is None or round_seconds <= HEADROOM * samples / self.sample_rate

    def _full(self, seq: Sequence) -> str | None:
        """Why the last live step's round, one stream more, would not leave the room (None: it would)."""
        if self._last_round is None:
            return None
        streams, seconds = self._last_round
        line = self.cost.line()
        per_stream = line[1] if line is not None else seconds / max(streams, 1)
        if self._with_room(seconds + per_stream * max(0, len(self.live) + 1 - streams), seq):
            return None
        return f"the last step, with the other live streams and one more, would take more than {HEADROOM:.0%} of a chunk period"
