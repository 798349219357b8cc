"""The doors a client comes in by: the TCP and the WebSocket listeners. A connection is routed
to the protocol the registry (registry.py) names for its door, path and query, put
through that protocol's handshake, and served as a Connection on its channel."""
from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

import trio
from trio_websocket import WebSocketRequest

from ..streams import wire
from ..streams.connection import Connection
from ..streams.protocol import Handshake, Refusal
from ..transport import ws_adapter
from ..transport.channel import ChannelClosed, SlowConsumer
from ..transport.codes import error_body
from ..transport.tcp import TcpChannel
from ..transport.websocket import WsChannel
from . import registry

if TYPE_CHECKING:
    from ..context import ServerContext

MAX_HANDSHAKE_BYTES = 16384  # request line and headers, as on the HTTP port (larger: 431)


async def handle_tcp(ctx: ServerContext, stream: trio.SocketStream) -> None:
    channel = TcpChannel(stream, ctx.config.max_message_bytes, ctx.config.send_timeout)
    protocol = registry.find("tcp", "", {})
    try:
        outcome = await protocol.handshake(ctx, channel)
    except BaseException:  # cancelled at the end of a drain, or a bug: the socket is closed all the same
        await channel.abort()
        raise
    if outcome is None:  # the client is gone
        await channel.abort()
    elif isinstance(outcome, Refusal):
        await _refuse_tcp(ctx, channel, outcome)
    else:
        await Connection(ctx, channel, protocol, outcome.options).run(outcome.first)


async def _refuse_tcp(ctx: ServerContext, channel: TcpChannel, refusal: Refusal) -> None:
    """The refusal's error message, then close."""
    ctx.metrics.error(refusal.code)
    try:
        with trio.fail_after(1):
            await channel.send(wire.dumps(refusal.body or error_body(refusal.code, refusal.message)))
    except (ChannelClosed, SlowConsumer, trio.TooSlowError):
        await channel.abort()
        return
    await channel.close(refusal.code, 1008)


async def handle_websocket(ctx: ServerContext, request: WebSocketRequest) -> None:
    outcome = _malformed(request)
    if outcome is None:
        target = urlsplit(request.path)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        params = tuple(parse_qsl(target.query, keep_blank_values=True))
        query = dict(parse_qsl(target.query))
        hello = Handshake(target.path, query, headers, tuple(request.proposed_subprotocols), params)
        protocol = registry.find("ws", hello.path, hello.query)
        outcome = protocol.handshake(ctx, hello)
    if isinstance(outcome, Refusal):
        ctx.metrics.error(outcome.code)
        await request.reject(outcome.status, body=wire.dumps(outcome.body or error_body(outcome.code, outcome.message)))
        await ws_adapter.close_rejected(request)
        return
    ws = await request.accept(subprotocol=outcome.subprotocol)
    await Connection(ctx, WsChannel(ws, ctx.config.send_timeout), protocol, outcome.options).run()


def _malformed(request: WebSocketRequest) -> Refusal | None:
    size = len(request.path) + sum(len(k) + len(v) + 4 for k, v in request.headers)
    if size > MAX_HANDSHAKE_BYTES:
        return Refusal(431, "bad_request", "request header fields too large")
    try:
        urlsplit(request.path)
    except ValueError:  # e.g. an unclosed IPv6 bracket: "//[x/"
        return Refusal(400, "bad_request", "malformed request target")
    return None
