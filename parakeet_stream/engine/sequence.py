"""One stream's data: its lifecycle state, its arriving samples, its streaming leftovers, its results.

A Sequence holds state; behaviour lives with its owner. The Scheduler alone changes `status`,
`slot` and `in_flight`; client threads append samples; the pre-encode stage owns the framing
and chunking leftovers; the decode stage owns the token bookkeeping.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..model.conformer import ChunkSpec
from ..model.features import FeatureStream
from ..model.tokenizer import IncrementalDetokenizer
from .results import MAX_PENDING_RESULTS, StreamResult


class Status(enum.Enum):
    WAITING = "waiting"  # queued for a slot
    RUNNING = "running"  # holds a slot, takes audio
    ENDING = "ending"  # final requested: the rest of its audio is being transcribed
    CANCELLED = "cancelled"  # the client left; in-flight work is dropped
    FAILED = "failed"  # a model stage raised on its batch
    FINISHED = "finished"  # slot released


class SampleBuffer:
    """Contiguous float32 samples with amortised growth: one array per stream, never one per push."""

    def __init__(self) -> None:
        self._buf = np.empty(4096, np.float32)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, samples: np.ndarray) -> None:
        need = self._len + samples.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size), np.float32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : need] = samples
        self._len = need

    def take(self, n: int | None = None) -> np.ndarray:
        """The oldest `n` samples (all when None); the rest move to the front."""
        n = self._len if n is None else min(n, self._len)
        out = self._buf[:n].copy()
        rest = self._len - n
        if rest == 0 and self._buf.size > 1 << 16:  # give back what a backlog grew
            self._buf = np.empty(4096, np.float32)
        else:
            self._buf[:rest] = self._buf[n : self._len]
        self._len = rest
        return out


@dataclass(eq=False)  # identity: a stream is itself, not its field values
class Sequence:
    stream_id: int
    lookahead: tuple[int, int]
    spec: ChunkSpec
    frames: FeatureStream
    detok: IncrementalDetokenizer
    n_mels: int
    hop: int
    n_fft: int
    # lifecycle, written by the Scheduler only
    status: Status = Status.WAITING
    slot: int | None = None
    in_flight: int = 0  # scheduled steps not yet finished
    chunks_scheduled: int = 0
    end_scheduled: bool = False
    # audio, written by client threads under `lock`
    samples: SampleBuffer = field(default_factory=SampleBuffer)
    samples_in: int = 0
    last_arrival: float = 0.0
    chunks_complete: int = 0
    ready_times: deque = field(default_factory=deque)  # arrival time of the sample completing each chunk
    final_at: float | None = None
    # pre-encode leftovers (pre-encode stage)
    mel: torch.Tensor | None = None  # features not yet cut into chunks
    history: torch.Tensor | None = None  # last `pre_cache` frames: the pre-encode cache
    chunks_cut: int = 0
    # token bookkeeping (decode stage)
    frames_decoded: int = 0
    last_token_frame: int = -1
    utterance_has_tokens: bool = False
    # delivery
    results: deque = field(default_factory=deque)
    listeners: list[Callable[[], None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- audio (client threads) -----------------------------------------------------
    def add_samples(self, samples: np.ndarray) -> bool:
        """Append samples; True when they completed a chunk (only then is there news for the Scheduler)."""
        now = time.monotonic()
        with self.lock:
            self.samples.append(samples)
            self.samples_in += samples.size
            self.last_arrival = now
            before = self.chunks_complete
            while self.samples_in >= self.samples_for(self.chunks_complete):
                self.ready_times.append(now)
                self.chunks_complete += 1
            return self.chunks_complete > before

    def samples_for(self, chunk: int) -> int:
        """Samples a stream needs before its chunk `chunk` (0-based) is complete (lookahead included)."""
        frames = self.spec.first_frames + chunk * self.spec.chunk_frames
        return (frames - 1) * self.hop + self.n_fft // 2

    def take_samples(self, upto: int | None = None) -> torch.Tensor:
        """Samples not taken yet, up to the `upto`-th of the stream (all when None)."""
        with self.lock:
            taken = self.samples_in - len(self.samples)
            return torch.from_numpy(self.samples.take(None if upto is None else max(0, upto - taken)))

    def take_ready(self, n: int) -> list[float]:
        """Arrival times of the next `n` complete chunks (the Scheduler schedules them)."""
        with self.lock:
            return [self.ready_times.popleft() for _ in range(min(n, len(self.ready_times)))]

    # --- results ----------------------------------------------------------------------
    def publish(self, result: StreamResult) -> None:
        with self.lock:
            if len(self.results) >= MAX_PENDING_RESULTS:
                self.results[-1].merge(result)
            else:
                self.results.append(result)
        self.notify()

    def take_results(self) -> list[StreamResult]:
        with self.lock:
            out = list(self.results)
            self.results.clear()
            return out

    def notify(self) -> None:
        with self.lock:
            listeners = list(self.listeners)
        for fn in listeners:
            fn()
