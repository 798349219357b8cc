"""The Scheduler: every stream's lifecycle, admission, and what the model runs next.

As nano-vllm's: `schedule()` picks the next step (which streams, how many of their chunks)
by the policy in policy.py (its StepPlanner, planner.py, plans it): live streams' chunks by their
deadlines (the latency target's budget, latency.py), then bulk streams' backlogs in the room the
live ones leave; the runner executes it; `postprocess()` takes it back, releases finished streams'
slots and admits waiting ones. A stream's lifecycle (status, slot, steps in flight, chunks
scheduled, its final's time) changes here and in the planner only, under one lock.

Admission (admission.py) decides whether a live stream may take a free slot now; the slot pool
(slots.py) says which stream holds each slot, and its stream table which have work.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator

from .admission import PACE, Admission
from .errors import QueueFull
from .latency import LatencyTarget
from .planner import StepPlanner
from .policy import StepCost
from .sequence import DEAD, Sequence, Status
from .slots import SlotPool
from .step import Step


class Scheduler:
    def __init__(self, max_num_streams: int, max_queue: int, target: float, sample_rate: int,
                 max_batch: int | None = None, max_in_flight: int = 1, max_chunks_per_step: int = 8,
                 lead: float = 0.0):
        """target: the latency target, seconds (latency.py); lead: seconds of audio a new live
        stream sends before its first chunk is ready (the shortest over the model's modes)."""
        self.max_num_streams = max_num_streams
        self.max_queue = max_queue
        self.latency = LatencyTarget(target)
        self.max_batch = max_batch or max_num_streams
        self.max_in_flight = max_in_flight
        self.admission = Admission(max_num_streams, sample_rate)
        self.slots = SlotPool(max_num_streams)
        self.table = self.slots.table  # every admitted stream's audio counters, a row per slot
        self.waiting: deque[Sequence] = deque()
        self.active: dict[int, Sequence] = {}
        self._finals: dict[Sequence, None] = {}  # their final came; their last step is not scheduled yet
        self.planner = StepPlanner(self.slots, self.admission, self._finals, sample_rate, self.max_batch,
                                   max_chunks_per_step, lead)
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
            if not self.waiting and self._refusal(seq) is None:
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
                self.slots.close(seq)
                self.admission.live.discard(seq)
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
                    if len(self.planner.in_flight) < self.max_in_flight:
                        step, timeout = self._plan(time.monotonic())
                        if step is not None:
                            return step
                    if self.waiting and self.slots.free:  # the pace's next admissions
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
            seconds = self.planner.done(step, now)
            if not failed:
                if step.predicted_end is not None:
                    self.latency.step_done(now - step.predicted_end)
                oldest = _oldest_since_admission(step)
                late = None if oldest is None else now - oldest > self.latency.target
                self.admission.step_done([max(item.chunks, 1) for item in step], seconds, late,
                                         sum(step.seconds.values()), now)
            newly_failed, changed = [], self._admit_waiting()  # steps measured cheaper may make room
            for item in step:
                seq = item.seq
                seq.in_flight -= 1
                if failed and seq.status not in DEAD:
                    seq.status = Status.FAILED
                    self.slots.close(seq)
                    self.admission.live.discard(seq)
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
    def paused(self) -> Iterator[None]:
        """No step is scheduled while paused: a burst of pushes lands in one step (benchmarks)."""
        with self._cv:
            yield

    def forget_steps(self) -> None:
        """Start the step measurements over: the cost, the busy fraction, the timeline, what was
        proven, the latency figures and whether a chunk came late (after the start-up measurement,
        calibration.py)."""
        with self._cv:
            self.admission.forget()
            self.planner.forget()
            self.latency = LatencyTarget(self.latency.target)

    @property
    def cost(self) -> StepCost:
        """The measured step cost (policy.py), what the plan predicts steps by and admission admits by."""
        return self.admission.cost

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def stats(self) -> dict:
        with self._cv:
            capacity = self.admission.capacity(None)
            return {
                "active": len(self.active),
                "queued": len(self.waiting),
                "free_slots": min(len(self.slots.free), max(0, capacity - len(self.admission.live))),  # admitted now, live
                "capacity": capacity,
                "max_num_streams": self.max_num_streams,
                "max_queue": self.max_queue,
                **self.planner.behind,
            }

    # --- internals (lock held) ----------------------------------------------------------------
    def _plan(self, now: float) -> tuple[Step | None, float | None]:
        return self.planner.plan(now, self.latency.budget)

    def _admit_waiting(self) -> list[Sequence]:
        """Admit waiting streams, first come first served, while they fit; returns every stream whose
        state changed (the admitted, and the rest of the queue, whose positions moved)."""
        admitted = []
        while self.waiting and self._refusal(self.waiting[0]) is None:
            nxt = self.waiting.popleft()
            self._admit(nxt)
            admitted.append(nxt)
        if admitted:
            self._cv.notify_all()
        self.admission.tell_why(self._refusal(self.waiting[0]) if self.waiting else None, len(self.waiting))
        return admitted + (list(self.waiting) if admitted else [])

    def _refusal(self, seq: Sequence) -> str | None:
        return self.admission.refusal(seq, len(self.slots.free))

    def _admit(self, seq: Sequence) -> None:
        self.admission.admitted(seq)
        seq.admitted_at = time.monotonic()
        seq.status = Status.FINALIZING if seq.final_at is not None else Status.RUNNING
        self.active[seq.stream_id] = seq
        self.slots.take(seq)  # with what it sent while it waited

    def _release(self, seq: Sequence) -> list[Sequence]:
        """Free the stream's slot and admit waiting streams; returns every stream whose state changed."""
        self.slots.give_back(seq)
        self._finals.pop(seq, None)
        if seq.status is Status.FINALIZING:
            seq.status = Status.FINISHED
        self.active.pop(seq.stream_id, None)
        self.admission.live.discard(seq)
        self._cv.notify_all()
        return self._admit_waiting()


def _oldest_since_admission(step: Step) -> float | None:
    """The arrival of the step's oldest live chunk that arrived after its stream's admission (None:
    none did). Chunks that arrived while their stream waited for a slot are late by the wait, not
    by the engine: a stream admitted with seconds of them catches up over several steps, and
    counting them, or their admission's time, as late held every admission back for BEHIND_HOLD
    while the streams still waiting grew backlogs of their own (at 2,048 streams, seconds of them)."""
    oldest = None
    for item in step:
        times = item.ready_times
        if times and not item.seq.bulk and times[-1] >= item.seq.admitted_at:
            first = times[bisect.bisect_left(times, item.seq.admitted_at)]
            oldest = first if oldest is None else min(oldest, first)
    return oldest

