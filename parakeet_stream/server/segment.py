"""A segment: the server's handle on one engine stream, which transcribes one stretch of a
connection's audio (all of it, or one utterance of it: see segments.py).

Audio a client sends is resampled at once and appended to one contiguous buffer; it reaches
the engine in pieces of at least MIN_PUSH_SECONDS, or all of it on admission and when the
input is final. A queued segment therefore holds its audio here, in one bytearray, never one
object per message.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import trio

from ..audio import StreamResampler
from ..engine import EngineError, QueueFull
from ..engine.phrases import PhraseError
from .codes import ProtocolError
from .phrases import refused

if TYPE_CHECKING:
    from ..engine import ASREngine, StreamResult
    from ..engine.phrases import Phrase
    from .wakeup import Wakeup

MIN_PUSH_SECONDS = 0.01


class Segment:
    def __init__(
        self, engine: ASREngine, changed: Wakeup, lookahead: tuple[int, int] | None, input_rate: int,
        max_seconds: float | None, offset: float, budget: int, phrases: tuple[Phrase, ...],
    ) -> None:
        info = engine.info
        self.engine = engine
        self.sid = _create(engine, lookahead, phrases)
        self.lookahead = tuple(lookahead or info.default_lookahead)
        self.phrases = phrases
        self.offset = offset  # connection seconds where its audio starts
        self.input_seconds = 0.0  # audio received, padding and the cut after max_seconds included
        self._rate = info.sample_rate
        self.set_input_rate(input_rate)
        self._max_samples = None if max_seconds is None else int(max_seconds * self._rate)
        self._budget = budget  # samples it may hold not yet encoded (model rate)
        self._pending = bytearray()  # float32 samples at the model rate, not yet pushed
        self._min_push = int(MIN_PUSH_SECONDS * self._rate)
        self.pending_samples = self.pushed_samples = self.consumed_samples = 0
        self.limit_reached = False  # cut at max_seconds and made final
        self.text = ""  # the transcript so far
        self.token_count = 0
        self.announced_position = 0  # the queue position the client was last told
        self.admitted_at: float | None = None
        self.final_at: float | None = None  # the client's end of input
        self.finished = False  # final result collected, or cancelled
        self.released = False
        engine.add_listener(self.sid, changed.set_threadsafe)
        changed.set()

    @property
    def final(self) -> bool:
        return self.final_at is not None

    @property
    def received_samples(self) -> int:
        return self.pushed_samples + self.pending_samples

    def heard_until(self, result: StreamResult | None = None) -> float:
        """Connection seconds up to which `result` transcribed this segment's audio (the engine's
        padding at the end not counted); without a result, where its audio ends."""
        seconds = self.input_seconds if result is None else min(result.audio_seconds, self.input_seconds)
        return self.offset + seconds

    def set_input_rate(self, rate: int) -> None:
        """Only before the first packet (a start message)."""
        self.input_rate = rate
        self._resampler = None if rate == self._rate else StreamResampler(rate)

    def position(self) -> int:
        return self.engine.queue_position(self.sid)

    def add(self, samples: np.ndarray) -> bool:
        """Take a packet, unless what the segment holds (here and in the engine, not yet encoded)
        plus the packet exceeds its budget: then False, and the caller waits for the engine to
        consume audio. At the time limit the audio is cut and the input made final."""
        incoming = -(-len(samples) * self._rate // self.input_rate)
        if incoming > self._budget:
            seconds = self._budget / self._rate
            raise ProtocolError("message_too_large", f"one message may carry at most {seconds:g} s of audio")
        if self.final_at is not None:
            raise ProtocolError("stream_closed", "audio after the end of the stream")
        held = max(0, self.pushed_samples - self.consumed_samples) + self.pending_samples
        if held + incoming > self._budget and not self.finished:
            return False
        self.input_seconds += len(samples) / self.input_rate
        if self._resampler is not None:
            samples = self._resampler.push(samples)
        received = self.pushed_samples + self.pending_samples
        if self._max_samples is not None and received + len(samples) >= self._max_samples:
            samples = samples[: self._max_samples - received]
            self.limit_reached = True
        self._pending += memoryview(np.ascontiguousarray(samples, np.float32)).cast("B")
        self.pending_samples += len(samples)
        if self.limit_reached:
            self.finalize()
        return True

    def flush(self, force: bool = False) -> None:
        """Hand pending audio to the engine: once admitted and at least MIN_PUSH_SECONDS
        of it (or any amount when forced)."""
        if not self._pending or not (force or (self.admitted_at is not None and self.pending_samples >= self._min_push)):
            return
        samples = np.frombuffer(self._pending, np.float32).copy()
        self._pending = bytearray()
        self.pending_samples = 0
        try:
            self.engine.push_audio(self.sid, samples)
        except EngineError:
            return  # failed or cancelled in the engine: its final or error result tells the client
        self.pushed_samples += len(samples)

    def finalize(self) -> None:
        """The client's end of input: the engine transcribes what is left, then sends the final result.
        Once only, and not once the stream is over (its final result collected, or cancelled)."""
        if self.final_at is not None or self.finished:
            return
        if self._resampler is not None:  # the filter's tail
            tail = self._resampler.push(np.zeros(0, np.float32), last=True)
            self._pending += memoryview(np.ascontiguousarray(tail, np.float32)).cast("B")
            self.pending_samples += len(tail)
        self.flush(force=True)
        self.final_at = trio.current_time()
        self.engine.finalize(self.sid)

    def absorb(self, result: StreamResult) -> None:
        """Account for one collected result (in order)."""
        self.text += result.text
        self.token_count += len(result.token_ids)
        self.consumed_samples = int(result.audio_seconds * self._rate)
        self.finished = self.finished or result.is_final

    def release(self) -> float | None:
        """Free the slot (cancelling if unfinished); returns how long it was held, once."""
        if self.released:
            return None
        self.released = True
        self._pending = bytearray()
        self.pending_samples = 0
        if not self.finished:
            self.finished = True
            with contextlib.suppress(EngineError):
                self.engine.cancel(self.sid)
        return None if self.admitted_at is None else trio.current_time() - self.admitted_at


def _create(engine: ASREngine, lookahead: tuple[int, int] | None, phrases: tuple[Phrase, ...]) -> int:
    try:
        return engine.create_stream(lookahead=lookahead, phrases=phrases)
    except QueueFull:
        raise ProtocolError("queue_full", "every slot is busy and the waiting queue is full") from None
    except PhraseError as exc:  # a phrase too many tokens long for the model
        raise refused(exc) from None
    except EngineError as exc:
        if exc.code != "bad_lookahead":
            raise
        raise ProtocolError("bad_lookahead", f"lookahead must be one of: {engine.info.modes_text()}") from None
