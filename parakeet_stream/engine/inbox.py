"""One stream's audio inbox: the samples client threads push, and which chunks they make ready."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ..model.conformer import ChunkSpec


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
    """Written by the client threads (`add`), under its lock. The others only take what was
    added: the Scheduler the arrival times of ready chunks, the pre-encode stage the samples.
    The Scheduler reads without the lock (it looks at every stream at every step): only it takes
    arrival times out, so one it saw stays there, and a prediction made from fields a push is
    halfway through changing is only a wake-up a little early or late.

    A chunk is ready once the samples whose log-mel frames reach its end (ChunkSpec.frames_through)
    arrived; the pre-encode stage cuts it by the same frame count. A push that makes one ready calls
    `on_ready` (set by the Scheduler at admission: it then looks at this stream at its next plan).
    """

    def __init__(self, spec: ChunkSpec, hop: int, n_fft: int):
        self.spec = spec
        self._hop = hop
        self._tail = n_fft - n_fft // 2  # the centred STFT's frame f ends at sample f * hop + _tail
        self._samples = SampleBuffer()
        self._ready_times: deque[float] = deque()  # arrival of the sample making each chunk ready, not yet taken
        self.samples_in = 0
        self._last_arrival = 0.0
        self._last_push = 0  # samples of the last add: the client's packet
        self.chunks_ready = 0
        self._next_ready = self.samples_for(0)  # samples that make the next chunk ready
        self._lock = threading.Lock()
        self.on_ready: Callable[[], None] | None = None  # called as a chunk becomes ready (the Scheduler's mark)

    @property
    def readiness(self) -> tuple[int, int]:
        """(samples that make the first chunk ready, samples each later chunk adds): the engine can
        do nothing with a stream's samples short of its next chunk (engine/client.py holds them)."""
        return self.samples_for(0), self.samples_for(1) - self.samples_for(0)

    @property
    def chunk_samples(self) -> int:
        """Samples of audio per chunk after the first: how often the stream needs a step."""
        return self.spec.chunk_frames * self._hop

    def samples_for(self, chunk: int) -> int:
        """Samples a stream needs before its chunk `chunk` (0-based) is ready, lookahead included."""
        return (self.spec.frames_through(chunk) - 1) * self._hop + self._tail

    # --- client threads -------------------------------------------------------------------
    def add(self, samples: np.ndarray) -> bool:
        """Append samples; True when they made a chunk ready (only then is there news for the Scheduler)."""
        now = time.monotonic()
        with self._lock:
            self._samples.append(samples)
            self.samples_in += samples.size
            self._last_arrival = now
            self._last_push = samples.size or self._last_push
            before = self.chunks_ready
            while self.samples_in >= self._next_ready:
                self.chunks_ready += 1  # before its time: the Scheduler never sees more times than chunks
                self._ready_times.append(now)
                self._next_ready = self.samples_for(self.chunks_ready)
            if self.chunks_ready == before:
                return False
        if self.on_ready is not None:
            self.on_ready()
        return True

    # --- the Scheduler ----------------------------------------------------------------------
    def next_chunk(self, sample_rate: int) -> tuple[float | None, float | None]:
        """(arrival time of the oldest ready chunk not taken yet, None); with none ready, (None,
        when the next one will be, at real-time pacing in packets the size of the last one, or None
        before the first one). A chunk comes with the packet that holds its last sample, so the
        prediction is the arrival of that packet, not of the sample."""
        if self._ready_times:
            return self._ready_times[0], None
        if not self.chunks_ready:
            return None, None
        push = self._last_push
        packets = max(0, -(-(self._next_ready - self.samples_in) // push))
        return None, self._last_arrival + packets * push / sample_rate

    def take_ready(self, n: int) -> list[float]:
        """Arrival times of the next `n` ready chunks (the Scheduler schedules them)."""
        times = self._ready_times
        if n >= len(times):  # (nearly always: a step takes every ready chunk of a live stream)
            out = list(times)
            for _ in out:  # popleft, not clear(): a push may append meanwhile
                times.popleft()
            return out
        return [times.popleft() for _ in range(n)]

    # --- the pre-encode stage ---------------------------------------------------------------
    def take_samples(self, upto: int | None = None) -> np.ndarray:
        """Samples not taken yet, up to the `upto`-th of the stream (all when None)."""
        with self._lock:
            taken = self.samples_in - len(self._samples)
            return self._samples.take(None if upto is None else max(0, upto - taken))
