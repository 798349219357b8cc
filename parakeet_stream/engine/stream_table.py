"""Every admitted stream's audio counters as columns, one row per slot (as vLLM v1's InputBatch
keeps its requests' state): what pushes write and what the Scheduler reads at every plan.

A push adds to its row's sample count and works out, in closed form, how many chunks its samples
make ready (chunk k is ready once `first + k * every` samples came), noting each new chunk's
arrival (its latency's start); a plan finds every stream with a ready chunk by one comparison over
the table, however many streams there are. A stream waiting for a slot has a table of one row of
its own (inbox.py), moved into its slot's row at admission and out again when the slot is
released, so a push never writes into a row another stream holds. One lock guards the table and
the streams' sample buffers (inbox.py): a push takes it once, a plan once, a step's samples once.

The counters a push writes are Python lists, not arrays: a push touches one row, and a NumPy
element costs several times a list's (measured: a service's pushes, a few streams a message, were
a third slower with arrays). The two flags a plan reads over every row (a chunk ready and not taken,
one ever ready) are arrays, written only by a push that makes a chunk ready and by a take.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


class StreamTable:
    def __init__(self, rows: int) -> None:
        self.lock = threading.Lock()
        self.first = [0] * rows  # samples that make chunk 0 ready
        self.every = [1] * rows  # samples each later chunk adds
        self.samples_in = [0] * rows
        self.ready = [0] * rows  # chunks ready
        self.taken = [0] * rows  # chunks the Scheduler took
        self.times: list[deque[float]] = [deque() for _ in range(rows)]  # arrival of each ready chunk not taken
        self.arrival = [0.0] * rows  # the last push's time
        self.packet = [0] * rows  # the last push's samples (the client's packet)
        # ready > taken, and ready > 0, kept as arrays so that a plan finds its rows without
        # converting the counters (it plans at every push that makes a chunk ready)
        self.pending = np.zeros(rows, bool)
        self.started = np.zeros(rows, bool)
        # the Scheduler's: a row it plans for (admitted, not dead, last step not scheduled), live or bulk
        self.open = np.zeros(rows, bool)
        self.bulk = np.zeros(rows, bool)
        self.finalizing = np.zeros(rows, bool)

    # --- pushes (lock held) -------------------------------------------------------------------
    def push(self, row: int, samples: int, now: float) -> bool:
        """`samples` more for `row`, arrived `now`; True when they made a chunk ready."""
        total = self.samples_in[row] + samples
        self.samples_in[row] = total
        self.arrival[row] = now
        if samples:
            self.packet[row] = samples
        first = self.first[row]
        if total < first:
            return False
        ready, before = (total - first) // self.every[row] + 1, self.ready[row]
        if ready == before:
            return False
        self.ready[row] = ready
        self.pending[row] = self.started[row] = True
        self.times[row].extend([now] * (ready - before))
        return True

    # --- the Scheduler (lock held) ---------------------------------------------------------------
    def with_work(self) -> np.ndarray:
        """Rows with a ready chunk not taken, that the Scheduler plans for."""
        return np.flatnonzero(self.open & self.pending)

    def take(self, row: int, n: int) -> list[float]:
        """Arrival times of the next `n` ready chunks of `row` (at most those ready), taken."""
        times = self.times[row]
        n = min(n, len(times))
        self.taken[row] += n
        if n == len(times):  # (nearly always: a step takes every ready chunk of a live stream)
            self.pending[row] = False
            out = list(times)
            times.clear()
            return out
        return [times.popleft() for _ in range(n)]

    def due(self, rows: np.ndarray, sample_rate: int) -> np.ndarray:
        """When each row's next chunk will be ready at real-time pacing in packets the size of its last
        one (the caller passes rows with a chunk ready before and none now): the arrival of the packet
        that holds the chunk's last sample."""
        at = rows.tolist()
        first, every, ready, got, packet, arrival = (np.array([column[r] for r in at]) for column in (
            self.first, self.every, self.ready, self.samples_in, self.packet, self.arrival))
        packet = np.maximum(packet, 1)
        return arrival + np.maximum(0, -(-(first + ready * every - got) // packet)) * packet / sample_rate

    # --- rows ----------------------------------------------------------------------------------
    def copy_row(self, row: int, into: StreamTable, at: int) -> None:
        """Row `row`'s audio counters into `into`'s row `at` (both locks held)."""
        for name in ("first", "every", "samples_in", "ready", "taken", "times", "arrival", "packet", "pending", "started"):
            getattr(into, name)[at] = getattr(self, name)[row]
