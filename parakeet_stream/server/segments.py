"""The segments of one connection, one at a time.

The native protocol runs one segment per connection. The others run several in turn, one per
utterance the client ends (Deepgram's Finalize, OpenAI's commit, vLLM's commit final): once a
segment's input is final it drains (the engine transcribes what is left), and the next audio
opens a new segment. Here, once for every such protocol:
- audio sent while the previous segment drains waits (within the audio budget) for the next
  one, and so do the protocol's actions queued behind it (`defer`), in order;
- times count from the connection: a segment starts at `offset`, the audio before it.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np
import trio

from .. import audio
from .channel import ChannelClosed
from .codes import ProtocolError
from .guard import backlog_samples
from .segment import Segment
from .wakeup import Wakeup

if TYPE_CHECKING:
    from .channel import Channel
    from .context import ServerContext

# while reading is paused for back-pressure, how often to look whether the client is gone
PEER_CHECK_S = 0.1

Deferred = Callable[[], Awaitable[None]]


class Segments:
    def __init__(self, ctx: ServerContext, channel: Channel, metric: str, several: bool) -> None:
        self.ctx = ctx
        self.several = several  # False: one segment per connection, audio after its end refused
        self.current: Segment | None = None
        self.changed = Wakeup()  # the engine has news for the current segment (results, queue position)
        self.progress = Wakeup()  # the engine consumed audio
        self.rate = audio.SAMPLE_RATE  # of the client's audio
        self.offset = 0.0  # connection seconds where the current (or next) segment starts
        self.end_after: str | None = None  # end the connection for this reason once the current segment is done
        self._channel = channel
        self._metric = metric
        self._budget = backlog_samples(ctx.config)
        self._held: list[np.ndarray | Deferred] = []  # waiting for the next segment, in order
        self._held_samples = 0
        self._dropped_seconds = 0.0  # held audio dropped: counts as passed time

    # -- state the connection and the protocols look at ---------------------------------
    @property
    def draining(self) -> bool:
        """The current segment's input is final; its last results are still to come."""
        return self.current is not None and self.current.final

    @property
    def holding(self) -> bool:
        """Audio waits for the next segment."""
        return any(isinstance(item, np.ndarray) for item in self._held)

    @property
    def received_seconds(self) -> float:
        """All the audio the client sent."""
        current = 0.0 if self.current is None else self.current.input_seconds
        return self.offset + current + self._dropped_seconds + self._held_samples / self.rate

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
            self.ctx.engine, self.changed, lookahead, self.rate, config.max_stream_seconds, self.offset, self._budget
        )
        self.ctx.metrics.streams.labels(self._metric).inc()
        return self.current

    async def push(self, samples: np.ndarray) -> None:
        """Add audio to the current segment (opened if there is none), or hold it while the
        previous one drains. Over the audio budget, wait: reading is paused, so the client is
        slowed by flow control."""
        segment = self.current
        if segment is None:
            segment = self.open()
        elif segment.final_at is not None and self.several:
            self._hold(samples)
            return
        while not segment.add(samples):
            segment.flush(force=segment.admitted_at is not None)
            with trio.move_on_after(PEER_CHECK_S):
                await self.progress.wait()
            if self._channel.peer_gone():  # nobody reads the socket now: look at it directly
                raise ChannelClosed()
        if segment.limit_reached:
            self.end_after = "max_stream_seconds"

    def _hold(self, samples: np.ndarray) -> None:
        held = self._held_samples + len(samples)
        if -(-held * self.ctx.engine.info.sample_rate // self.rate) > self._budget:
            raise ProtocolError("message_too_large", "too much audio sent while the previous segment finishes")
        self._held.append(samples)
        self._held_samples = held

    def defer(self, action: Deferred) -> None:
        """While a segment drains: run `action` after the audio already waiting has gone to the next one."""
        self._held.append(action)

    def drop_held(self) -> None:
        """Forget what waits for the next segment (its audio still counts as time passed)."""
        self._dropped_seconds += self._held_samples / self.rate
        self._held, self._held_samples = [], 0

    async def replay(self) -> None:
        """The next segment takes what waited, in order: audio, and the actions deferred behind it."""
        held, self._held, self._held_samples = self._held, [], 0
        for item in held:
            await (self.push(item) if isinstance(item, np.ndarray) else item())

    def flush(self) -> None:
        if self.current is not None:
            self.current.flush()

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
        self.offset = segment.offset + segment.input_seconds + self._dropped_seconds
        self._dropped_seconds = 0.0
        if segment is self.current:
            self.current = None

    def _release(self, segment: Segment) -> None:
        held = segment.release()
        if held is not None:
            self.ctx.estimator.record_hold(held)
