"""One HTTP request with a body (an upload) and its answer, on the HTTP port's h11 connection.

The body is read within its clocks and its size limit and handed to a sink in a worker thread
(parsing and disk writes never run on the Trio loop); the answer is one response or a stream of
server-sent events. A request answered before its body was read is drained for a moment after
the answer, so that the client reads the answer rather than a connection reset.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from urllib.parse import parse_qsl, urlsplit

import h11
import trio

from ...context import ServerContext
from ...streams import access
from ...transport.channel import RECEIVE_BYTES, half_close_and_drain, socket_peer

log = logging.getLogger(__name__)

WRITE_BATCH_BYTES = 256 * 1024  # bytes gathered before one worker-thread write
DRAIN_SECONDS = 2.0  # after answering early: how long the unread body is read and dropped


class UploadError(Exception):
    """A refused upload: HTTP status, a stable code, a message safe to show, the field at fault."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


class Exchange:
    def __init__(self, ctx: ServerContext, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request):
        self.ctx = ctx
        self._conn = conn
        self._stream = stream
        query = urlsplit(request.target.decode("latin-1")).query
        self.query = dict(parse_qsl(query))
        self.params = tuple(parse_qsl(query, keep_blank_values=True))  # every parameter, repeated and empty ones too
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        self.responded = False
        self.audio_seconds = 0.0  # transcribed (the access log's)
        self.results = 0  # engine results taken

    def check_length(self, limit: int) -> None:
        """413 from the head alone when Content-Length (a number: h11 checked) passes `limit`."""
        length = self.headers.get("content-length")
        if length is not None and int(length) > limit:
            raise _too_large(limit)

    async def read_body(self, write: Callable[[bytes], None], limit: int) -> int:
        """Hand the body to `write` (in a worker thread, in batches); returns its size. Raises
        UploadError: 413 past `limit`, 408 when a gap or the whole body takes too long, 400 when it
        ends early or its framing is broken."""
        self.check_length(limit)
        config = self.ctx.config
        if self._conn.they_are_waiting_for_100_continue:
            await self._send(self._conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        size, batch = 0, bytearray()
        with trio.move_on_after(config.upload_timeout) as whole:
            while (data := await self._next_data(config.idle_timeout)) is not None:
                size += len(data)
                if size > limit:
                    raise _too_large(limit)
                batch += data
                if len(batch) >= WRITE_BATCH_BYTES:
                    await trio.to_thread.run_sync(write, bytes(batch))
                    batch.clear()
            if batch:
                await trio.to_thread.run_sync(write, bytes(batch))
            return size
        assert whole.cancelled_caught
        raise UploadError(408, "upload_timeout", f"the body did not arrive within {config.upload_timeout:g} s")

    async def _next_data(self, idle: float) -> bytes | None:
        """The next piece of the body, None at its end."""
        while True:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError:
                raise UploadError(400, "bad_request", "the request body ended early or its framing is broken") from None
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                return None
            with trio.move_on_after(idle):
                self._conn.receive_data(await self._stream.receive_some(RECEIVE_BYTES))
                continue
            raise UploadError(408, "upload_timeout", f"no body bytes for {idle:g} s")

    async def while_connected(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` (after the body was read); should the client close its connection
        meanwhile, cancel it (its engine stream is freed) and raise BrokenResourceError. (A client
        that only shuts down its sending side looks the same: HTTP clients do not do that.) A client
        that closes once it has the whole answer is not gone: its close can be seen before `work` returns."""
        gone = finished = False
        error: Exception | None = None  # work's own, re-raised as itself (not in an ExceptionGroup)
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal gone
                try:
                    gone = not await self._stream.receive_some(1)  # bytes after the body: ignored
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    gone = True
                if gone:
                    nursery.cancel_scope.cancel()

            async def run() -> None:
                nonlocal error, finished
                try:
                    await work()
                    finished = True
                except Exception as exc:
                    error = exc
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(run)
        if error is not None:
            raise error
        if gone and not finished:
            raise trio.BrokenResourceError("the client closed its connection")

    async def respond(self, status: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.responded = True
        head = self._head(status, content_type, [("content-length", str(len(body))), *headers])
        await self._send(head + self._conn.send(h11.Data(data=body)) + self._conn.send(h11.EndOfMessage()))

    async def open_events(self) -> None:
        """Start a text/event-stream answer (chunked: its length is not known yet)."""
        self.responded = True
        await self._send(self._head(200, "text/event-stream", []))

    async def send_event(self, data: bytes) -> None:
        await self._send(self._conn.send(h11.Data(data=b"data: " + data + b"\n\n")))

    async def close_events(self) -> None:
        await self._send(self._conn.send(h11.EndOfMessage()))

    async def finish(self) -> None:
        """After the answer: if the body was not read to its end, half-close and drop what
        still arrives for at most DRAIN_SECONDS."""
        if self._conn.their_state is not h11.SEND_BODY:
            return
        await half_close_and_drain(self._stream, DRAIN_SECONDS)

    def _head(self, status: int, content_type: str, headers: Sequence[tuple[str, str]]) -> bytes:
        if content_type.startswith("text/") and "charset" not in content_type:
            content_type += "; charset=utf-8"
        fixed = [("content-type", content_type), ("connection", "close"), ("cache-control", "no-store"),
                 ("x-content-type-options", "nosniff")]
        return self._conn.send(h11.Response(status_code=status, headers=fixed + list(headers)))

    async def _send(self, data: bytes) -> None:
        """Send within the send timeout; a client that stops reading loses its connection."""
        with trio.move_on_after(self.ctx.config.send_timeout) as scope:
            await self._stream.send_all(data)
        if scope.cancelled_caught:
            raise trio.BrokenResourceError("the client stopped reading")


def _too_large(limit: int) -> UploadError:
    return UploadError(413, "file_too_large", f"the upload is larger than {limit / 2**20:g} MB", "file")


async def serve_upload(
    api: ModuleType, ctx: ServerContext, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request
) -> None:
    """Answer one upload with its API module's `handle`; a refusal in its shape (`refuse`), a bug
    as a 500 in that shape too; then drain what the client still sends."""
    exchange = Exchange(ctx, conn, stream, request)
    where, reason = access.opened(socket_peer(stream), "http", api.PROTOCOL), "vanished"
    try:
        await api.handle(ctx, exchange)
        reason = "completed"
    except UploadError as exc:
        reason = exc.code
        ctx.metrics.error(exc.code)
        await api.refuse(exchange, exc)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        raise  # the client left or stopped reading: there is nobody to answer
    except Exception:
        reason = "internal_error"
        log.exception("upload handler failed")
        ctx.metrics.error("internal_error")
        await api.refuse(exchange, UploadError(500, "internal_error", "internal server error"))
    finally:
        access.closed(where, reason, exchange.audio_seconds, exchange.results)
    await exchange.finish()
