"""Client for the native protocol over TCP (`tcp://host:port`) or WebSocket (`ws://host:port/`).

Async on trio:

    async with connect("tcp://127.0.0.1:8765") as stream:
        await stream.send_audio(samples, final=True)
        while (message := await stream.receive()) is not None: ...

or blocking: `transcribe("ws://127.0.0.1:8000/", samples).text`.
"""
from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from urllib.parse import urlsplit

import numpy as np
import orjson
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

MAX_LINE = 1 << 24
# errors after which the server closes the stream (see docs/protocol.md)
FATAL_CODES = frozenset(
    {"queue_full", "unauthorized", "invalid_config", "bad_lookahead", "unsupported_language", "inference_error",
     "internal_error"}
)


class ClientError(Exception):
    """The server reported an error that ended the stream."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class _TcpTransport:
    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._lock = trio.Lock()

    async def send(self, data: bytes) -> None:
        async with self._lock:
            await self._stream.send_all(data + b"\n")

    async def send_binary(self, data: bytes) -> None:
        raise ValueError("binary audio frames need a WebSocket connection")

    async def receive(self) -> bytes | None:
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_LINE:
                raise ClientError("message_too_large", "the server sent an over-long line")
            try:
                data = await self._stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                return None
            self._buffer += data
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line


class _WsTransport:
    def __init__(self, ws: WebSocketConnection) -> None:
        self._ws = ws

    async def send(self, data: bytes) -> None:
        await self._ws.send_message(data.decode())

    async def send_binary(self, data: bytes) -> None:
        await self._ws.send_message(data)

    async def receive(self) -> str | None:
        try:
            return await self._ws.get_message()
        except ConnectionClosed:
            return None

    @property
    def close_reason(self) -> tuple[int, str | None] | None:
        reason = self._ws.closed
        return None if reason is None else (reason.code, reason.reason)


class StreamClient:
    """One stream: send audio and control messages, receive server messages as dicts."""

    def __init__(self, transport: _TcpTransport | _WsTransport, encoding: str) -> None:
        self._transport = transport
        self.encoding = encoding

    async def send(self, message: dict) -> None:
        await self._transport.send(orjson.dumps(message))

    async def send_audio(self, samples: np.ndarray, final: bool = False) -> None:
        data = base64.b64encode(encode_audio(samples, self.encoding)).decode()
        await self.send({"type": "audio", "data": data, "encoding": self.encoding, "final": final})

    async def send_binary(self, samples: np.ndarray) -> None:
        """Raw audio in the declared encoding as a binary WebSocket frame."""
        await self._transport.send_binary(encode_audio(samples, self.encoding))

    async def finalize(self) -> None:
        await self.send({"type": "close"})

    async def ping(self) -> None:
        await self.send({"type": "ping"})

    async def receive(self) -> dict | None:
        """The next server message, or None once the server closed the connection."""
        raw = await self._transport.receive()
        return None if raw is None else orjson.loads(raw)

    @property
    def close_reason(self) -> tuple[int, str | None] | None:
        """WebSocket close (code, reason) once closed; None for TCP."""
        return getattr(self._transport, "close_reason", None)


def encode_audio(samples: np.ndarray, encoding: str) -> bytes:
    samples = np.asarray(samples, dtype=np.float32)
    if encoding == "f32":
        return samples.astype("<f4").tobytes()
    # x 32768 with rounding: the exact inverse of the server's int16 / 32768
    return np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()


@asynccontextmanager
async def connect(
    url: str,
    *,
    sample_rate: int | None = None,
    encoding: str = "pcm16",
    lookahead: str | None = None,
    api_key: str | None = None,
    language: str | None = None,
) -> AsyncIterator[StreamClient]:
    """Open a stream; declares rate/encoding/lookahead/language (and a TCP API key) in a start message."""
    declared = (("sample_rate", sample_rate), ("lookahead", lookahead), ("language", language))
    start = {k: v for k, v in declared if v is not None}
    if start or encoding != "pcm16":
        start["encoding"] = encoding
    parts = urlsplit(url)
    if parts.scheme == "tcp":
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            client = StreamClient(_TcpTransport(stream), encoding)
            if api_key is not None:
                start["api_key"] = api_key
            if start:
                await client.send({"type": "start", **start})
            yield client
        return
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} (use tcp:// or ws://)")
    headers = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else None
    async with open_websocket_url(url, extra_headers=headers) as ws:
        client = StreamClient(_WsTransport(ws), encoding)
        if start:
            await client.send({"type": "start", **start})
        yield client


@dataclass
class Transcript:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # hello, queued, started, closed, errors
    final: bool = False


async def transcribe_async(
    url: str,
    samples: np.ndarray,
    *,
    packet_seconds: float = 0.1,
    realtime: bool = False,
    sample_rate: int = 16000,
    **options,
) -> Transcript:
    """Stream `samples` (at `sample_rate`) and collect every result up to the final one."""
    declared = None if sample_rate == 16000 else sample_rate
    async with connect(url, sample_rate=declared, **options) as client, trio.open_nursery() as nursery:
        nursery.start_soon(send_paced, client, samples, sample_rate, packet_seconds, realtime)
        transcript = await receive_transcript(client)
        nursery.cancel_scope.cancel()
    return transcript


async def send_paced(
    client: StreamClient, samples: np.ndarray, rate: int, packet_seconds: float, realtime: bool
) -> None:
    """Send packets, at real time if asked (relative to the start, so delays do not add up)."""
    step = max(1, int(rate * packet_seconds))
    start = trio.current_time()
    for i in range(0, len(samples), step):
        if realtime:
            await trio.sleep_until(start + i / rate)
        await client.send_audio(samples[i : i + step])
    await client.send_audio(np.zeros(0, np.float32), final=True)


async def receive_transcript(client: StreamClient) -> Transcript:
    transcript = Transcript()
    while (message := await client.receive()) is not None:
        if message.get("type") != "result":
            transcript.events.append(message)
            if message.get("type") == "error" and message.get("code") in FATAL_CODES:
                raise ClientError(message["code"], message.get("message", ""))
            continue
        transcript.results.append(message)
        transcript.token_ids += message["token_ids"]
        transcript.text = message["text"]
        if message["is_final"]:
            transcript.final = True
            break
    return transcript


def transcribe(url: str, samples: np.ndarray, **kwargs) -> Transcript:
    """Blocking wrapper around transcribe_async (runs its own trio loop)."""
    return trio.run(partial(transcribe_async, url, samples, **kwargs))
