"""What a protocol session needs from a transport."""
from __future__ import annotations

from typing import Protocol


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
