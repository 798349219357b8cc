"""The TCP channel: newline-delimited JSON on a raw TCP stream."""
from __future__ import annotations

import trio

from .channel import (
    RECEIVE_BYTES,
    TCP_CLOSE,
    ChannelClosed,
    SlowConsumer,
    half_close_and_drain,
    socket_peer,
    socket_state,
)
from .codes import ProtocolError



class TcpChannel:
    door = "tcp"

    def __init__(self, stream: trio.SocketStream, max_line: int, send_timeout: float) -> None:
        self._stream = stream
        self._max_line = max_line
        self._send_timeout = send_timeout
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer known to hold no newline
        self._send_lock = trio.Lock()
        self.peer = socket_peer(stream)

    async def receive(self, max_line: int | None = None) -> str:
        """The next non-empty line; `max_line`: a lower limit than the channel's for this one."""
        while True:
            line = self._next_line(max_line or self._max_line)
            if line is None:
                await self._fill()
            elif line.strip():
                return _text(line)

    def receive_buffered(self) -> str | None:
        while (line := self._next_line(self._max_line)) is not None:
            if line.strip():
                return _text(line)
        return None

    def peer_gone(self) -> bool:
        # A FIN is not enough: a client may half-close after its final and still read.
        return socket_state(self._stream.socket) == TCP_CLOSE

    def _next_line(self, max_line: int) -> bytes | None:
        end = self._buffer.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(self._buffer)
            if self._scanned > max_line:
                raise ProtocolError("message_too_large", f"a line exceeds {max_line} bytes")
            return None
        if end > max_line:
            raise ProtocolError("message_too_large", f"a line exceeds {max_line} bytes")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._scanned = 0
        return line

    async def _fill(self) -> None:
        try:
            data = await self._stream.receive_some(RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ChannelClosed() from None
        if not data:
            raise ChannelClosed()
        self._buffer += data

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            with trio.move_on_after(self._send_timeout) as scope:
                try:
                    await self._stream.send_all(data + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise ChannelClosed() from None
        if scope.cancelled_caught:
            raise SlowConsumer()

    async def close(self, reason: str, code: int) -> None:
        await half_close_and_drain(self._stream, 1)
        await self.abort()

    async def abort(self) -> None:
        await trio.aclose_forcefully(self._stream)


def _text(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("invalid_utf8", "the line is not UTF-8 text (binary data on TCP?)") from None
