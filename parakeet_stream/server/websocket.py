"""WebSocket transport: handshake checks, routing, and the message channel."""
from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest

from . import jsonio, messages
from .auth import bearer_token, key_ok, origin_ok
from .channel import ChannelClosed, SlowConsumer
from .codes import ProtocolError
from .native import NativeSession
from .realtime import RealtimeSession

if TYPE_CHECKING:
    from .context import ServerContext

REALTIME_PATH = "/v1/realtime"


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
    target = urlsplit(request.path)
    query = dict(parse_qsl(target.query))
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
    refusal = _refusal(ctx, headers, query)
    if refusal is not None:
        ctx.metrics.error(refusal[1])
        await request.reject(refusal[0], body=jsonio.dumps(messages.error(*refusal[1:])))
        return
    ws = await request.accept()
    channel = WsChannel(ws, ctx.config.send_timeout)
    session = RealtimeSession if target.path.rstrip("/") == REALTIME_PATH else NativeSession
    await session(ctx, channel, query).run()


def _refusal(ctx: ServerContext, headers: dict[str, str], query: dict) -> tuple[int, str, str] | None:
    if not origin_ok(ctx.config.allowed_origins, headers.get("origin")):
        return 403, "forbidden_origin", "this Origin is not allowed"
    if not key_ok(ctx.config.api_key, bearer_token(headers) or query.get("api_key")):
        return 401, "unauthorized", "a valid API key is required"
    return None
