"""A protocol's side of one connection: the base class of every protocol's session.

A protocol translates, and only that: `on_message` turns a client message into calls on its
segments (push audio, finalize, open, ...), and the `on_*` hooks turn what the engine sends back
into its messages. This class delivers the engine's news to those hooks, the same way for every
protocol: queue positions, admission, each result (for a failed one, the protocol's error
message first), then the segment's end and what waited for the next segment.

Everything but pushing audio (which may wait for the engine) is synchronous: a decision and the
messages it posts (`post`, see connection.py) happen in one step, with nothing awaited between.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from ..transport.codes import error_body
from .segments import Segment, Segments

if TYPE_CHECKING:
    from ...engine import StreamResult
    from .connection import Connection

log = logging.getLogger(__name__)


class Session:
    several_segments = True  # False: one segment per connection, which ends with it
    announces_queue = False  # sends `queued` messages while waiting for a slot
    sends_failed_results = False  # a failed result goes to on_result too, after the error message

    def __init__(self, connection: Connection, options: Any) -> None:
        ctx = connection.ctx
        self.connection = connection
        self.config = ctx.config
        self.info = ctx.engine.info
        self.segments = Segments(ctx, connection.channel, connection.protocol.metric, self.several_segments)
        self.results_sent = 0
        self.post = connection.post  # (message: dict): queued for the client, in order

    # -- what a protocol implements ------------------------------------------------------
    def open(self) -> None:
        """Before the first message is read."""

    async def on_message(self, message: str | bytes) -> None:
        raise NotImplementedError

    def on_admitted(self, segment: Segment) -> None:
        """The segment got a slot."""

    def on_result(self, segment: Segment, result: StreamResult) -> None:
        """One engine result, in order (absorbed: `segment.text` includes it)."""

    def on_segment_finished(self, segment: Segment) -> None:
        """The segment's final result was delivered, its slot is free."""

    def error_message(self, code: str, message: str) -> dict:
        return error_body(code, message)

    def last_message(self, reason: str) -> dict | None:
        """What the server sends before it closes the connection on its own (None: nothing)."""
        return None

    # -- delivery ------------------------------------------------------------------------
    def deliver(self) -> None:
        """Post what the engine has for the current segment (on every wake-up of the writer)."""
        segment = self.segments.current
        if segment is None or segment.finished or (segment.admitted_at is None and not self._admit(segment)):
            return
        results = segment.collect()
        collected_at = trio.current_time()
        self.segments.progress.set()
        for result in results:
            if result.latency is not None:  # the time spent here before sending counts too
                result.latency += trio.current_time() - collected_at
                self.connection.ctx.metrics.chunk_latency.observe(result.latency)
            segment.absorb(result)
            if result.error:
                self.post(self.error_message(result.error, "inference failed for this stream"))
            if not result.error or self.sends_failed_results:
                self.on_result(segment, result)
            self.results_sent += 1
            if result.is_final:
                self._finish(segment, result.error)

    def _admit(self, segment: Segment) -> bool:
        ctx = self.connection.ctx
        position = segment.position()
        if position > 0:
            if segment.queued_at is None:  # a protocol without a queued message waits silently: the log says it
                segment.queued_at = trio.current_time()
                log.info("%s waits for a slot: queue position %d%s", self.connection.where, position,
                         "" if self.announces_queue else " (its API has no message to tell the client)")
            if position != segment.announced_position and self.announces_queue:
                wait = ctx.estimator.estimate(position, ctx.engine.stats()["capacity"])
                self.post({"type": "queued", "position": position, "estimated_wait_s": wait})
            segment.announced_position = position
            return False
        if not segment.admit():  # (the queue moved on since)
            return False
        if segment.queued_at is not None:
            waited = trio.current_time() - segment.queued_at
            ctx.metrics.queue_wait.labels(self.connection.protocol.metric).observe(waited)
            log.info("%s got a slot after %.1f s in the queue", self.connection.where, waited)
        self.segments.progress.set()
        self.connection.rearm_idle()
        self.on_admitted(segment)
        return True

    def _finish(self, segment: Segment, error: str | None) -> None:
        connection, segments = self.connection, self.segments
        if segment.final_at is not None:
            since = max(segment.final_at, segment.admitted_at)
            connection.ctx.metrics.time_to_final.observe(trio.current_time() - since)
        segments.finish(segment)
        if error:
            connection.end(error)
            return
        self.on_segment_finished(segment)
        if segments.end_after:
            connection.end(segments.end_after, self.last_message(segments.end_after))
        elif not segments.several:
            connection.end("completed")
        else:
            segments.replay()
        connection.rearm_idle()
