"""One stream's audio inbox: the samples client threads push, and which chunks they make ready
(its counters a row of a StreamTable)."""

from __future__ import annotations

import time

import numpy as np

from ..model.conformer import ChunkSpec
from .stream_table import StreamTable


class SampleBuffer:
    """Contiguous float32 samples with amortised growth: one array per stream, never one per push.
    Taking hands out a view and moves a start mark: nothing is ever written before that mark again
    (a push that needs room moves the samples left into a new array), so what was taken stays as
    it was without a copy (the framing keeps a view of its last samples until the next step)."""

    def __init__(self) -> None:
        self._buf = np.empty(4096, np.float32)
        self._start = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, samples: np.ndarray) -> None:
        end = self._start + self._len
        if end + samples.size > self._buf.size:
            need = self._len + samples.size
            grown = np.empty(max(need, 2 * self._buf.size) if need > self._buf.size // 2 else self._buf.size, np.float32)
            grown[: self._len] = self._buf[self._start : end]
            self._buf, self._start, end = grown, 0, self._len
        self._buf[end : end + samples.size] = samples
        self._len += samples.size

    def take(self, n: int | None = None) -> np.ndarray:
        """The oldest `n` samples (all when None), as a view that stays valid."""
        n = self._len if n is None else min(n, self._len)
        out = self._buf[self._start : self._start + n]
        self._start += n
        self._len -= n
        if self._len == 0 and self._buf.size > 1 << 16:  # give back what a backlog grew
            self._buf, self._start = np.empty(4096, np.float32), 0
        return out


class Inbox:
    """A stream's audio: its samples (a SampleBuffer) and its counters, a row of a StreamTable
    (stream_table.py). Until admission the row is in a table of its own; the Scheduler moves it
    into its slot's row of the shared table (`move_to`) and back out when the slot is released
    (`move_out`). Client threads add (`add`, or the engine's `push_many`); the Scheduler takes ready
    chunks from the table, the pre-encode stage samples; all under the table's one lock.

    A chunk is ready once the samples whose log-mel frames reach its end (ChunkSpec.frames_through)
    arrived; the pre-encode stage cuts it by the same frame count.
    """

    def __init__(self, spec: ChunkSpec, hop: int, n_fft: int):
        self.spec = spec
        self._hop = hop
        self._tail = n_fft - n_fft // 2  # the centred STFT's frame f ends at sample f * hop + _tail
        self.samples = SampleBuffer()
        self.table, self.row = StreamTable(1), 0
        first, more = self.readiness
        self.table.first[0], self.table.every[0] = first, more

    @property
    def readiness(self) -> tuple[int, int]:
        """(samples that make the first chunk ready, samples each later chunk adds): the engine can
        do nothing with a stream's samples short of its next chunk (engine/ipc/engine_client.py holds them)."""
        return self.samples_for(0), self.samples_for(1) - self.samples_for(0)

    @property
    def chunk_samples(self) -> int:
        """Samples of audio per chunk after the first: how often the stream needs a step."""
        return self.spec.chunk_frames * self._hop

    @property
    def chunks_ready(self) -> int:
        return self.table.ready[self.row]

    @property
    def chunks_taken(self) -> int:
        """Ready chunks the Scheduler took (scheduled)."""
        return self.table.taken[self.row]

    @property
    def samples_in(self) -> int:
        return self.table.samples_in[self.row]

    def samples_for(self, chunk: int) -> int:
        """Samples a stream needs before its chunk `chunk` (0-based) is ready, lookahead included."""
        return (self.spec.frames_through(chunk) - 1) * self._hop + self._tail

    # --- client threads -------------------------------------------------------------------
    def add(self, samples: np.ndarray) -> bool:
        """Append samples; True when they made a chunk ready (only then is there news for the Scheduler)."""
        now = time.monotonic()
        while True:
            table = self.table
            with table.lock:
                if table is self.table:  # (not moved meanwhile)
                    self.samples.append(samples)
                    return table.push(self.row, samples.size, now)

    # --- the Scheduler ------------------------------------------------------------------------
    def move_to(self, table: StreamTable, row: int) -> None:
        """Into `table`'s row `row` (admission: its slot's), counters and arrival times with it."""
        old = self.table
        with old.lock, table.lock:
            old.copy_row(self.row, table, row)
            self.table, self.row = table, row

    def move_out(self) -> None:
        """Out of the shared table into one of its own (its slot is released: the row goes to another)."""
        self.move_to(StreamTable(1), 0)

    # --- the pre-encode stage ---------------------------------------------------------------
    def take_samples(self, upto: int | None = None) -> np.ndarray:
        """Samples not taken yet, up to the `upto`-th of the stream (all when None)."""
        with self.table.lock:
            return self.take_samples_locked(upto)

    def take_samples_locked(self, upto: int | None) -> np.ndarray:
        """take_samples with the table's lock held (a step takes every stream's under one)."""
        taken = self.table.samples_in[self.row] - len(self.samples)
        return self.samples.take(None if upto is None else max(0, upto - taken))


def take_step_samples(inboxes: list[Inbox], upto: list[int | None]) -> list[np.ndarray]:
    """take_samples of a step's streams, under one lock: every stream of a step is admitted, its
    row in the Scheduler's table (one not there takes its own)."""
    if not inboxes:
        return []
    table = inboxes[0].table
    with table.lock:
        got = [inbox.take_samples_locked(n) if inbox.table is table else None for inbox, n in zip(inboxes, upto)]
    return [inbox.take_samples(n) if out is None else out for inbox, n, out in zip(inboxes, upto, got)]


def push_many(inboxes: list[Inbox], packets: list[np.ndarray], table: StreamTable) -> bool:
    """Inbox.add of many streams' packets at once: those in `table` (admitted) under one lock, the
    others one by one. True when any chunk became ready."""
    now, ready, rest = time.monotonic(), False, []
    with table.lock:
        for inbox, samples in zip(inboxes, packets):
            if inbox.table is table:
                inbox.samples.append(samples)
                ready |= table.push(inbox.row, samples.size, now)
            else:
                rest.append((inbox, samples))
    for inbox, samples in rest:
        ready |= inbox.add(samples)
    return ready
