"""The WebSocket channel: one message per WebSocket message, on trio-websocket."""
from __future__ import annotations

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from . import ws_adapter
from .channel import TCP_CLOSE, TCP_CLOSE_WAIT, ChannelClosed, SlowConsumer, peer_name, socket_state
from .codes import ProtocolError


class WsChannel:
    door = "ws"

    def __init__(self, ws: WebSocketConnection, send_timeout: float) -> None:
        self._ws = ws
        self._send_timeout = send_timeout
        try:
            remote = ws.remote
        except OSError:  # already reset
            self.peer = "?"
        else:
            self.peer = peer_name(remote.address, remote.port) if hasattr(remote, "port") else str(remote)

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
        sock = ws_adapter.socket_of(self._ws)
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
