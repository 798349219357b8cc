"""The batching policy: when to run the next step and which streams' chunks go in it.

Every chunk has a deadline: the arrival of the last sample it needs plus the latency budget.
A step's cost grows slowly with its batch (a step is mostly reading the weights). While a
step runs, whatever arrives batches into the next one by itself; when the model falls idle
under load, it pays to hold a ready chunk until the other streams' chunks, due shortly, can
share its step, as long as the earliest deadline still holds. Under light load nothing waits.
Pure functions of their inputs, so the policy is tested on a simulated clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

GRACE = 0.005  # arrivals are predicted from real-time pacing: allow this much jitter
# An idle model waits for due chunks only between these busy fractions: below, there is no
# need; above, the model has no idle time to trade for bigger steps (measured on CPU: waiting
# there raised p95 latency 2-3x at 8 streams; see docs/performance.md).
LOADED, SATURATED = 0.5, 0.8


class StepCost:
    """Measured seconds of a whole step by batch size (moving average), to predict steps not yet run."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._seconds: dict[int, float] = {}

    def record(self, batch: int, seconds: float) -> None:
        old = self._seconds.get(batch)
        self._seconds[batch] = seconds if old is None else old + self.alpha * (seconds - old)

    def __call__(self, batch: int) -> float:
        if batch <= 0 or not self._seconds:
            return 0.0
        if batch in self._seconds:
            return self._seconds[batch]
        lower = max((b for b in self._seconds if b < batch), default=None)
        upper = min((b for b in self._seconds if b > batch), default=None)
        if upper is None:  # beyond what was measured: no cheaper per stream than the largest batch
            return self._seconds[lower] * batch / lower
        if lower is None:  # a smaller batch costs at most what a larger one did
            return self._seconds[upper]
        lo, hi = self._seconds[lower], self._seconds[upper]
        return lo + (hi - lo) * (batch - lower) / (upper - lower)


@dataclass
class Ready(Generic[T]):
    ready_at: float  # arrival of the last sample its oldest unscheduled chunk needs
    item: T


def plan(ready: list[Ready[T]], upcoming: list[float], now: float, cost: StepCost, budget: float,
         max_batch: int, align: bool) -> tuple[list[T], float | None]:
    """Decide the next step.

    ready: streams with a ready chunk; upcoming: predicted times at which the other
    running streams' next chunks are ready; align: hold ready chunks for due ones (the scheduler asks for it
    when the model is idle but loaded: with a step running, what arrives meanwhile batches anyway).
    Returns (streams to run now, None), or ([], seconds to wait before deciding again); with
    nothing ready, ([], None): wait for an arrival.
    """
    if not ready:
        return [], None
    ready = sorted(ready, key=lambda r: r.ready_at)  # earliest deadline first
    batch = [r.item for r in ready[:max_batch]]
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
