"""The slot pool (nano-vllm's BlockManager): which stream holds each slot, the free slots, and the
stream table whose rows are the slots (stream_table.py).

A slot is a row of every per-stream pool on the model's side (the encoder caches, the front ends'
frames, the decoder states) and of the stream table. The Scheduler takes and gives back slots
under its lock; the pool also answers its two questions about the table: which streams have work
now, and when the others' next chunks are due.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .policy import Backlog, Ready
from .sequence import Sequence
from .stream_table import StreamTable


class SlotPool:
    def __init__(self, slots: int):
        self.free: deque[int] = deque(range(slots))
        self.table = StreamTable(slots)
        self._holder: list[Sequence | None] = [None] * slots

    def take(self, seq: Sequence) -> None:
        """Give `seq` a free slot; its inbox's counters (what it sent while it waited) move into the slot's row."""
        slot = self.free.popleft()
        seq.slot = slot
        seq.inbox.move_to(self.table, slot)
        self._holder[slot] = seq
        table = self.table
        table.open[slot], table.bulk[slot], table.finalizing[slot] = True, seq.bulk, seq.final_at is not None

    def give_back(self, seq: Sequence) -> None:
        table, slot = self.table, seq.slot
        table.open[slot] = table.finalizing[slot] = False
        seq.inbox.move_out()  # a push that comes now lands in its own table, not in the row's next stream's
        self._holder[slot] = None
        self.free.append(slot)
        seq.slot = None

    def close(self, seq: Sequence) -> None:
        """No more steps are planned for `seq` (dead, or its last step scheduled); it keeps its slot."""
        self.table.open[seq.slot] = False

    def with_work(self, finals: dict[Sequence, None]) -> tuple[list[Ready], list[Backlog[Sequence]]]:
        """Live streams with a ready chunk (or their final), and bulk streams with work: the rows of
        the table with a ready chunk not taken, found at once, then the `finals` with nothing else left."""
        table, holder = self.table, self._holder
        ready, backlogs = [], []
        with table.lock:
            times, got, taken = table.times, table.ready, table.taken
            for row in table.with_work().tolist():
                seq = holder[row]
                if seq.bulk:
                    backlogs.append(Backlog(times[row][0], got[row] - taken[row], seq))
                else:
                    ready.append(Ready(times[row][0], seq, got[row] - taken[row]))
            for seq in finals:  # (few: those whose final came) with only their last, partial chunk left
                slot = seq.slot
                if slot is not None and table.open[slot] and got[slot] == taken[slot]:
                    (backlogs.append(Backlog(seq.final_at, 0, seq)) if seq.bulk
                     else ready.append(Ready(seq.final_at, seq, 0)))
        return ready, backlogs

    def upcoming(self, sample_rate: int) -> tuple[list[float], int]:
        """The predicted arrivals of the next chunks of live streams without a ready one, and how many
        live streams are running: a look at every row of the table."""
        table = self.table
        live = table.open & ~table.bulk
        with table.lock:
            quiet = np.flatnonzero(live & ~table.pending & table.started & ~table.finalizing)
            due = table.due(quiet, sample_rate)
        return due.tolist(), int(live.sum())
