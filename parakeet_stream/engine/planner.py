"""The Scheduler's step planning: what the model runs next, and the Timeline of the steps in flight.

`plan` asks the policy (policy.py) which streams' chunks make the next step, given the ready work,
the live streams' pacing and when the model is predicted to be free; it cuts the chosen chunks from
the stream table into a Step and adds the step's predicted cost to the timeline. `done` takes a
step back and settles the timeline to what is measured. It runs under the Scheduler's lock.
"""

from __future__ import annotations

from .admission import Admission
from .policy import LOADED, SATURATED, Ready, Situation, Timeline, decide
from .sequence import Sequence, Status
from .slots import SlotPool
from .step import Step, StepItem


class StepPlanner:
    def __init__(self, slots: SlotPool, admission: Admission, finals: dict[Sequence, None], sample_rate: int,
                 max_batch: int, max_chunks_per_step: int, lead: float):
        """finals: the streams whose final came and whose last step is not planned yet (the Scheduler's)."""
        self.slots, self.table, self.admission, self.finals = slots, slots.table, admission, finals
        self.sample_rate, self.max_batch, self.max_chunks_per_step, self.lead = sample_rate, max_batch, max_chunks_per_step, lead
        self.in_flight: list[Step] = []
        self.forget()

    def forget(self) -> None:
        self.last_done = 0.0  # when the last step was done
        self.timeline = Timeline()  # when the steps in flight are predicted to be done
        # the live streams' backlog at the last plan, for `stats` (worked out per plan, not per call: a
        # queued client's every position update asks for the stats)
        self.behind = _behind([], 0.0)

    def plan(self, now: float, budget: float) -> tuple[Step | None, float | None]:
        """The next step by the policy, or (None, seconds to wait before deciding again)."""
        ready, backlogs = self.slots.with_work(self.finals)
        self.behind = _behind(ready, now)
        loaded = not self.in_flight and LOADED <= self.admission.busy_fraction(now) < SATURATED
        # the other live streams matter only to hold ready chunks for them, or to fit bulk work around them
        upcoming, live_streams = self.slots.upcoming(self.sample_rate) if backlogs or (loaded and 0 < len(ready) < self.max_batch) else ([], 0)
        cost = self.admission.cost
        chosen, timeout = decide(Situation(
            ready, upcoming, backlogs, live_streams, now, self.timeline, cost, budget, self.max_batch,
            self.max_chunks_per_step, loaded, live_in_flight=any(map(_has_live, self.in_flight)), lead=self.lead,
            busy=bool(self.in_flight)))
        if not chosen:
            return None, timeout
        step = self._make_step(chosen, now)
        # its oldest work's arrival, as the plan saw it: the first ready chunk taken, or the final
        live = [(item.ready_times[0] if item.ready_times else item.final_at, item.chunks) for item in step
                if not item.seq.bulk]
        step.predicted_seconds = self.timeline.add(live, [item.chunks for item in step], now, cost)
        if live and cost.measured:  # (unmeasured, a step is predicted to cost nothing)
            step.predicted_end = self.timeline.free_at
        return step, None

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
                    self.slots.close(seq)
                    self.finals.pop(seq, None)
                seq.in_flight += 1
                items.append(StepItem(seq, slot, len(times), last, first, times, seq.final_at, upto))
        step = Step(items, now)
        self.in_flight.append(step)
        return step

    def done(self, step: Step, now: float) -> float:
        """The step is back (done or failed): the model's seconds for it, from scheduling or from the
        end of the step before it if it queued behind one, to results, as the Timeline adds steps end
        to end (the wait is the step before's)."""
        self.in_flight = [s for s in self.in_flight if s is not step]
        seconds = now - max(step.started, self.last_done)
        self.last_done = now
        self.timeline.settle(now, sum(s.predicted_seconds for s in self.in_flight))
        return seconds


def _behind(ready: list[Ready], now: float) -> dict:
    """How far behind the live streams are at a plan (an overloaded server's edges, for operators):
    those with more than one chunk waiting, the most chunks one has waiting, and how long the oldest
    waiting chunk has waited."""
    return {"streams_behind": sum(r.chunks > 1 for r in ready),
            "longest_backlog_chunks": max((r.chunks for r in ready), default=0),
            "oldest_chunk_wait_s": round(max(0.0, now - min((r.ready_at for r in ready), default=now)), 3)}


def _has_live(step: Step) -> bool:
    return any(not item.seq.bulk for item in step)
