"""The latency target: the operator's p95 promise and the share of it the Scheduler may plan with.

`--latency-target` is a p95 promise on a live chunk's whole path, from the arrival of the last
sample it needs to its result reaching the client: queue, pre-encode, encode (behind the step in
flight), decode, publish, and the server taking the result to its client. The Scheduler predicts
the part up to publishing (StepCost's measured steps, started when the Timeline says the model is
free: policy.py); two things that prediction does not hold are learned here, online:
- delivery: the time from a result's publishing to the server taking it (`ASREngine.collect`);
- the prediction's error: how much later than predicted a step with live chunks was done.
The budget the policy plans with (a chunk's deadline is its last sample's arrival plus the
budget) is the target less the 95th percentile of each; a step planned to end by its deadline
then delivers in time at p95 even where steps vary, instead of landing on the target on average.
The budget never goes below half the target: beyond that load nothing is held for batching
anyway, and bulk work keeps some room.
"""

from __future__ import annotations

import bisect
from collections import deque

# What voice agents need: a person answers within 200-300 ms of the other's turn ending, and an
# agent's reply (transcript, language model's first words, speech's first audio) should start
# within ~1 s; the transcript's share of that is about a third.
DEFAULT_TARGET = 0.3
QUANTILE = 95
WINDOW = 256  # recent measurements the percentiles are taken over


class LatencyTarget:
    def __init__(self, target: float = DEFAULT_TARGET, window: int = WINDOW):
        if target <= 0:
            raise ValueError(f"the latency target must be above 0 seconds, got {target}")
        self.target = target
        self._delivery, self._errors = Recent(window), Recent(window)
        self._taken: deque[float] = deque(maxlen=window)  # deliveries not yet in `_delivery`

    def delivered(self, seconds: float) -> None:
        """A live stream's results were taken `seconds` after they were published. Any thread, without
        the Scheduler's lock (every client's results, thousands a second): kept aside until read."""
        self._taken.append(seconds)

    def step_done(self, late: float) -> None:
        """A step with live chunks was done `late` seconds after its predicted end (negative: early)."""
        self._errors.append(late)

    @property
    def delivery(self) -> float:
        while self._taken:
            self._delivery.append(self._taken.popleft())
        return self._delivery.high()

    @property
    def margin(self) -> float:
        return self._errors.high()

    def figures(self) -> dict[str, float]:
        """Seconds: the target, its parts learned so far, and the budget left for the step."""
        return {"target": self.target, "delivery_p95": self.delivery, "margin_p95": self.margin, "budget": self.budget}

    @property
    def budget(self) -> float:
        """Read once per plan; learned from thousands of deliveries a second, so worked out here."""
        return max(self.target - self.delivery - self.margin, self.target / 2)


class Recent:
    """The last `window` measurements, kept sorted too: their 95th percentile in microseconds, not
    numpy's tens (it is read at every result a server takes, thousands a second)."""

    def __init__(self, window: int):
        self._order: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def append(self, value: float) -> None:
        if len(self._order) == self._order.maxlen:
            self._sorted.pop(bisect.bisect_left(self._sorted, self._order[0]))
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def high(self) -> float:
        """The 95th percentile (numpy's linear interpolation), at least 0 (0 until something was measured)."""
        values = self._sorted
        if not values:
            return 0.0
        at = QUANTILE / 100 * (len(values) - 1)
        low = int(at)
        high = values[min(low + 1, len(values) - 1)]
        return max(values[low] + (high - values[low]) * (at - low), 0.0)
