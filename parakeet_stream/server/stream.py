"""One engine stream as a connection sees it: input accounting, resampling, results."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import trio

from ..audio import StreamResampler
from ..engine import EngineError, QueueFull
from .codes import ProtocolError
from .wakeup import Wakeup

if TYPE_CHECKING:
    from ..engine import ASREngine, StreamResult


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
        self.pushed_samples = 0
        self.consumed_seconds = 0.0
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
    def backlog_seconds(self) -> float:
        return self.pushed_samples / self.engine.sample_rate - self.consumed_seconds

    def set_input_rate(self, rate: int) -> None:
        """Only before the first packet (a start message)."""
        self.input_rate = rate
        self._resampler = StreamResampler(rate)

    def position(self) -> int:
        return self.engine.queue_position(self.sid)

    def push(self, samples: np.ndarray) -> bool:
        """Queue audio; returns True when the stream hit its time limit and was finalized."""
        if self.finalized:
            raise ProtocolError("stream_closed", "audio after the end of the stream")
        samples = self._resampler.push(samples)
        room = None if self._max_samples is None else self._max_samples - self.pushed_samples
        over = room is not None and len(samples) >= room
        self._push_engine(samples[:room] if over else samples)
        if over:
            self.finalize()
        return over

    def finalize(self) -> None:
        if self.finalized:
            return
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
        if not self.finished:
            self.finished = True
            with contextlib.suppress(EngineError):
                self.engine.cancel(self.sid)

    def _push_engine(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        try:
            self.engine.push_audio(self.sid, samples)
        except EngineError as exc:
            if exc.code == "inference_error":
                return  # the stream failed; its error result is on the way to the client
            raise ProtocolError("stream_closed", "the stream has ended") from exc
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
