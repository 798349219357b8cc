"""The transport under a connection (a TCP line stream or a WebSocket): what a Connection reads
messages from and writes messages to, whichever door the client came through."""
from __future__ import annotations

import socket
from typing import Protocol

import trio

TCP_CLOSE = 7  # Linux tcp_info state after a reset
TCP_CLOSE_WAIT = 8  # the peer sent FIN
RECEIVE_BYTES = 65536
# Per-connection kernel send buffer (accepted sockets inherit it from the listener): bounds
# what a client that stops reading can pile up before the send timeout notices.
SEND_BUFFER_BYTES = 256 * 1024


async def half_close_and_drain(stream: trio.SocketStream, seconds: float) -> None:
    """Half-close, then read and drop what the client still sends, for at most `seconds`: closing
    with unread input would send a reset that can destroy the last messages before the client
    reads them."""
    with trio.move_on_after(seconds):
        try:
            await stream.send_eof()
            while await stream.receive_some(RECEIVE_BYTES):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


class ChannelClosed(Exception):
    """The peer is gone (EOF, reset, WebSocket closed)."""


class SlowConsumer(Exception):
    """A send did not complete within the send timeout: the client is not reading."""


class Channel(Protocol):
    door: str  # "tcp" or "ws": the listener the client connected to
    peer: str  # the client's address, "host:port"

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


def socket_state(sock) -> int | None:
    """The kernel's TCP state of `sock` (Linux), or None where it cannot be read."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except (AttributeError, OSError):
        return None


def socket_peer(stream: trio.SocketStream) -> str:
    """The peer of a connected socket as "host:port"; "?" once it was reset."""
    try:
        return peer_name(*stream.socket.getpeername()[:2])
    except OSError:
        return "?"


def peer_name(address: object, port: object) -> str:
    """An address as "host:port" (an IPv6 host in brackets)."""
    host = str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
