"""Every use of trio-websocket's private insides, in one place.

trio-websocket has no public way to do four things the server needs, so this module reaches
into private names of the exact versions pinned in pyproject.toml (TESTED_WITH);
tests/test_ws_adapter.py fails when an upgrade renames or reshapes any of them:
- `install()`: send the close frame RFC 6455 requires when a client's frame is malformed, and
  never fail on what can no longer be sent once the server is closing;
- `socket_of()`: the TCP socket under a connection, to see a reset while reading is paused;
- `close_rejected()`: close the TCP connection of a refused handshake at once.
"""
from __future__ import annotations

import contextlib
import socket

import trio
from trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection, WebSocketRequest
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Event
from wsproto.utilities import LocalProtocolError

TESTED_WITH = {"trio-websocket": "0.12.2", "wsproto": "1.3.2"}

_upstream_close_handler = WebSocketConnection._handle_close_connection_event
_upstream_send = WebSocketConnection._send


async def _close_handler(self: WebSocketConnection, event: CloseConnection) -> None:
    """RFC 6455 7.1.7: a malformed frame fails the connection with a close frame (1002, or 1007
    for a text frame that is not UTF-8). wsproto reports it as a CloseConnection event while the
    connection is still OPEN (a peer's close frame would have moved it on), and trio-websocket
    then drops the TCP connection without the frame; send it first."""
    if self._wsproto.state is ConnectionState.OPEN:
        self._close_reason = CloseReason(event.code, event.reason or None)  # no sends from now on
        with contextlib.suppress(ConnectionClosed), trio.move_on_after(1):
            await self._send(CloseConnection(code=event.code, reason=event.reason))
    await _upstream_close_handler(self, event)


async def _send(self: WebSocketConnection, event: Event) -> None:
    """Once the server sent its close frame, wsproto refuses to send anything more, and
    trio-websocket's reader task still tries to (a close 1009 for an oversized message, a pong
    for a ping): its LocalProtocolError would end the reader's nursery and every connection
    with it (the listeners' handler nursery). What cannot be sent any more is dropped."""
    try:
        await _upstream_send(self, event)
    except LocalProtocolError:  # raised before any byte is written
        if self._wsproto.state is ConnectionState.OPEN:
            raise


def install() -> None:
    """Make every WebSocket connection answer a malformed frame with its close frame, and
    closing connections drop what can no longer be sent."""
    WebSocketConnection._handle_close_connection_event = _close_handler
    WebSocketConnection._send = _send


def socket_of(ws: WebSocketConnection) -> socket.socket | None:
    return getattr(ws._stream, "socket", None)


async def close_rejected(request: WebSocketRequest) -> None:
    """trio-websocket keeps a refused handshake's connection open until the client closes it, so
    that one client could hold any number of them."""
    await request._connection._close_stream()
