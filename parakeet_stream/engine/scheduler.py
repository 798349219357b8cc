"""Admission (a bounded waiting queue in front of the active set) and the pool of cache slots.

Encoder caches and decoder states of every slot are allocated once, as `[layers, slots, ...]`
tensors; a stream holds a slot index while it is active and the slot is zeroed on release.
"""

from __future__ import annotations

import threading
from collections import deque

import torch

from ..conformer import EncoderCache
from ..model import ParakeetModel
from ..rnnt import DecoderState
from .sequence import Sequence, Status


class QueueFullError(RuntimeError):
    pass


class Scheduler:
    def __init__(self, model: ParakeetModel, max_num_streams: int, max_queue: int, device, dtype):
        self.max_num_streams = max_num_streams
        self.max_queue = max_queue
        self.cache = EncoderCache.zeros(model.cfg.encoder, max_num_streams, device, dtype)
        start = model.decoder.initial_state(1, device, dtype)
        self._start_state = start
        self.decoder = DecoderState(
            start.h.repeat(1, max_num_streams, 1), start.c.repeat(1, max_num_streams, 1), start.g.repeat(max_num_streams, 1)
        )
        self.free: deque[int] = deque(range(max_num_streams))
        self.waiting: deque[Sequence] = deque()
        self.active: dict[int, Sequence] = {}
        self.lock = threading.Lock()

    def add(self, seq: Sequence) -> bool:
        """Admit now (True) or queue (False); raises QueueFullError when the waiting queue is full."""
        with self.lock:
            if self.free and not self.waiting:
                self._admit(seq)
                return True
            if len(self.waiting) >= self.max_queue:
                raise QueueFullError("the waiting queue is full")
            self.waiting.append(seq)
            return False

    def position(self, seq: Sequence) -> int:
        with self.lock:
            if seq.status is not Status.WAITING:
                return 0
            try:
                return self.waiting.index(seq) + 1
            except ValueError:
                return 0

    def remove_waiting(self, seq: Sequence) -> list[Sequence]:
        """Drop a queued stream; returns the streams whose position changed."""
        with self.lock:
            if seq not in self.waiting:
                return []
            i = self.waiting.index(seq)
            self.waiting.remove(seq)
            return list(self.waiting)[i:]

    def release(self, seq: Sequence) -> list[Sequence]:
        """Free the stream's slot and admit waiting streams; returns every stream whose state changed."""
        with self.lock:
            if seq.slot is None:
                return []
            slot = seq.slot
            self._reset(slot)
            seq.slot = None
            seq.status = Status.DONE
            self.active.pop(seq.stream_id, None)
            self.free.append(slot)
            admitted = []
            while self.free and self.waiting:
                nxt = self.waiting.popleft()
                self._admit(nxt)
                admitted.append(nxt)
            return admitted + (list(self.waiting) if admitted else [])

    def _admit(self, seq: Sequence) -> None:
        seq.slot = self.free.popleft()
        seq.status = Status.ACTIVE
        self.active[seq.stream_id] = seq

    def _reset(self, slot: int) -> None:
        idx = torch.tensor([slot], device=self.cache.length.device)
        self.cache.reset(idx)
        self.decoder.h[:, slot] = self._start_state.h[:, 0]
        self.decoder.c[:, slot] = self._start_state.c[:, 0]
        self.decoder.g[slot] = self._start_state.g[0]

    def stats(self) -> dict:
        with self.lock:
            return {
                "active": len(self.active),
                "queued": len(self.waiting),
                "free_slots": len(self.free),
                "max_num_streams": self.max_num_streams,
            }
