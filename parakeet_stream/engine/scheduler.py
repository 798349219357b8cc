"""The Scheduler: every stream's lifecycle, admission, and what the model runs next.

As nano-vllm's: `schedule()` picks the next step (which streams, how many of their chunks)
by the policy in policy.py: live streams' chunks by their deadlines (the latency target's
budget, latency.py), then bulk streams' backlogs in the room the live ones leave; the runner
executes it; `postprocess()` takes it back, releases finished streams' slots and admits waiting
ones. A stream's lifecycle (status, slot,
steps in flight, chunks scheduled, its final's time) changes here only, under one lock.

Admission by measured capacity: a live stream takes a slot only while the measured step cost
(StepCost's line through the steps run so far: a round's fixed part and its part per stream)
predicts a round of every live stream within HEADROOM of the shortest chunk period among them;
past that it waits in the queue, however many slots are free, and is admitted as streams end or
as steps prove cheaper. Beyond that point every stream would fall behind together: each step takes
longer than the audio it serves, and the next step is larger. The line is fitted to the steps
run so far, and a machine whose host work grows with contention (the interpreter lock) can cost
more per stream at a load it has not run yet. So beyond the most live streams it has served in
time so far (at least PROVEN), live streams are let in a step at a time, at most a quarter more
than are running (RAMP at least) between two steps or in PACE, and none for BEHIND_HOLD seconds
after a step delivered a live chunk later than the latency target (a chunk that waited in the
queue counts from its admission; such a step also takes back what it had proven). A burst of
clients is let in as the steps show what the machine holds, not all at once. The engine measures
two batch sizes of steady chunks when it starts (calibration.py), so the line is known before the
first client; without it, slots and that pace alone decide until steps are measured. Bulk streams (files) have no deadline: they fill what live streams leave, so slots alone
decide for them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator

import numpy as np

from .errors import QueueFull
from .latency import LatencyTarget
from .policy import LOADED, SATURATED, Backlog, Ready, Situation, StepCost, Timeline, decide
from .sequence import DEAD, Sequence, Status
from .step import Step, StepItem
from .stream_table import StreamTable

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


class Scheduler:
    def __init__(self, max_num_streams: int, max_queue: int, target: float, sample_rate: int,
                 max_batch: int | None = None, max_in_flight: int = 1, max_chunks_per_step: int = 8,
                 lead: float = 0.0):
        """target: the latency target, seconds (latency.py); lead: seconds of audio a new live
        stream sends before its first chunk is ready (the shortest over the model's modes)."""
        self.max_num_streams = max_num_streams
        self.max_queue = max_queue
        self.latency = LatencyTarget(target)
        self.sample_rate = sample_rate
        self.max_batch = max_batch or max_num_streams
        self.max_in_flight = max_in_flight
        self.max_chunks_per_step = max_chunks_per_step
        self.lead = lead
        self.cost = StepCost()
        self.free: deque[int] = deque(range(max_num_streams))
        self.waiting: deque[Sequence] = deque()
        self.active: dict[int, Sequence] = {}
        self.live = LiveStreams()
        # every admitted stream's audio counters, a row per slot (stream_table.py): a plan finds the
        # streams with ready chunks by one comparison over it
        self.table = StreamTable(max_num_streams)
        self._at_slot: list[Sequence | None] = [None] * max_num_streams
        self._finals: dict[Sequence, None] = {}  # their final came; their last step is not scheduled yet
        self._in_flight: list[Step] = []
        self._last_done = 0.0  # when the last step was done
        self._timeline = Timeline()  # when the steps in flight are predicted to be done
        self._busy: deque[tuple[float, float]] = deque()  # (end, seconds) of recent steps
        self._behind_until = 0.0  # no live admissions before then (a live chunk came late)
        self._admitted = 0  # live streams admitted since the last step was taken back, or PACE
        self._paced_at = 0.0
        self._proven = PROVEN  # the most live streams a step has served in time
        self._refused: str | None = None  # why the queue's head waits, as last logged
        # the live streams' backlog at the last plan, for `stats` (worked out per plan, not per call: a
        # queued client's every position update asks for the stats)
        self._behind = _behind([], 0.0)
        self._stopped = False
        self._cv = threading.Condition()
        # a push's news without the lock while the scheduling loop is not waiting (it holds the lock
        # through a plan, which at a thousand streams takes milliseconds): `_news` tells it to plan
        # again before it waits
        self._planning = True
        self._news = False

    # --- admission and lifecycle (client threads) -------------------------------------
    def add(self, seq: Sequence) -> bool:
        """Admit now (True) or queue (False); raises QueueFull when the waiting queue is full."""
        with self._cv:
            if not self.waiting and self._admits(seq):
                self._admit(seq)
                return True
            if len(self.waiting) >= self.max_queue:
                raise QueueFull()
            self.waiting.append(seq)
            self._cv.notify_all()  # the scheduling loop admits waiting streams as the pace allows
            return False

    def position(self, seq: Sequence) -> int:
        if seq.status is not Status.WAITING:  # admitted or over: without the lock (no stream goes back to waiting)
            return 0
        with self._cv:
            return self.waiting.index(seq) + 1 if seq.status is Status.WAITING and seq in self.waiting else 0

    def chunk_ready(self) -> None:
        """A push made a chunk ready (its inbox marked the stream first)."""
        self._news = True
        if not self._planning:
            with self._cv:
                self._cv.notify_all()

    def finalize(self, seq: Sequence) -> bool:
        """The client's final: the rest of its audio is transcribed. False after a final or once dead."""
        with self._cv:
            if seq.final_at is not None or seq.status in DEAD:
                return False
            seq.final_at = time.monotonic()
            if seq.status is Status.RUNNING:
                seq.status = Status.FINALIZING
                self.table.finalizing[seq.slot] = True
            self._finals[seq] = None
            self._cv.notify_all()
            return True

    def cancel(self, seq: Sequence) -> list[Sequence]:
        """The client left: drop its work. Returns the streams whose queue state changed."""
        with self._cv:
            self._finals.pop(seq, None)
            if seq.status is Status.WAITING:
                seq.status = Status.CANCELLED
                i = self.waiting.index(seq)
                self.waiting.remove(seq)
                return list(self.waiting)[i:]
            if seq.status in (Status.RUNNING, Status.FINALIZING):
                seq.status = Status.CANCELLED
                self.table.open[seq.slot] = False
                self.live.discard(seq)
                if seq.in_flight == 0:
                    return self._release(seq)
            return []

    # --- steps (schedule: the pre-encode thread; postprocess: the decode thread, or a failed stage's)
    def schedule(self) -> Step | None:
        """Block until the policy starts a step; None once stopped. Waiting streams that fit are
        admitted here too (the pace lets more in as time passes, with or without steps)."""
        while True:
            with self._cv:
                if self._stopped:
                    return None
                admitted = self._admit_waiting()
                if not admitted:
                    self._news, timeout = False, None  # the plan sees every mark made before this
                    if len(self._in_flight) < self.max_in_flight:
                        step, timeout = self._plan(time.monotonic())
                        if step is not None:
                            return step
                    if self.waiting and self.free:  # the pace's next admissions
                        timeout = min(timeout if timeout is not None else PACE, PACE)
                    self._planning = False  # from here a push's news takes the lock and wakes it
                    if not self._news:
                        self._cv.wait(timeout)
                    self._planning = True
                    continue
            for seq in admitted:  # their queue place changed (outside the lock: listeners may call back)
                seq.outbox.notify()

    def postprocess(self, step: Step, failed: bool = False) -> tuple[list[Sequence], list[Sequence]]:
        """A step is done (or failed). Returns (streams that failed now, streams whose slot or queue place changed)."""
        now = time.monotonic()
        with self._cv:
            self._in_flight = [s for s in self._in_flight if s is not step]
            # from scheduling, or from the end of the step before it if it queued behind one, to results:
            # the model's time for it, as the Timeline adds steps end to end (the wait is the step before's)
            seconds = now - max(step.started, self._last_done)
            self._last_done = now
            if not failed:
                self.cost.record_step([max(item.chunks, 1) for item in step], seconds)
                if step.predicted_end is not None:
                    self.latency.step_done(now - step.predicted_end)
            # a chunk that arrived while its stream waited for a slot is late by the wait, not by the engine
            oldest = min((max(item.ready_times[0], item.seq.admitted_at) for item in step
                          if item.ready_times and not item.seq.bulk), default=now)
            if not failed and now - oldest > self.latency.target:
                self._behind_until = now + BEHIND_HOLD
                self._proven = max(PROVEN, min(self._proven, len(self.live) - 1))
            elif not failed:
                self._proven = max(self._proven, len(self.live))
            self._admitted = 0
            self._timeline.settle(now, sum(s.predicted_seconds for s in self._in_flight))
            self._busy.append((now, sum(step.seconds.values())))
            newly_failed, changed = [], self._admit_waiting()  # steps measured cheaper may make room
            for item in step:
                seq = item.seq
                seq.in_flight -= 1
                if failed and seq.status not in DEAD:
                    seq.status = Status.FAILED
                    self.table.open[seq.slot] = False
                    self.live.discard(seq)
                    newly_failed.append(seq)
                if seq.in_flight == 0 and (seq.status in DEAD or item.last):
                    changed += self._release(seq)
            self._cv.notify_all()
            return newly_failed, changed

    def delivered(self, seconds: float) -> None:
        """A live stream's results were taken `seconds` after they were published (no lock: latency.py)."""
        self.latency.delivered(seconds)

    def latency_figures(self) -> dict[str, float]:
        with self._cv:
            return self.latency.figures()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No step is scheduled while held: a burst of pushes lands in one step (benchmarks)."""
        with self._cv:
            yield

    def forget_steps(self) -> None:
        """Start the step measurements over: the cost, the busy fraction, the timeline, what was
        proven, the latency figures and whether a chunk came late (after the start-up measurement,
        calibration.py)."""
        with self._cv:
            self.cost = StepCost()
            self._busy.clear()
            self._timeline = Timeline()
            self._behind_until, self._proven, self._last_done = 0.0, PROVEN, 0.0
            self.latency = LatencyTarget(self.latency.target)
            self._behind = _behind([], 0.0)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def stats(self) -> dict:
        with self._cv:
            capacity = self._capacity(None)
            return {
                "active": len(self.active),
                "queued": len(self.waiting),
                "free_slots": min(len(self.free), max(0, capacity - len(self.live))),  # admitted now, live
                "capacity": capacity,
                "max_num_streams": self.max_num_streams,
                "max_queue": self.max_queue,
                **self._behind,
            }

    # --- internals (lock held) ----------------------------------------------------------------
    def _plan(self, now: float) -> tuple[Step | None, float | None]:
        """The next step by the policy, or (None, seconds to wait before deciding again)."""
        ready, backlogs = self._candidates()
        self._behind = _behind(ready, now)
        loaded = not self._in_flight and LOADED <= self._busy_fraction(now) < SATURATED
        # the other live streams matter only to hold ready chunks for them, or to fit bulk work around them
        upcoming, live_streams = self._upcoming() if backlogs or (loaded and 0 < len(ready) < self.max_batch) else ([], 0)
        chosen, timeout = decide(Situation(
            ready, upcoming, backlogs, live_streams, now, self._timeline, self.cost, self.latency.budget, self.max_batch,
            self.max_chunks_per_step, loaded, live_in_flight=any(map(_has_live, self._in_flight)), lead=self.lead,
            busy=bool(self._in_flight)))
        if not chosen:
            return None, timeout
        step = self._make_step(chosen, now)
        # its oldest work's arrival, as the plan saw it: the first ready chunk taken, or the final
        live = [(item.ready_times[0] if item.ready_times else item.final_at, item.chunks) for item in step
                if not item.seq.bulk]
        step.predicted_seconds = self._timeline.add(live, [item.chunks for item in step], now, self.cost)
        if live and self.cost.measured:  # (unmeasured, a step is predicted to cost nothing)
            step.predicted_end = self._timeline.free_at
        return step, None

    def _candidates(self) -> tuple[list[Ready], list[Backlog[Sequence]]]:
        """Live streams with a ready chunk (or their final), and bulk streams with work: the rows of
        the table with a ready chunk not taken, found at once, then the finals with nothing else left."""
        table, at_slot = self.table, self._at_slot
        ready, backlogs = [], []
        with table.lock:
            times, got, taken = table.times, table.ready, table.taken
            for row in table.with_work().tolist():
                seq = at_slot[row]
                if seq.bulk:
                    backlogs.append(Backlog(times[row][0], got[row] - taken[row], seq))
                else:
                    ready.append(Ready(times[row][0], seq, got[row] - taken[row]))
            for seq in self._finals:  # (few: those whose final came) with only their last, partial chunk left
                slot = seq.slot
                if slot is not None and table.open[slot] and got[slot] == taken[slot]:
                    (backlogs.append(Backlog(seq.final_at, 0, seq)) if seq.bulk
                     else ready.append(Ready(seq.final_at, seq, 0)))
        return ready, backlogs

    def _upcoming(self) -> tuple[list[float], int]:
        """The predicted arrivals of the next chunks of live streams without a ready one, and how many
        live streams are running: a look at every row of the table."""
        table = self.table
        live = table.open & ~table.bulk
        with table.lock:
            got = np.array(table.ready)
            quiet = np.flatnonzero(live & (got == np.array(table.taken)) & (got > 0) & ~table.finalizing)
            due = table.due(quiet, self.sample_rate)
        return due.tolist(), int(live.sum())

    def _make_step(self, chosen: list[tuple[Sequence, int]], now: float) -> Step:
        """A step of the chosen streams, each with up to its number of ready chunks."""
        table, items = self.table, []
        with table.lock:
            for seq, n in chosen:
                slot = seq.slot
                first = table.taken[slot] == 0
                times = table.take(slot, n)
                # a long backlog goes in several steps so that live streams are not held behind it
                last = seq.status is Status.FINALIZING and table.taken[slot] == table.ready[slot]
                # a backlog is framed only as far as this step's chunks need: features of all of it at once
                # would cost memory and time for chunks later steps take
                upto = None if last else table.first[slot] + (table.taken[slot] - 1) * table.every[slot]
                if last:
                    seq.last_scheduled = True
                    table.open[slot] = False
                    self._finals.pop(seq, None)
                seq.in_flight += 1
                items.append(StepItem(seq, slot, len(times), last, first, times, seq.final_at, upto))
        step = Step(items, now)
        self._in_flight.append(step)
        return step

    def _busy_fraction(self, now: float) -> float:
        while self._busy and self._busy[0][0] < now - BUSY_WINDOW:
            self._busy.popleft()
        return sum(seconds for _, seconds in self._busy) / BUSY_WINDOW

    def _capacity(self, new: Sequence | None) -> int:
        """The most live streams the measured step cost serves in real time, with `new` among them."""
        samples = self.live.shortest_period(new)
        if samples is None:
            return self.max_num_streams
        period = samples / self.sample_rate
        # at least one: a machine slower than real time still serves a stream at a time, late
        return max(1, self.cost.most_streams(HEADROOM * period, self.max_num_streams))

    def _admits(self, seq: Sequence) -> bool:
        return self._refusal(seq) is None

    def _refusal(self, seq: Sequence) -> str | None:
        """Why `seq` cannot take a slot now (None: it can), in words for the log."""
        if not self.free:
            return "every slot is taken"
        if seq.bulk:
            return None
        live = len(self.live)
        if live >= self._proven:  # past what has run in time: paced, and held while behind
            now = time.monotonic()
            if now < self._behind_until:
                return f"a live chunk came later than the target: no live admissions for {BEHIND_HOLD:g} s"
            if now - self._paced_at >= PACE:
                self._paced_at, self._admitted = now, 0
            if self._admitted >= max(RAMP, (live - self._admitted) // 4):  # those running at the last step
                return f"past the {self._proven} live streams served in time so far, they are let in a step at a time"
        capacity = self._capacity(seq)
        if live >= capacity:
            return f"the measured step cost serves {capacity} live streams in real time"
        return None

    def _admit_waiting(self) -> list[Sequence]:
        """Admit waiting streams, first come first served, while they fit; returns every stream whose
        state changed (the admitted, and the rest of the queue, whose positions moved)."""
        admitted = []
        while self.waiting and self._admits(self.waiting[0]):
            nxt = self.waiting.popleft()
            self._admit(nxt)
            admitted.append(nxt)
        if admitted:
            self._cv.notify_all()
        self._tell_why(self._refusal(self.waiting[0]) if self.waiting else None)
        return admitted + (list(self.waiting) if admitted else [])

    def _tell_why(self, refusal: str | None) -> None:
        """Log why streams wait in the queue, each time the reason changes."""
        if refusal != self._refused:
            if refusal is not None:
                log.info("admission: %d stream(s) wait: %s", len(self.waiting), refusal)
            self._refused = refusal

    def _admit(self, seq: Sequence) -> None:
        if not seq.bulk and len(self.live) >= self._proven:  # past what ran in time: paced
            self._admitted += 1
        slot = self.free.popleft()
        seq.slot, seq.admitted_at = slot, time.monotonic()
        seq.status = Status.FINALIZING if seq.final_at is not None else Status.RUNNING
        self.active[seq.stream_id] = seq
        self.live.add(seq)
        seq.inbox.move_to(self.table, slot)  # with what it sent while it waited
        self._at_slot[slot] = seq
        table = self.table
        table.open[slot], table.bulk[slot], table.finalizing[slot] = True, seq.bulk, seq.final_at is not None

    def _release(self, seq: Sequence) -> list[Sequence]:
        """Free the stream's slot and admit waiting streams; returns every stream whose state changed."""
        table, slot = self.table, seq.slot
        table.open[slot] = table.finalizing[slot] = False
        seq.inbox.move_out()  # a push that comes now lands in its own table, not in the row's next stream's
        self._at_slot[slot] = None
        self._finals.pop(seq, None)
        self.free.append(slot)
        seq.slot = None
        if seq.status is Status.FINALIZING:
            seq.status = Status.FINISHED
        self.active.pop(seq.stream_id, None)
        self.live.discard(seq)
        self._cv.notify_all()
        return self._admit_waiting()


def _behind(ready: list[Ready], now: float) -> dict:
    """How far behind the live streams are at a plan (an overloaded server's edges, for operators):
    those with more than one chunk waiting, the most chunks one has waiting, and how long the oldest
    waiting chunk has waited."""
    return {"streams_behind": sum(r.chunks > 1 for r in ready),
            "longest_backlog_chunks": max((r.chunks for r in ready), default=0),
            "oldest_chunk_wait_s": round(max(0.0, now - min((r.ready_at for r in ready), default=now)), 3)}


def _has_live(step: Step) -> bool:
    return any(not item.seq.bulk for item in step)
