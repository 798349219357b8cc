"""The segments of one connection, one at a time.

The native protocol runs one segment per connection. The others run several in turn, one per
utterance the client ends (Deepgram's Finalize, OpenAI's commit, vLLM's commit final): once a
segment's input is final it drains (the engine transcribes what is left), and the next audio
opens a new segment. Here, once for every such protocol:
- the state every protocol's commit / clear / finalize decides on (`state`: IDLE, OPEN,
  DRAINING); those transitions are synchronous (see session.py);
- audio sent while the previous segment drains waits (within the audio budget) for the next
  one, and so do the protocol's actions queued behind it (`defer`), in order;
- times count from the connection: a segment starts at `offset`, the audio before it (audio
  dropped while it waited included).

A Segment is the EngineStream (stream.py: the audio on its way to the engine, its budget, its
slot) of one stretch of a connection's audio, with what the connection counts in it: the client's
rate (audio is resampled as it comes), connection time (where the segment starts, how much audio
it received), the transcript so far, and the trio times of its admission and its final. A
protocol's audio goes from `Segments.push` to `Segment.add`, then to the engine in
`EngineStream.flush`; results come back through `EngineStream.collect`.
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import trio

from ... import audio
from ...audio import StreamResampler
from ...engine import EngineError, QueueFull
from ...engine.phrases import PhraseError
from ..transport.channel import ChannelClosed
from ..transport.codes import ProtocolError
from ..transport.wakeup import Wakeup
from .guard import backlog_samples
from .phrases import refused
from .stream import EngineStream

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ...engine.api import EngineAPI
    from ...engine.phrases import Phrase
    from ..context import ServerContext
    from ..transport.channel import Channel

# while reading is paused for back-pressure, how often to look whether the client is gone
PEER_CHECK_S = 0.1

Deferred = Callable[[], None]


class State(enum.Enum):
    IDLE = "idle"  # no segment: the next audio opens one
    OPEN = "open"  # the current segment takes audio
    DRAINING = "draining"  # its input is final: audio and deferred actions wait for the next


@dataclass(frozen=True)
class Gap:
    """Audio that waited for the next segment and was dropped: its time still passes before the next segment's."""

    seconds: float


