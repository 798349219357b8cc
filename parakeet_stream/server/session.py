"""One client connection: a reader and a writer loop around (at most) one engine stream.

Subclasses speak a protocol (`protocols/`); this class owns admission, results
delivery, back-pressure, timeouts, shutdown and the close policy.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import numpy as np
import trio

from . import wire
from .codes import POLICIES, ProtocolError, error_body, ws_close_code
from .context import ServerContext
from .guard import MAX_BATCH_MESSAGES, TokenBucket, backlog_samples, message_units
from .stream import EngineStream, Wakeup

log = logging.getLogger(__name__)

# close reasons after which nothing can be sent
SILENT_ENDS = ("vanished", "slow_consumer")
# while reading is paused for back-pressure, how often to look whether the client is gone
PEER_CHECK_S = 0.1


class ChannelClosed(Exception):
    """The peer is gone (EOF, reset, WebSocket closed)."""


class SlowConsumer(Exception):
    """A send did not complete within the send timeout: the client is not reading."""


class Channel(Protocol):
    transport: str  # "tcp" or "ws"

    async def receive(self) -> str | bytes:
        """The next message: str = JSON text, bytes = a binary WebSocket frame.

        Raises ChannelClosed at end of input and ProtocolError for framing errors.
        """

    def receive_buffered(self) -> str | bytes | None:
        """The next message if it is already buffered (no waiting), else None."""

    def peer_gone(self) -> bool:
        """Whether the connection is known to be reset, without reading from it."""

    async def send(self, data: bytes) -> None:
        """Send one encoded JSON message; raises ChannelClosed or SlowConsumer."""

    async def close(self, reason: str, code: int) -> None:
        """Close gracefully (code/reason used by WebSocket), at most ~1 s."""

    async def abort(self) -> None:
        """Drop the connection at once (a partial send may be pending)."""


class Session:
    protocol = "native"

    def __init__(self, ctx: ServerContext, channel: Channel) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.channel = channel
        self.wakeup = Wakeup()  # results or queue position changed
        self.progress = Wakeup()  # the engine consumed audio
        self.stream: EngineStream | None = None
        self.pending_end: str | None = None  # close once the current stream's final is sent
        self.held_audio: list[np.ndarray] = []  # sent while a finalized stream drains (hold_while_draining)
        self.end_reason: str | None = None
        self._end_message: dict | None = None
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._idle_scope = trio.CancelScope()
        self._last_position = 0
        self._rate = TokenBucket(self.config.max_messages_per_second)

    # -- protocol hooks ---------------------------------------------------------------
    async def on_open(self) -> None:
        """Before the first read (open a stream, apply URL parameters)."""

    def split(self, frame: str | bytes) -> Iterable[str | bytes]:
        return (frame,)

    def after_batch(self) -> None:
        """After the messages of one wake-up: hand coalesced audio to the engine."""
        if self.stream is not None:
            self.stream.flush()

    async def on_unit(self, unit: str | bytes) -> None:
        raise NotImplementedError

    async def on_admitted(self, stream: EngineStream) -> None:
        raise NotImplementedError

    async def on_result(self, stream: EngineStream, result, text: str) -> None:
        raise NotImplementedError

    async def on_stream_done(self, stream: EngineStream, error: str | None) -> None:
        raise NotImplementedError

    def error_message(self, code: str, message: str) -> dict:
        return error_body(code, message)

    def closed_message(self, reason: str) -> dict | None:
        return {"type": "closed", "reason": reason}

    def queued_message(self, position: int, estimated_wait_s: float | None) -> dict | None:
        """While waiting for a slot (None: the protocol has no such message)."""
        return {"type": "queued", "position": position, "estimated_wait_s": estimated_wait_s}

    # -- lifecycle --------------------------------------------------------------------
    async def run(self) -> None:
        self.ctx.open_sessions += 1
        self.ctx.metrics.connections.labels(self.protocol).inc()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._read_loop)
                nursery.start_soon(self._guard, self._write_loop)
                nursery.start_soon(self._watch_shutdown)
        except Exception:
            log.exception("connection handler failed")
            self.end("internal_error", self.error_message("internal_error", "internal server error"))
        finally:
            with trio.CancelScope(shield=True):
                self._retire(self.stream)
                await self._close()
            self.ctx.open_sessions -= 1
            self.ctx.metrics.connections.labels(self.protocol).dec()

    def end(self, reason: str, message: dict | None = None) -> None:
        """Close the connection (first reason wins); `message` is sent before closing."""
        if self.end_reason is None:
            self.end_reason, self._end_message = reason, message
            if reason in POLICIES:
                self.ctx.metrics.error(reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def end_after_final(self, reason: str) -> None:
        self.end(reason, self.closed_message(reason))

    async def send(self, message: dict) -> None:
        await self.channel.send(wire.dumps(message))

    async def _guard(self, loop: Callable[[], Awaitable[None]]) -> None:
        try:
            await loop()
        except ChannelClosed:
            self.end("vanished")
        except SlowConsumer:
            self.end("slow_consumer")
        except ProtocolError as exc:
            self.end(exc.code, self.error_message(exc.code, exc.message))

    async def _close(self) -> None:
        reason = self.end_reason or "vanished"
        if reason in SILENT_ENDS:
            await self.channel.abort()
            return
        try:
            if self._end_message is not None:
                with trio.fail_after(1):
                    await self.send(self._end_message)
        except (ChannelClosed, SlowConsumer, trio.TooSlowError):
            await self.channel.abort()
            return
        await self.channel.close(reason, ws_close_code(reason))

    # -- reading ----------------------------------------------------------------------
    async def _read_loop(self) -> None:
        with self._reader_scope:
            await self.on_open()
            while True:
                try:
                    frame = await self._receive()
                except ChannelClosed:
                    if self._half_closed_after_final():
                        return
                    raise
                await self._batch(frame)

    async def _batch(self, frame: str | bytes | None) -> None:
        """Handle `frame` and the messages already buffered behind it (at most
        MAX_BATCH_MESSAGES), then flush audio once and spend the rate budget."""
        handled = units = 0
        while frame is not None:
            units += message_units(len(frame))
            for unit in self.split(frame):
                await self._handle(unit)
                handled += 1
            frame = self.channel.receive_buffered() if handled < MAX_BATCH_MESSAGES else None
        self.after_batch()
        await self._rate.spend(max(units, handled))
        if handled >= MAX_BATCH_MESSAGES:  # more may be buffered: let other connections run first
            await trio.lowlevel.checkpoint()

    async def _handle(self, unit: str | bytes) -> None:
        try:
            await self.on_unit(unit)
        except ProtocolError as exc:
            if exc.policy.closes:
                raise
            self.ctx.metrics.error(exc.code)
            await self.send(self.error_message(exc.code, exc.message))

    async def _receive(self) -> str | bytes:
        with trio.CancelScope() as self._idle_scope:
            self._arm_idle()
            return await self.channel.receive()
        raise ProtocolError("idle_timeout", f"no message for {self.config.idle_timeout:g} s")

    def _arm_idle(self) -> None:
        """(Re)start the idle clock; call whenever _idle_counts() may have changed."""
        counts = self._idle_counts()
        self._idle_scope.deadline = trio.current_time() + self.config.idle_timeout if counts else math.inf

    def _idle_counts(self) -> bool:
        """Idle time counts unless the client is waiting on us (queued, or final pending)."""
        stream = self.stream
        if stream is None:
            return True
        return not stream.finalized and stream.admitted_at is not None

    def _half_closed_after_final(self) -> bool:
        # A TCP client may shut down its sending side after its final and still read.
        stream = self.stream
        return self.channel.transport == "tcp" and stream is not None and stream.finalized

    # -- audio ------------------------------------------------------------------------
    def open_stream(self, lookahead: tuple[int, int] | None, input_rate: int) -> EngineStream:
        stream = EngineStream(
            self.ctx.engine, self.wakeup, lookahead, input_rate, self.config.max_stream_seconds
        )
        self.ctx.metrics.streams.labels(self.protocol).inc()
        self._last_position = 0
        return stream

    async def push(self, stream: EngineStream, samples: np.ndarray) -> None:
        """Add audio within the stream's budget: wait (reading paused, so the client is slowed
        by flow control) until what the stream holds plus this packet fits."""
        budget = backlog_samples(self.config)
        incoming = stream.model_samples(len(samples))
        if incoming > budget:
            seconds = budget / self.ctx.engine.sample_rate
            raise ProtocolError("message_too_large", f"one message may carry at most {seconds:g} s of audio")
        while stream.held_samples + incoming > budget and not stream.finished:
            stream.flush(force=stream.admitted_at is not None)
            with trio.move_on_after(PEER_CHECK_S):
                await self.progress.wait()
            if self.channel.peer_gone():  # nobody reads the socket now: look at it directly
                raise ChannelClosed()
        stream.add(samples)
        if stream.limit_reached:
            self.pending_end = "max_stream_seconds"

    def hold_while_draining(self, samples: np.ndarray) -> bool:
        """For protocols that run several engine streams in turn on one connection: while the
        current stream drains after its end, audio waits (within the stream's audio budget) for
        the next one. True when `samples` were held; the protocol pushes `held_audio` later."""
        stream = self.stream
        if stream is None or not stream.finalized:
            return False
        held = sum(len(w) for w in self.held_audio) + len(samples)
        if stream.model_samples(held) > backlog_samples(self.config):
            raise ProtocolError("message_too_large", "too much audio sent while the previous segment finishes")
        self.held_audio.append(samples)
        return True

    # -- writing ----------------------------------------------------------------------
    async def _write_loop(self) -> None:
        while True:
            await self.wakeup.wait()
            await self._flush()

    async def _flush(self) -> None:
        stream = self.stream
        if stream is None or stream.finished or not await self._admitted(stream):
            return
        if stream is not self.stream:  # replaced while we were sending (start message)
            return
        results = stream.collect()
        collected_at = trio.current_time()
        self.progress.set()
        for result in results:
            if result.latency is not None:  # the time spent here before sending counts too
                result.latency += trio.current_time() - collected_at
            text = stream.absorb(result)
            await self.on_result(stream, result, text)
            self._observe(stream, result)
            if result.is_final:
                self._retire(stream)
                await self.on_stream_done(stream, result.error)
                self._arm_idle()

    async def _admitted(self, stream: EngineStream) -> bool:
        if stream.admitted_at is not None:
            return True
        position = stream.position()
        if position > 0:
            if position != self._last_position:
                self._last_position = position
                slots = self.ctx.engine.stats()["max_num_streams"]
                message = self.queued_message(position, self.ctx.estimator.estimate(position, slots))
                if message is not None:
                    await self.send(message)
            return False
        stream.admitted_at = trio.current_time()
        stream.flush(force=True)  # audio received while queued
        self.progress.set()
        self._arm_idle()
        await self.on_admitted(stream)
        return True

    def _observe(self, stream: EngineStream, result) -> None:
        metrics = self.ctx.metrics
        if result.latency is not None:
            metrics.chunk_latency.observe(result.latency)
        if result.is_final and stream.finalized_at is not None:
            metrics.time_to_final.observe(trio.current_time() - max(stream.finalized_at, stream.admitted_at))

    def _retire(self, stream: EngineStream | None) -> None:
        """The stream is over (final collected, or the connection ends): free its slot."""
        held = None if stream is None else stream.release()
        if held is not None:
            self.ctx.estimator.record_hold(held)

    # -- shutdown ---------------------------------------------------------------------
    async def _watch_shutdown(self) -> None:
        # Draining: a connection without an active stream (queued, or between utterances) is told
        # to reconnect at once; an active stream goes on until it ends or the drain timeout passes,
        # then it is finalized. Either way the connection closes with `server_shutdown`.
        await self.ctx.shutdown.wait()
        if not self._streaming():
            self._reader_scope.cancel()
            self.end_after_final("server_shutdown")
            return
        self.pending_end = self.pending_end or "server_shutdown"
        await self.ctx.finish.wait()
        self._reader_scope.cancel()
        if not self._streaming():
            self.end_after_final("server_shutdown")
            return
        self.stream.finalize()
        self.wakeup.set()

    def _streaming(self) -> bool:
        stream = self.stream
        return stream is not None and not stream.finished and stream.position() == 0
