"""One engine stream driven from the gRPC event loop (server/segment.py's Segment is bound to
trio; this is its asyncio twin and keeps the same budgets).

Audio arrives resampled and waits in one contiguous buffer until the stream holds a slot, then
reaches the engine in pieces of at least MIN_PUSH_SECONDS. What the stream holds unencoded, here
and in the engine, stays within --max-backlog-seconds: `add` waits (the call stops reading, so
HTTP/2 flow control slows the client) until the engine has consumed enough. The engine wakes
`collect` from its threads through `loop.call_soon_threadsafe`.
"""
from __future__ import annotations

import asyncio
import contextlib
from functools import partial

import numpy as np

from ...engine import ASREngine, EngineError, QueueFull, StreamResult
from ...engine.phrases import Phrase, PhraseError
from ..context import ServerConfig
from ..guard import SAMPLE_BYTES, backlog_samples
from ..segment import MIN_PUSH_SECONDS
from .errors import SHUTTING_DOWN, RivaError


class RivaStream:
    def __init__(self, engine: ASREngine, config: ServerConfig, phrases: tuple[Phrase, ...] = ()) -> None:
        self.engine = engine
        self.sid = self._create(phrases)
        self._loop = asyncio.get_running_loop()
        self._budget = backlog_samples(config)
        limit = config.max_stream_seconds
        self._max_samples = None if limit is None else int(limit * engine.info.sample_rate)
        self._min_push = int(MIN_PUSH_SECONDS * engine.info.sample_rate)
        self._pending = bytearray()  # float32 at the model rate, not yet pushed
        self._changed = asyncio.Event()  # results, queue position, or a failure
        self._progress = asyncio.Event()  # the engine consumed audio (or a slot was won)
        self.pushed_samples = 0
        self.consumed_seconds = 0.0
        self.admitted = False
        self.finalized_at: float | None = None
        self.limit_reached = False  # cut at --max-stream-seconds and finalized
        self.finished = False  # final result collected, or cancelled
        self.failure: RivaError | None = None
        engine.add_listener(self.sid, partial(_wake, self._loop, self._changed))
        self._changed.set()

    def _create(self, phrases: tuple[Phrase, ...]) -> int:
        try:
            return self.engine.create_stream(phrases=phrases)
        except QueueFull:
            raise RivaError("queue_full", "every slot is busy and the waiting queue is full") from None
        except PhraseError as exc:  # a phrase too many tokens long for the model
            raise RivaError(exc.code, f"speech_contexts: {exc.message}") from None

    def reopen(self, phrases: tuple[Phrase, ...]) -> None:
        """Before any audio: the engine stream is replaced by one that boosts `phrases` (at the
        back of the queue if there is one)."""
        self.engine.cancel(self.sid)
        self.admitted = False
        self.sid = self._create(phrases)
        self.engine.add_listener(self.sid, partial(_wake, self._loop, self._changed))
        self._changed.set()

    @property
    def held_samples(self) -> int:
        consumed = int(self.consumed_seconds * self.engine.info.sample_rate)
        return max(0, self.pushed_samples - consumed) + len(self._pending) // SAMPLE_BYTES

    @property
    def received_samples(self) -> int:
        return self.pushed_samples + len(self._pending) // SAMPLE_BYTES

    @property
    def received_seconds(self) -> float:
        """The audio this stream took (cut at the time limit; the engine pads the last chunk,
        and that padding was never sent)."""
        return self.received_samples / self.engine.info.sample_rate

    async def add(self, samples: np.ndarray) -> None:
        """Take audio within the budget, waiting for room; a message larger than the whole
        budget goes in in pieces. At --max-stream-seconds the audio is cut and the stream finalized."""
        while len(samples) and self.finalized_at is None:
            room = self._budget - self.held_samples
            if room <= 0:
                self._progress.clear()
                self.flush(force=self.admitted)
                await self._progress.wait()
                if self.failure is not None:
                    raise self.failure
                continue
            piece, samples = samples[:room], samples[room:]
            if self._max_samples is not None and self.received_samples + len(piece) >= self._max_samples:
                piece, samples = piece[: self._max_samples - self.received_samples], samples[:0]
                self.limit_reached = True
            self._pending += memoryview(np.ascontiguousarray(piece, np.float32)).cast("B")
        if self.limit_reached:
            self.finalize()
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Hand pending audio to the engine: once admitted and at least MIN_PUSH_SECONDS of it
        (any amount when forced)."""
        if not (self.admitted or force) or not self._pending:
            return
        if force or len(self._pending) >= self._min_push * SAMPLE_BYTES:
            samples = np.frombuffer(self._pending, np.float32).copy()
            self._pending = bytearray()
            try:
                self.engine.push_audio(self.sid, samples)
            except EngineError:
                return  # failed or cancelled in the engine: its final (error) result tells the client
            self.pushed_samples += len(samples)

    def finalize(self, tail: np.ndarray | None = None) -> None:
        """The end of the audio (`tail`: the resampler's last samples)."""
        if self.finalized_at is not None or self.finished:
            return
        if tail is not None and len(tail):
            self._pending += memoryview(np.ascontiguousarray(tail, np.float32)).cast("B")
        self.flush(force=True)
        self.finalized_at = self._loop.time()
        with contextlib.suppress(EngineError):
            self.engine.finalize(self.sid)

    async def collect(self) -> list[StreamResult]:
        """The next results (waiting for them); raises the failure that ended the stream."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.failure is not None:
                raise self.failure
            if not self.admitted and not self._admit():
                continue
            results = self.engine.collect(self.sid)
            if results:
                self.consumed_seconds = results[-1].audio_seconds
                self.finished = results[-1].is_final
                self._progress.set()
                return results

    def fail(self, error: RivaError) -> None:
        """End the stream with `error` (raised by the next `collect`)."""
        self.failure = self.failure or error
        self._changed.set()
        self._progress.set()

    def leave_queue(self) -> None:
        """Shutdown began: a stream still waiting for a slot ends (UNAVAILABLE) at once."""
        if not self.admitted:
            self.fail(RivaError("server_shutdown", SHUTTING_DOWN))

    def release(self) -> None:
        """Free the slot at once (cancelling the stream if it is not finished)."""
        self._pending = bytearray()
        if not self.finished:
            self.finished = True
            with contextlib.suppress(EngineError):
                self.engine.cancel(self.sid)

    def _admit(self) -> bool:
        if self.engine.queue_position(self.sid) > 0:
            return False
        self.admitted = True
        self.flush(force=True)  # audio received while queued
        self._progress.set()
        return True


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Engine listener, called from engine threads."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(event.set)
