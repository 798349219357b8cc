"""WebSocket transport: handshake checks, routing, and the message channel."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

import trio
from trio_websocket import (
    CloseReason,
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
)
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection

from . import wire
from .codes import ProtocolError, error_body
from .guard import bearer_token, key_ok, origin_ok
from .protocols import deepgram
from .protocols.native import NativeSession
from .protocols.openai_realtime import OpenAIRealtimeSession
from .protocols.vllm import VllmRealtimeSession
from .session import ChannelClosed, SlowConsumer
from .tcp import TCP_CLOSE, TCP_CLOSE_WAIT, socket_state

if TYPE_CHECKING:
    from .context import ServerContext

REALTIME_PATH = "/v1/realtime"
MAX_HANDSHAKE_BYTES = 16384  # request line and headers, as on the HTTP port (larger: 431)


class WsChannel:
    transport = "ws"

    def __init__(self, ws: WebSocketConnection, send_timeout: float) -> None:
        self._ws = ws
        self._send_timeout = send_timeout

    async def receive(self) -> str | bytes:
        try:
            return await self._ws.get_message()
        except ConnectionClosed as exc:
            if exc.reason is not None and exc.reason.code == 1009:
                raise ProtocolError("message_too_large", "the message is too large") from None
            raise ChannelClosed() from None

    def receive_buffered(self) -> None:
        return None  # trio_websocket hands over one message at a time

    def peer_gone(self) -> bool:
        # trio_websocket keeps its transport private; without it there is nothing to look at
        sock = getattr(getattr(self._ws, "_stream", None), "socket", None)
        return sock is not None and socket_state(sock) in (TCP_CLOSE, TCP_CLOSE_WAIT)

    async def send(self, data: bytes) -> None:
        with trio.move_on_after(self._send_timeout) as scope:
            try:
                await self._ws.send_message(data.decode())
            except ConnectionClosed:
                raise ChannelClosed() from None
        if scope.cancelled_caught:
            raise SlowConsumer()

    async def close(self, reason: str, code: int) -> None:
        with trio.move_on_after(1):
            await self._ws.aclose(code, reason)
        await self.abort()

    async def abort(self) -> None:
        # aclose() under a cancelled scope skips the close handshake but still
        # closes the TCP stream.
        with trio.CancelScope() as scope:
            scope.cancel()
            await self._ws.aclose()


async def handle_request(ctx: ServerContext, request: WebSocketRequest) -> None:
    refusal = _malformed(request)
    if refusal is None:
        target = urlsplit(request.path)
        query = dict(parse_qsl(target.query))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        if target.path.rstrip("/") == deepgram.PATH:
            await _deepgram(ctx, request, headers, query)
            return
        refusal = _refusal(ctx, headers, query)
    if refusal is not None:
        await _reject(ctx, request, *refusal)
        return
    ws = await request.accept()
    channel = WsChannel(ws, ctx.config.send_timeout)
    if target.path.rstrip("/") != REALTIME_PATH:
        await NativeSession(ctx, channel, query).run()
    elif is_openai(query):
        await OpenAIRealtimeSession(ctx, channel).run()
    else:
        await VllmRealtimeSession(ctx, channel, query).run()


def is_openai(query: dict[str, str]) -> bool:
    """/v1/realtime speaks OpenAI's dialect when the URL says so, as the openai SDK's always
    does (`model=...` or `intent=transcription`); vLLM's clients send neither."""
    return query.get("intent") == "transcription" or "model" in query


async def _deepgram(ctx: ServerContext, request: WebSocketRequest, headers: dict[str, str], query: dict) -> None:
    """Deepgram's handshake: its key forms, and its error body for unsupported parameters."""
    key, subprotocol = deepgram.credentials(headers, list(request.proposed_subprotocols))
    refusal = _refusal(ctx, headers, {"api_key": key or query.get("api_key")})
    if refusal is not None:
        await _reject(ctx, request, *refusal)
        return
    try:
        options = deepgram.parse_options(query)
    except ProtocolError as exc:
        await _reject(ctx, request, 400, exc.code, exc.message, deepgram.handshake_error(exc))
        return
    ws = await request.accept(subprotocol=subprotocol)
    await deepgram.DeepgramSession(ctx, WsChannel(ws, ctx.config.send_timeout), options).run()


def _malformed(request: WebSocketRequest) -> tuple[int, str, str] | None:
    size = len(request.path) + sum(len(k) + len(v) + 4 for k, v in request.headers)
    if size > MAX_HANDSHAKE_BYTES:
        return 431, "bad_request", "request header fields too large"
    try:
        urlsplit(request.path)
    except ValueError:  # e.g. an unclosed IPv6 bracket: "//[x/"
        return 400, "bad_request", "malformed request target"
    return None


async def _reject(
    ctx: ServerContext, request: WebSocketRequest, status: int, code: str, message: str, body: dict | None = None
) -> None:
    ctx.metrics.error(code)
    await request.reject(status, body=wire.dumps(body or error_body(code, message)))
    # trio_websocket keeps a rejected connection open until the client closes it, so that
    # one client could hold any number of them: close it (through its private API, if there)
    close = getattr(getattr(request, "_connection", None), "_close_stream", None)
    if close is not None:
        await close()


def _refusal(ctx: ServerContext, headers: dict[str, str], query: dict) -> tuple[int, str, str] | None:
    if not origin_ok(ctx.config.allowed_origins, headers.get("origin")):
        return 403, "forbidden_origin", "this Origin is not allowed"
    if not key_ok(ctx.config.api_key, bearer_token(headers) or query.get("api_key")):
        return 401, "unauthorized", "a valid API key is required"
    return None


def _send_close_on_protocol_error() -> None:
    """RFC 6455 7.1.7: a malformed frame fails the connection with a close frame (1002, or
    1007 for a text frame that is not UTF-8). wsproto reports it as a CloseConnection event
    while the connection is still OPEN (a peer's close frame would have moved it on), and
    trio_websocket then drops the TCP connection without the frame; send it first."""
    original = WebSocketConnection._handle_close_connection_event

    async def handle(self: WebSocketConnection, event: CloseConnection) -> None:
        if self._wsproto.state is ConnectionState.OPEN:
            self._close_reason = CloseReason(event.code, event.reason or None)  # no sends from now on
            with contextlib.suppress(ConnectionClosed), trio.move_on_after(1):
                await self._send(CloseConnection(code=event.code, reason=event.reason))
        await original(self, event)

    WebSocketConnection._handle_close_connection_event = handle


_send_close_on_protocol_error()
