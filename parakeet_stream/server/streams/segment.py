"""A segment: the server's handle on one stretch of a connection's audio (all of it, or one
utterance of it: see segments.py), transcribed by one EngineStream (stream.py, which holds the
audio on its way to the engine, its budget and its slot).

Here is what the connection counts in it: the client's rate (audio is resampled as it comes),
connection time (where the segment starts, how much audio it received), the transcript so far,
and the trio times of its admission and its final.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import trio

from ...audio import StreamResampler
from ...engine import EngineError, QueueFull
from ...engine.phrases import PhraseError
from ..transport.codes import ProtocolError
from .phrases import refused
from .stream import EngineStream

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ...engine.api import EngineAPI
    from ...engine.phrases import Phrase
    from ..transport.wakeup import Wakeup


class Segment:
    def __init__(
        self, engine: EngineAPI, changed: Wakeup, lookahead: tuple[int, int] | None, input_rate: int,
        max_seconds: float | None, offset: float, budget: int, phrases: tuple[Phrase, ...],
        language: str | None = None,
    ) -> None:
        self.stream = _open(engine, changed, budget, max_seconds, lookahead, phrases, language)
        self.sid = self.stream.sid
        self.lookahead = tuple(lookahead or engine.info.default_lookahead)
        self.phrases = phrases
        self.language = language or engine.info.default_language  # what a multilingual model transcribes
        self.offset = offset  # connection seconds where its audio starts
        self.input_seconds = 0.0  # audio received, padding and the cut after max_seconds included
        self._rate = engine.info.sample_rate
        self.set_input_rate(input_rate)
        self.text = ""  # the transcript so far
        self.token_count = 0
        self.announced_position = 0  # the queue position the client was last told
        self.admitted_at: float | None = None
        self.final_at: float | None = None  # the client's end of input
        changed.set()

    @property
    def final(self) -> bool:
        return self.final_at is not None

    @property
    def finished(self) -> bool:
        """Its final result collected, or cancelled."""
        return self.stream.finished

    @property
    def limit_reached(self) -> bool:
        """Cut at max_seconds and made final."""
        return self.stream.limit_reached

    @property
    def received_samples(self) -> int:
        return self.stream.received_samples

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
        return self.stream.position()

    def add(self, samples: np.ndarray) -> bool:
        """Take a packet, unless what the segment holds (here and in the engine, not yet encoded)
        plus the packet exceeds its budget: then False, and the caller waits for the engine to
        consume audio. At the time limit the audio is cut and the input made final."""
        incoming = -(-len(samples) * self._rate // self.input_rate)
        if incoming > self.stream.budget:
            seconds = self.stream.budget / self._rate
            raise ProtocolError("message_too_large", f"one message may carry at most {seconds:g} s of audio")
        if self.final_at is not None:
            raise ProtocolError("stream_closed", "audio after the end of the stream")
        if incoming > self.stream.room and not self.finished:
            return False
        self.input_seconds += len(samples) / self.input_rate
        if self._resampler is not None:
            samples = self._resampler.push(samples)
        self.stream.take(samples)
        if self.limit_reached:
            self.finalize()
        return True

    def flush(self, force: bool = False) -> None:
        self.stream.flush(force)

    def admit(self) -> bool:
        """Not admitted yet: whether it got a slot now (the audio that waited is pushed)."""
        if not self.stream.admit():
            return False
        self.admitted_at = trio.current_time()
        return True

    def finalize(self) -> None:
        """The client's end of input: the engine transcribes what is left, then sends the final result.
        Once only, and not once the segment is over (its final result collected, or cancelled)."""
        tail = None
        if self._resampler is not None and not (self.final or self.finished):  # the filter's tail
            tail = self._resampler.push(np.zeros(0, np.float32), last=True)
        if self.stream.finalize(tail):
            self.final_at = trio.current_time()

    def collect(self) -> list[StreamResult]:
        """The engine's results waiting, in order (each then absorbed by the caller)."""
        return self.stream.collect()

    def absorb(self, result: StreamResult) -> None:
        """Account for one collected result (in order)."""
        self.text += result.text
        self.token_count += len(result.token_ids)

    def release(self) -> float | None:
        """Free the slot (cancelling if unfinished); returns how long it was held, once."""
        if not self.stream.release():
            return None
        return None if self.admitted_at is None else trio.current_time() - self.admitted_at


def _open(engine: EngineAPI, changed: Wakeup, budget: int, max_seconds: float | None,
          lookahead: tuple[int, int] | None, phrases: tuple[Phrase, ...], language: str | None) -> EngineStream:
    try:
        return EngineStream(engine, changed.set_threadsafe, budget, max_seconds, lookahead, phrases, language=language)
    except QueueFull:
        raise ProtocolError("queue_full", "every slot is busy and the waiting queue is full") from None
    except PhraseError as exc:  # a phrase too many tokens long for the model
        raise refused(exc) from None
    except EngineError as exc:
        if exc.code == "unsupported_language":
            raise ProtocolError(exc.code, exc.message) from None
        if exc.code != "bad_lookahead":
            raise
        raise ProtocolError("bad_lookahead", f"lookahead must be one of: {engine.info.modes_text()}") from None
