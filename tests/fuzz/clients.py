"""Bare clients an attacker would write: a TCP line client, a WebSocket client on wsproto (it
can send malformed frames, stop reading, or reset), and raw HTTP. Each reads what the server
sends until a predicate holds or the server closes, and remembers how it closed."""
from __future__ import annotations

import socket
import struct

import orjson
import trio
import wsproto
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

GONE = (trio.BrokenResourceError, trio.ClosedResourceError, LocalProtocolError)


class RawFrame(bytes):
    """Bytes that go on the wire as they are (not framed as a message)."""


async def open_stream(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


def reset(stream: trio.SocketStream) -> None:
    """Close with a TCP reset (SO_LINGER 0): an abrupt end, with unread data on either side."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


class LineClient:
    """Newline-delimited JSON on TCP."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.close_code = None
        self._buffer = b""

    async def send(self, frame: str | bytes) -> None:
        data = frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else bytes(frame)
        await self.stream.send_all(data if isinstance(frame, RawFrame) else data + b"\n")

    async def receive(self) -> dict | None:
        """The next message; None once the server closed."""
        while b"\n" not in self._buffer:
            try:
                data = await self.stream.receive_some(65536)
            except GONE:
                data = b""
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return orjson.loads(line)


class WsClient:
    """A WebSocket client that frames whatever it is given."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.close_code: int | None = None
        self.refused: tuple[int, bytes] | None = None  # the handshake's HTTP status and body
        self._messages: list[str | bytes] = []
        self._parts: list[str | bytes] = []

    async def handshake(self, target: str) -> bool:
        """False: refused (see `refused`) or gone."""
        await self.stream.send_all(self.ws.send(Request(host="127.0.0.1", target=target)))
        status, body = None, b""
        while True:
            for event in await self._events():
                if isinstance(event, AcceptConnection):
                    return True
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        self.refused = (status, b"")
                        return False
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        self.refused = (status, body)
                        return False
            if self.close_code is not None:
                self.refused = (status, body) if status else None
                return False

    async def send(self, frame: str | bytes) -> None:
        if isinstance(frame, RawFrame):
            await self.stream.send_all(bytes(frame))
        elif isinstance(frame, str) and not frame.isascii():
            await self.stream.send_all(text_frame(frame.encode("utf-8", "surrogatepass")))  # maybe not UTF-8
        elif isinstance(frame, str):
            await self.stream.send_all(self.ws.send(TextMessage(data=frame)))
        else:
            await self.stream.send_all(self.ws.send(BytesMessage(data=frame)))

    async def receive(self) -> dict | bytes | None:
        """The next message (JSON text parsed); None once the server closed."""
        while not self._messages:
            if self.close_code is not None:
                return None
            await self._events()
        message = self._messages.pop(0)
        return orjson.loads(message) if isinstance(message, str) else message

    async def close(self) -> None:
        try:
            await self.stream.send_all(self.ws.send(CloseConnection(code=1000)))
        except GONE:
            pass

    async def _events(self) -> list:
        try:
            data = await self.stream.receive_some(65536)
        except GONE:
            data = b""
        if not data:
            self.close_code = self.close_code or 1006
            return []
        self.ws.receive_data(data)
        events = list(self.ws.events())
        for event in events:
            if isinstance(event, Message):
                self._parts.append(event.data)
                if event.message_finished:
                    whole = "".join(self._parts) if isinstance(event, TextMessage) else b"".join(self._parts)
                    self._messages.append(whole)
                    self._parts = []
            elif isinstance(event, CloseConnection):
                self.close_code = event.code
        return events


def text_frame(payload: bytes) -> bytes:
    """A masked text frame of any bytes, even ones that are not UTF-8 (wsproto would refuse them)."""
    size = len(payload)
    if size < 126:
        head = bytes([0x81, 0x80 | size])
    elif size < 65536:
        head = bytes([0x81, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x81, 0x80 | 127]) + size.to_bytes(8, "big")
    mask = b"\x01\x02\x03\x04"
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


