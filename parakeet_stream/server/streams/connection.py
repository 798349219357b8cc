"""One client connection: a reader and a writer loop around its protocol's session.

The connection owns what every protocol shares: reading (batches, the message rate, the idle
timeout), writing, how it ends (error codes and their close policy, a vanished or slow client)
and the drain at shutdown. It logs one line when it opens and one when it closes (access.py).

Writing: the session never awaits a send. Whatever it decides (a transition of its state, on a
client message in the reader or on engine news in the writer) it posts the messages that go
with it in the same step (`post`, synchronous), into one ordered outbox that only the writer
sends from. So a transition and its messages are atomic, and messages leave in the order their
transitions happened, whichever task made them. A client mistake is answered the same way from
either task (`answer`): its protocol's error message, and the end of the connection if the
code's policy closes it. The outbox is bounded: past OUTBOX_BYTES the reader stops reading until
the client has read what it was sent.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio

from ..transport.channel import Channel, ChannelClosed, SlowConsumer
from ..transport.codes import ProtocolError
from ..transport.wakeup import Wakeup
from . import access, wire
from .guard import MAX_BATCH_MESSAGES, OUTBOX_BYTES, TokenBucket, message_units
from .segments import State

if TYPE_CHECKING:
    from ..context import ServerContext
    from .protocol import Protocol

log = logging.getLogger(__name__)

SILENT_ENDS = ("vanished", "slow_consumer")  # nothing can be sent after these


class Connection:
    def __init__(self, ctx: ServerContext, channel: Channel, protocol: Protocol, options: Any) -> None:
        self.ctx = ctx
        self.channel = channel
        self.protocol = protocol
        self.session = protocol.session(self, options)
        self.segments = self.session.segments
        self.end_reason: str | None = None
        self._peer_gone = False  # the client closed its side: nothing more can reach it
        self._outbox: deque[bytes] = deque()
        self.outbox_bytes = 0
        self._sent = Wakeup()  # the writer sent what the outbox held
        self._delivering = False  # the writer is posting the engine's news: it sends next, no wake-up needed
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._idle_scope = trio.CancelScope()
        self._rate = TokenBucket(ctx.config.max_messages_per_second)
        self.where = f"peer={channel.peer} door={channel.door} protocol={protocol.name}"  # (the access log's words)

    async def run(self, first: str | None = None) -> None:
        """Serve until the connection ends; `first`: a message the handshake already read."""
        ctx, channel, label = self.ctx, self.channel, self.protocol.metric
        where = access.opened(channel.peer, channel.door, self.protocol.name)
        ctx.open_sessions += 1
        ctx.metrics.connections.labels(label).inc()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._read_loop, first)
                nursery.start_soon(self._write_loop)
                nursery.start_soon(self._watch_shutdown)
        except Exception:
            log.exception("connection handler failed")
            self.end("internal_error", self.session.error_message("internal_error", "internal server error"))
        finally:
            with trio.CancelScope(shield=True):
                self.segments.close()
                await self._close()
            ctx.open_sessions -= 1
            ctx.connection_closed.set()
            ctx.metrics.connections.labels(label).dec()
            access.closed(where, self._reason(), self.segments.received_seconds, self.session.results_sent)

    def _reason(self) -> str:
        """Why it ended; no reason given: it was cut by the server stopping without waiting."""
        return self.end_reason or ("server_shutdown" if self.ctx.shutdown.is_set() else "vanished")

    def end(self, reason: str, message: dict | None = None) -> None:
        """End the connection (the first reason wins); `message` is sent last, before closing."""
        if self.end_reason is None:
            if message is not None:
                self.post(message)
            self.end_reason = reason
            if self.protocol.policy(reason) is not None:
                self.ctx.metrics.error(reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def post(self, message: dict) -> None:
        """Queue a message for the client, after those posted before (none once the connection ends)."""
        if self.end_reason is None:
            if not self._outbox and not self._delivering:  # else the writer is on its way
                self.segments.changed.set()
            data = wire.dumps(message)
            self._outbox.append(data)
            self.outbox_bytes += len(data)

    def answer(self, exc: ProtocolError) -> None:
        """A client's mistake, from whichever task met it: its protocol's error message, and the
        end of the connection if the code's policy closes it."""
        message = self.session.error_message(exc.code, exc.message)
        if self.protocol.policy(exc.code).closes:
            self.end(exc.code, message)
        else:
            self.ctx.metrics.error(exc.code)
            self.post(message)

    def rearm_idle(self) -> None:
        """(Re)start the idle clock: idle time counts unless the client is waiting on us."""
        counts = not self.segments.waiting_on_server
        self._idle_scope.deadline = trio.current_time() + self.ctx.config.idle_timeout if counts else math.inf

    @contextlib.contextmanager
    def _ends_on_errors(self) -> Iterator[None]:
        try:
            yield
        except ChannelClosed:  # the client left: done, or in the middle of a segment
            self._peer_gone = True
            self.end("completed" if self.segments.state is State.IDLE and not self.segments.audio_waiting else "vanished")
        except SlowConsumer:
            self.end("slow_consumer")
        except ProtocolError as exc:
            self.answer(exc)

    # -- reading -------------------------------------------------------------------------
    async def _read_loop(self, first: str | None) -> None:
        with self._reader_scope, self._ends_on_errors():
            self.session.open()
            if first is not None:
                await self._batch(first)
            while True:
                try:
                    frame = await self._receive()
                except ChannelClosed:
                    # a TCP client may shut down its sending side after its final and still read
                    if self.channel.door == "tcp" and self.segments.draining:
                        return
                    raise
                await self._batch(frame)

    async def _batch(self, frame: str | bytes | None) -> None:
        """Handle `frame` and the messages already buffered behind it (at most
        MAX_BATCH_MESSAGES), then hand the audio to the engine once and spend the rate budget."""
        session, split = self.session, self.protocol.split
        handled = units = 0
        while frame is not None:
            units += message_units(len(frame))
            for message in split(frame) if split else (frame,):
                if self.end_reason is not None:  # ended, maybe by the writer meanwhile: read no more
                    return
                try:
                    await session.on_message(message)
                except ProtocolError as exc:
                    self.answer(exc)
                handled += 1
            frame = self.channel.receive_buffered() if handled < MAX_BATCH_MESSAGES else None
        if (segment := self.segments.current) is not None:  # the batch's audio to the engine at once
            segment.flush()
        await self._rate.spend(max(units, handled))
        while self.outbox_bytes > OUTBOX_BYTES:  # the client does not read what it is sent
            await self._sent.wait()
        if handled >= MAX_BATCH_MESSAGES:  # more may be buffered: let other connections run first
            await trio.lowlevel.checkpoint()

    async def _receive(self) -> str | bytes:
        with trio.CancelScope() as self._idle_scope:
            self.rearm_idle()
            return await self.channel.receive()
        raise ProtocolError("idle_timeout", f"no message for {self.ctx.config.idle_timeout:g} s")

    # -- writing and ending --------------------------------------------------------------
    async def _write_loop(self) -> None:
        with self._ends_on_errors():
            while True:
                await self.segments.changed.wait()
                self._delivering = True
                try:
                    self.session.deliver()
                except ProtocolError as exc:  # met in an action that waited for the next segment
                    self.answer(exc)
                finally:
                    self._delivering = False
                await self._flush()

    async def _flush(self) -> None:
        while self._outbox:
            data = self._outbox.popleft()
            self.outbox_bytes -= len(data)
            # whole or not at all: an end meanwhile takes effect after it (a send gives up
            # after the send timeout on its own)
            with trio.CancelScope(shield=True):
                await self.channel.send(data)
        self._sent.set()

    async def _close(self) -> None:
        reason = self._reason()
        if reason in SILENT_ENDS or self._peer_gone:
            await self.channel.abort()
            return
        try:
            with trio.fail_after(self.ctx.config.send_timeout):
                await self._flush()  # the messages posted before the end, the end's own last
        except (ChannelClosed, SlowConsumer, trio.TooSlowError):
            await self.channel.abort()
            return
        await self.channel.close(reason, self.protocol.close_code(reason))

    async def _watch_shutdown(self) -> None:
        # Draining: a connection without an active segment (queued, or between utterances) is told
        # to reconnect at once; an active one goes on until it ends or the drain timeout passes,
        # then its input is made final. Either way the connection ends with `server_shutdown`.
        ctx, segments = self.ctx, self.segments
        await ctx.shutdown.wait()
        if segments.active:
            segments.end_after = segments.end_after or "server_shutdown"
            await ctx.drain_expired.wait()
        self._reader_scope.cancel()
        if segments.active:
            segments.finalize()
        else:
            self.end("server_shutdown", self.session.last_message("server_shutdown"))
