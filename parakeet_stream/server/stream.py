"""One engine stream as a connection sees it: input accounting, resampling, results.

Audio a client sends is resampled at once and appended to one contiguous buffer
(`pending`); it reaches the engine in pieces of at least MIN_PUSH_SECONDS, or all of it
on admission and at the end of the stream. A queued stream therefore holds its audio
here, in one bytearray, never one object per message.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import trio

from ..audio import StreamResampler
from ..engine import EngineError, QueueFull
from .codes import ProtocolError

if TYPE_CHECKING:
    from ..engine import ASREngine, StreamResult

MIN_PUSH_SECONDS = 0.01
SAMPLE_BYTES = 4  # float32


class Wakeup:
    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def set_threadsafe(self) -> None:
        """For engine listeners: cheap, never blocks, safe after trio has exited."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self.set)

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


class EngineStream:
    def __init__(
        self,
        engine: ASREngine,
        wakeup: Wakeup,
        lookahead: tuple[int, int] | None,
        input_rate: int,
        max_seconds: float | None,
    ) -> None:
        self.engine = engine
        self.sid = _create(engine, lookahead)
        self.lookahead = tuple(lookahead or engine.default_lookahead)
        self.input_rate = input_rate
        self._resampler = StreamResampler(input_rate)
        self._max_samples = None if max_seconds is None else int(max_seconds * engine.sample_rate)
        self._pending = bytearray()  # float32 samples at the model rate, not yet pushed
        self._min_push = int(MIN_PUSH_SECONDS * engine.sample_rate)
        self.pushed_samples = 0
        self.consumed_seconds = 0.0
        self.limit_reached = False  # cut at max_seconds and finalized
        self.text = ""  # the transcript so far
        self.token_count = 0
        self.admitted_at: float | None = None
        self.finalized_at: float | None = None
        self.finished = False  # final result collected, or cancelled
        self.released = False
        engine.add_listener(self.sid, wakeup.set_threadsafe)
        wakeup.set()

    @property
    def finalized(self) -> bool:
        return self.finalized_at is not None

    @property
    def pending_samples(self) -> int:
        return len(self._pending) // SAMPLE_BYTES

    @property
    def held_samples(self) -> int:
        """Audio (model rate) this stream holds, here and in the engine, not yet encoded."""
        consumed = int(self.consumed_seconds * self.engine.sample_rate)
        return max(0, self.pushed_samples - consumed) + self.pending_samples

    @property
    def received_samples(self) -> int:
        return self.pushed_samples + self.pending_samples

    def model_samples(self, n: int) -> int:
        """How many model-rate samples `n` samples at the input rate become (rounded up)."""
        return -(-n * self.engine.sample_rate // self.input_rate)

    def set_input_rate(self, rate: int) -> None:
        """Only before the first packet (a start message)."""
        self.input_rate = rate
        self._resampler = StreamResampler(rate)

    def position(self) -> int:
        return self.engine.queue_position(self.sid)

    def add(self, samples: np.ndarray) -> None:
        """Take a packet; at the time limit the audio is cut and the stream finalized."""
        if self.finalized:
            raise ProtocolError("stream_closed", "audio after the end of the stream")
        samples = self._resampler.push(samples)
        if self._max_samples is not None and self.received_samples + len(samples) >= self._max_samples:
            samples = samples[: self._max_samples - self.received_samples]
            self.limit_reached = True
        self._pending += memoryview(np.ascontiguousarray(samples, np.float32)).cast("B")
        if self.limit_reached:
            self.finalize()

    def flush(self, force: bool = False) -> None:
        """Hand pending audio to the engine: once admitted and at least MIN_PUSH_SECONDS
        of it (or any amount when forced)."""
        if self.admitted_at is None and not force:
            return
        if self._pending and (force or self.pending_samples >= self._min_push):
            samples = np.frombuffer(self._pending, np.float32).copy()
            self._pending = bytearray()
            self._push_engine(samples)

    def finalize(self) -> None:
        if self.finalized:
            return
        self.flush(force=True)
        self._push_engine(self._resampler.push(np.zeros(0, np.float32), last=True))
        self.finalized_at = trio.current_time()
        self.engine.finalize(self.sid)

    def collect(self) -> list[StreamResult]:
        return self.engine.collect(self.sid)

    def absorb(self, result: StreamResult) -> str:
        """Account for one collected result (in order); returns the transcript so far."""
        self.text += result.text
        self.token_count += len(result.token_ids)
        self.consumed_seconds = result.audio_seconds
        self.finished = self.finished or result.is_final
        return self.text

    def release(self) -> float | None:
        """Free the slot (cancelling if unfinished); returns how long it was held, once."""
        if self.released:
            return None
        self.released = True
        self.cancel()
        return None if self.admitted_at is None else trio.current_time() - self.admitted_at

    def cancel(self) -> None:
        self._pending = bytearray()
        if not self.finished:
            self.finished = True
            with contextlib.suppress(EngineError):
                self.engine.cancel(self.sid)

    def _push_engine(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        try:
            self.engine.push_audio(self.sid, samples)
        except EngineError:
            return  # failed or cancelled in the engine: its final or error result tells the client
        self.pushed_samples += len(samples)


def _create(engine: ASREngine, lookahead: tuple[int, int] | None) -> int:
    try:
        return engine.create_stream(lookahead=lookahead)
    except QueueFull:
        raise ProtocolError("queue_full", "every slot is busy and the waiting queue is full") from None
    except EngineError as exc:
        if exc.code != "bad_lookahead":
            raise
        modes = ", ".join(f"{left},{right}" for left, right in engine.lookahead_modes)
        raise ProtocolError("bad_lookahead", f"lookahead must be one of: {modes}") from None