class Segment(EngineStream):
    """One stretch of a connection's audio (all of it, or one utterance of it) through the engine."""

    def __init__(
        self, engine: EngineAPI, changed: Wakeup, lookahead: tuple[int, int] | None, input_rate: int,
        max_seconds: float | None, offset: float, budget: int, phrases: tuple[Phrase, ...],
        language: str | None = None, diarize: bool = False,
    ) -> None:
        try:
            super().__init__(engine, changed.set_threadsafe, budget, max_seconds, lookahead, phrases, language=language,
                             diarize=diarize)
        except QueueFull:
            raise ProtocolError("queue_full", "every slot is busy and the waiting queue is full") from None
        except PhraseError as exc:  # a phrase too many tokens long for the model
            raise refused(exc) from None
        except EngineError as exc:
            if exc.code in ("unsupported_language", "diarization_unavailable"):
                raise ProtocolError(exc.code, exc.message) from None
            if exc.code != "bad_lookahead":
                raise
            raise ProtocolError("bad_lookahead", f"lookahead must be one of: {engine.info.modes_text()}") from None
        self.lookahead = tuple(lookahead or engine.info.default_lookahead)
        self.phrases = phrases
        self.language = language or engine.info.default_language  # what a multilingual model transcribes
        self.offset = offset  # connection seconds where its audio starts
        self.input_seconds = 0.0  # audio received, padding and the cut after max_seconds included
        self.set_input_rate(input_rate)
        self.text = ""  # the transcript so far
        self.token_count = 0
        self.announced_position = 0  # the queue position the client was last told
        self.admitted_at: float | None = None
        self.queued_at: float | None = None  # when it was first found waiting for a slot
        self.final_at: float | None = None  # the client's end of input
        changed.set()

    def heard_until(self, result: StreamResult | None = None) -> float:
        """Connection seconds up to which `result` transcribed this segment's audio (the engine's
        padding at the end not counted); without a result, where its audio ends."""
        seconds = self.input_seconds if result is None else min(result.audio_seconds, self.input_seconds)
        return self.offset + seconds

    def set_input_rate(self, rate: int) -> None:
        """Only before the first packet (a start message)."""
        self.input_rate = rate
        self._resampler = None if rate == self.rate else StreamResampler(rate)

    def add(self, samples: np.ndarray) -> bool:
        """Take a packet at the client's rate, unless what the segment holds (here and in the
        engine, not yet consumed) plus the packet exceeds its budget: then False, and the caller
        waits for the engine to consume audio. At the time limit the audio is cut and the input
        made final."""
        incoming = -(-len(samples) * self.rate // self.input_rate)
        if incoming > self.budget:
            seconds = self.budget / self.rate
            raise ProtocolError("message_too_large", f"one message may carry at most {seconds:g} s of audio")
        if self.final:
            raise ProtocolError("stream_closed", "audio after the end of the stream")
        if incoming > self.room and not self.finished:
            return False
        self.input_seconds += len(samples) / self.input_rate
        if self._resampler is not None:
            samples = self._resampler.push(samples)
        self.take(samples)
        if self.limit_reached:
            self.finalize()
        return True

    def admit(self) -> bool:
        """Not admitted yet: whether it got a slot now (the audio that waited is pushed)."""
        if not super().admit():
            return False
        self.admitted_at = trio.current_time()
        return True

    def finalize(self) -> bool:
        """The client's end of input: the engine transcribes what is left (the resampler's tail
        too), then sends the final result. Once only, and not once the segment is over (its final
        result collected, or cancelled): then False."""
        tail = None
        if self._resampler is not None and not (self.final or self.finished):  # the filter's tail
            tail = self._resampler.push(np.zeros(0, np.float32), last=True)
        if not super().finalize(tail):
            return False
        self.final_at = trio.current_time()
        return True

    def absorb(self, result: StreamResult) -> None:
        """Account for one collected result (in order)."""
        self.text += result.text
        self.token_count += len(result.token_ids)


class Segments:
    def __init__(self, ctx: ServerContext, channel: Channel, metric: str, several: bool) -> None:
        self.ctx = ctx
        self.several = several  # False: one segment per connection, audio after its end refused
        self.current: Segment | None = None
        self.changed = Wakeup()  # the writer has work: engine news (results, queue position) or posted messages
        self.progress = Wakeup()  # the engine consumed audio
        self.rate = audio.SAMPLE_RATE  # of the client's audio
        self.offset = 0.0  # connection seconds where the current (or next) segment starts
        self.end_after: str | None = None  # end the connection for this reason once the current segment is done
        self.phrases: tuple[Phrase, ...] = ()  # what each segment opened from now on boosts
        self.language: str | None = None  # and its language (None: the model's default)
        self.diarize = False  # and whether its results carry speakers
        self._channel = channel
        self._metric = metric
        self._budget = backlog_samples(ctx.config)
        self._waiting: list[np.ndarray | Gap | Deferred] = []  # for the next segment, in order
        self._waiting_samples = 0  # of the audio in _waiting (at the client's rate)

    # -- state the connection and the protocols look at ---------------------------------
    @property
    def state(self) -> State:
        if self.current is None:
            return State.IDLE
        return State.DRAINING if self.current.final else State.OPEN

    @property
    def draining(self) -> bool:
        """The current segment's input is final; its last results are still to come."""
        return self.state is State.DRAINING

    @property
    def audio_waiting(self) -> bool:
        """Audio waits for the next segment, behind the last deferred action."""
        for item in reversed(self._waiting):
            if callable(item):
                return False
            if isinstance(item, np.ndarray):
                return True
        return False

    @property
    def received_seconds(self) -> float:
        """All the audio the client sent."""
        current = 0.0 if self.current is None else self.current.input_seconds
        gaps = sum(item.seconds for item in self._waiting if isinstance(item, Gap))
        return self.offset + current + gaps + self._waiting_samples / self.rate

    @property
    def active(self) -> bool:
        """A segment holds a slot and goes on."""
        segment = self.current
        return segment is not None and not segment.finished and segment.position() == 0

    @property
    def waiting_on_server(self) -> bool:
        """The client waits for us (queued, or for a final result), so its silence is no idleness."""
        segment = self.current
        return segment is not None and (segment.final or segment.admitted_at is None)

    # -- segments ------------------------------------------------------------------------
    def open(self, lookahead: tuple[int, int] | None = None) -> Segment:
        config = self.ctx.config
        self.current = Segment(
            self.ctx.engine, self.changed, lookahead, self.rate, config.max_stream_seconds, self.offset, self._budget,
            self.phrases, self.language, self.diarize,
        )
        self.ctx.metrics.streams.labels(self._metric).inc()
        return self.current

    async def push(self, samples: np.ndarray) -> None:
        """Add audio to the current segment (opened if there is none), or keep it for the next
        segment while the previous one drains. Over the audio budget, wait: reading is paused, so the client is
        slowed by flow control."""
        segment = self._taker(samples)
        if segment is None:
            return
        while not segment.add(samples):
            segment.flush(force=segment.admitted_at is not None)
            with trio.move_on_after(PEER_CHECK_S):
                await self.progress.wait()
            if self._channel.peer_gone():  # nobody reads the socket now: look at it directly
                raise ChannelClosed()
        self._check_limit(segment)

    def _taker(self, samples: np.ndarray) -> Segment | None:
        """The segment that takes `samples` (opened if needed); None: kept for the next, or nothing to take."""
        if not len(samples):
            return None
        if self.state is State.DRAINING and self.several:
            self._keep_for_next(samples)
            return None
        return self.current or self.open()

    def _check_limit(self, segment: Segment) -> None:
        if segment.limit_reached:
            self.end_after = "max_stream_seconds"

    def _keep_for_next(self, samples: np.ndarray) -> None:
        waiting = self._waiting_samples + len(samples)
        if -(-waiting * self.ctx.engine.info.sample_rate // self.rate) > self._budget:
            raise ProtocolError("message_too_large", "too much audio sent while the previous segment finishes")
        self._waiting.append(samples)
        self._waiting_samples = waiting

    def end_input(self, again: Deferred) -> State | None:
        """End the current segment's input (a protocol's Finalize, ForceEndTurn, close): OPEN, it
        ended now; DRAINING, the segment before still drains, and `again` runs once the audio waiting
        behind it went to the next one (if any waits); None, no audio to end."""
        match self.state:
            case State.DRAINING:
                if self.audio_waiting:
                    self.defer(again)
                return State.DRAINING
            case State.OPEN if self.current.received_samples:
                self.current.finalize()
                return State.OPEN
        return None

    def defer(self, action: Deferred) -> None:
        """While a segment drains: run `action` after the audio already waiting has gone to the next one."""
        self._waiting.append(action)

    def drop_waiting_audio(self) -> None:
        """Forget the audio waiting behind the last deferred action (its time still passes)."""
        keep = len(self._waiting)
        while keep and not callable(self._waiting[keep - 1]):
            keep -= 1
        dropped = [item for item in self._waiting[keep:] if isinstance(item, np.ndarray)]
        samples = sum(len(item) for item in dropped)
        seconds = samples / self.rate + sum(item.seconds for item in self._waiting[keep:] if isinstance(item, Gap))
        self._waiting[keep:] = [Gap(seconds)] if seconds else []
        self._waiting_samples -= samples

    def replay(self) -> None:
        """The next segment takes what waited, in order: audio, and the actions deferred behind
        it, until one of them makes its input final; the rest waits for the segment after. Waiting
        audio fits its budget (it was counted against it), so nothing waits here."""
        waiting, self._waiting, self._waiting_samples = self._waiting, [], 0
        for index, item in enumerate(waiting):
            if self.state is State.DRAINING:
                self._waiting = waiting[index:]
                self._waiting_samples = sum(len(part) for part in self._waiting if isinstance(part, np.ndarray))
                return
            if isinstance(item, np.ndarray):
                self._take_now(item)
            elif isinstance(item, Gap):  # only ever first, or behind a deferred action
                self.offset += item.seconds
            else:
                item()

    def _take_now(self, samples: np.ndarray) -> None:
        segment = self.current or self.open()
        if not segment.add(samples):
            raise ProtocolError("message_too_large", "too much audio sent while the previous segment finishes")
        self._check_limit(segment)

    def finalize(self) -> None:
        if self.current is not None:
            self.current.finalize()
            self.changed.set()

    def finish(self, segment: Segment) -> None:
        """Its final result was delivered: free its slot; the next segment starts after its audio."""
        self._advance(segment)

    def discard(self) -> None:
        """Drop the current segment, unfinished: free its slot; its audio counts as time passed."""
        if self.current is not None:
            self._advance(self.current)

    def close(self) -> None:
        """The connection ends: free the slot."""
        if self.current is not None:
            self._release(self.current)

    def _advance(self, segment: Segment) -> None:
        self._release(segment)
        self.offset = segment.offset + segment.input_seconds
        if segment is self.current:
            self.current = None

    def _release(self, segment: Segment) -> None:
        """Free its slot (cancelling it if unfinished), and learn how long it held the slot."""
        if segment.release() and segment.admitted_at is not None:
            self.ctx.estimator.record_hold(trio.current_time() - segment.admitted_at)
