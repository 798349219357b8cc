"""EngineStream: one client audio stream through the engine, as every door holds it.

The one place for what each door needs around the engine's stream API (engine/ipc/engine_client.py or the
ASREngine itself): the audio received but not pushed yet (one contiguous buffer: a queued stream
holds one bytearray, never one object per message), pushes of at least MIN_PUSH_SECONDS once it
holds a slot, the budget of audio not yet consumed (here and in the engine), the time limit,
admission, collecting results (which say how much audio the engine consumed), and release. It
neither waits nor knows an event loop: the door passes `wake`, which the engine's side calls (from
another thread) on every result and queue change, and waits its own way (trio for the WebSocket and
TCP doors and the file feed, asyncio for gRPC). A WebSocket or TCP connection's Segment
(segments.py) is an EngineStream, with what the connection counts in it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...engine import EngineError

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ...engine.api import EngineAPI
    from ...engine.phrases import Phrase

MIN_PUSH_SECONDS = 0.01


class EngineStream:
    def __init__(
        self, engine: EngineAPI, wake: Callable[[], None], budget: int, max_seconds: float | None = None,
        lookahead: tuple[int, int] | None = None, phrases: tuple[Phrase, ...] = (), bulk: bool = False,
        language: str | None = None, diarize: bool = False,
    ) -> None:
        """`budget`: samples (at the engine's rate) it may hold not yet encoded; `diarize`: its results
        carry speakers. Raises what `create_stream` raises (QueueFull, PhraseError, EngineError): each
        door says it its way."""
        self.engine = engine
        self.rate = engine.info.sample_rate
        self.sid = engine.create_stream(lookahead=lookahead, bulk=bulk, phrases=phrases, language=language,
                                        diarize=diarize)
        self.diarize = diarize
        self.budget = budget
        self.max_samples = None if max_seconds is None else int(max_seconds * self.rate)
        self._min_push = int(MIN_PUSH_SECONDS * self.rate)
        self._pending = bytearray()  # float32 samples at the engine's rate, not pushed yet
        self.pending_samples = self.pushed_samples = self.consumed_samples = 0
        self.admitted = False  # holds a slot
        self.final = False  # the end of its input was sent
        self.limit_reached = False  # cut at max_seconds
        self.finished = False  # its final result collected, or cancelled
        self.released = False
        engine.add_listener(self.sid, wake)

    @property
    def received_samples(self) -> int:
        """Audio taken (cut at the time limit)."""
        return self.pushed_samples + self.pending_samples

    @property
    def unconsumed_samples(self) -> int:
        """Audio taken that the engine has not consumed yet (pending here or in the engine)."""
        return max(0, self.pushed_samples - self.consumed_samples) + self.pending_samples

    @property
    def room(self) -> int:
        """Samples it may take now within its budget."""
        return self.budget - self.unconsumed_samples

    def position(self) -> int:
        """In the waiting queue (0: admitted)."""
        return self.engine.queue_position(self.sid)

    def take(self, samples: np.ndarray) -> None:
        """Add audio at the engine's rate (the caller keeps it within `room`). At the time limit
        the audio is cut and `limit_reached` set; the caller then finalizes."""
        received = self.received_samples
        if self.max_samples is not None and received + len(samples) >= self.max_samples:
            samples = samples[: self.max_samples - received]
            self.limit_reached = True
        self._pending += memoryview(np.ascontiguousarray(samples, np.float32)).cast("B")
        self.pending_samples += len(samples)

    def admit(self) -> bool:
        """Not admitted yet: whether it got a slot now; then the audio that waited is pushed."""
        if self.position() > 0:
            return False
        self.admitted = True
        self.flush(force=True)
        return True

    def flush(self, force: bool = False) -> None:
        """Hand pending audio to the engine: once admitted and at least MIN_PUSH_SECONDS of it
        (any amount when forced)."""
        if not self._pending or not (force or (self.admitted and self.pending_samples >= self._min_push)):
            return
        samples = np.frombuffer(self._pending, np.float32).copy()
        self._pending = bytearray()
        self.pending_samples = 0
        try:
            self.engine.push_audio(self.sid, samples)
        except EngineError:
            return  # failed or cancelled in the engine: its final or error result says so
        self.pushed_samples += len(samples)

    def finalize(self, tail: np.ndarray | None = None) -> bool:
        """The end of its input (`tail`: a resampler's last samples): the engine transcribes what
        is left, then sends the final result. False (nothing done) once final or finished."""
        if self.final or self.finished:
            return False
        if tail is not None and len(tail):
            self.take(tail)
        self.flush(force=True)
        self.final = True
        with contextlib.suppress(EngineError):
            self.engine.finalize(self.sid)
        return True

    def collect(self) -> list[StreamResult]:
        """The results waiting, in order; they tell how much audio the engine consumed."""
        results = self.engine.collect(self.sid)
        if results:
            self.consumed_samples = round(results[-1].audio_seconds * self.rate)
            self.finished = self.finished or any(r.is_final for r in results)
        return results

    def release(self) -> bool:
        """Free the slot (cancelling the stream if it is not finished); True the first time."""
        if self.released:
            return False
        self.released = True
        self._pending = bytearray()
        self.pending_samples = 0
        if not self.finished:
            self.finished = True
            with contextlib.suppress(EngineError):
                self.engine.cancel(self.sid)
        return True
