"""One call's stream, driven from the gRPC event loop: an EngineStream (server/streams/stream.py, the
same budgets as every door's) and the asyncio waiting around it.

`add` waits while the stream holds --max-backlog-seconds of audio not yet encoded (the call stops
reading, so HTTP/2 flow control slows the client) until the engine has consumed enough; a message
larger than the whole budget goes in in pieces. The engine wakes `collect` from another thread
through `loop.call_soon_threadsafe`.
"""
from __future__ import annotations

import asyncio
import contextlib
from functools import partial

import numpy as np

from ....engine import QueueFull, StreamResult
from ....engine.api import EngineAPI
from ....engine.phrases import Phrase, PhraseError
from ...context import ServerConfig
from ...streams.guard import backlog_samples
from ...streams.stream import EngineStream
from .errors import SHUTTING_DOWN, RivaError


class RivaStream:
    def __init__(self, engine: EngineAPI, config: ServerConfig, phrases: tuple[Phrase, ...] = (),
                 language: str | None = None, diarize: bool = False) -> None:
        self.engine = engine
        self._config = config
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()  # results, queue position, or a failure
        self._progress = asyncio.Event()  # the engine consumed audio (or a slot was won)
        self.finalized_at: float | None = None
        self.failure: RivaError | None = None
        self.phrases, self.language = phrases, language or engine.info.default_language
        self.diarize = diarize
        self.stream = self._open()

    def _open(self) -> EngineStream:
        try:
            stream = EngineStream(self.engine, partial(_wake, self._loop, self._changed), backlog_samples(self._config),
                                  self._config.max_stream_seconds, phrases=self.phrases, language=self.language,
                                  diarize=self.diarize)
        except QueueFull:
            raise RivaError("queue_full", "every slot is busy and the waiting queue is full") from None
        except PhraseError as exc:  # a phrase too many tokens long for the model
            raise RivaError(exc.code, f"speech_contexts: {exc.message}") from None
        self._changed.set()
        return stream

    def reopen(self, phrases: tuple[Phrase, ...], language: str | None, diarize: bool) -> None:
        """Before any audio: the engine stream is replaced by one that boosts `phrases` in
        `language`, with speakers where `diarize` (at the back of the queue if there is one)."""
        self.stream.release()
        self.phrases, self.language, self.diarize = phrases, language, diarize
        self.stream = self._open()

    @property
    def admitted(self) -> bool:
        return self.stream.admitted

    @property
    def finished(self) -> bool:
        """Its final result collected, or cancelled."""
        return self.stream.finished

    @property
    def limit_reached(self) -> bool:
        """Cut at --max-stream-seconds and finalized."""
        return self.stream.limit_reached

    @property
    def received_seconds(self) -> float:
        """The audio this stream took (cut at the time limit; the engine pads the last chunk,
        and that padding was never sent)."""
        return self.stream.received_samples / self.stream.rate

    async def add(self, samples: np.ndarray) -> None:
        """Take audio within the budget, waiting for room. At --max-stream-seconds the audio is
        cut and the stream finalized."""
        stream = self.stream
        while len(samples) and self.finalized_at is None and not stream.limit_reached:
            room = stream.room
            if room <= 0:
                self._progress.clear()
                stream.flush(force=stream.admitted)
                await self._progress.wait()
                if self.failure is not None:
                    raise self.failure
                continue
            stream.take(samples[:room])
            samples = samples[room:]
        if stream.limit_reached:
            self.finalize()
        stream.flush()

    def finalize(self, tail: np.ndarray | None = None) -> None:
        """The end of the audio (`tail`: the resampler's last samples)."""
        if self.stream.finalize(tail):
            self.finalized_at = self._loop.time()

    async def collect(self) -> list[StreamResult]:
        """The next results (waiting for them); raises the failure that ended the stream."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.failure is not None:
                raise self.failure
            if not self.stream.admitted and not self._admit():
                continue
            results = self.stream.collect()
            if results:
                self._progress.set()
                return results

    def fail(self, error: RivaError) -> None:
        """End the stream with `error` (raised by the next `collect`)."""
        self.failure = self.failure or error
        self._changed.set()
        self._progress.set()

    def leave_queue(self) -> None:
        """Shutdown began: a stream still waiting for a slot ends (UNAVAILABLE) at once."""
        if not self.stream.admitted:
            self.fail(RivaError("server_shutdown", SHUTTING_DOWN))

    def release(self) -> None:
        """Free the slot at once (cancelling the stream if it is not finished)."""
        self.stream.release()

    def _admit(self) -> bool:
        if not self.stream.admit():
            return False
        self._progress.set()  # audio received while queued was pushed
        return True


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Engine listener, called from another thread."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(event.set)
