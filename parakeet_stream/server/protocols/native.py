"""The native protocol (a superset of the original parakeet-streaming protocol), on TCP and
WebSocket: client messages parsed and validated, engine results turned into `result` messages."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import trio

from ... import audio
from ...model import config as model_config
from ...model.config import Lookahead
from .. import wire
from ..codes import ProtocolError, error_body
from ..context import ServerContext
from ..guard import key_ok
from ..session import Channel, Session
from ..stream import EngineStream
from ..wire import (
    ENCODINGS,
    decimal,
    decode_base64,
    decode_bytes,
    decode_samples,
    parse_sample_rate,
)

PROTOCOL_VERSION = 3  # 3: results carry `words`
PRE_AUTH_MAX_LINE = 65536  # TCP with an API key: the longest first line (it carries the key)
RAW_AUDIO = object()  # a binary frame that is not a JSON object
START_TYPES = ("start", "config")


@dataclass
class StreamConfig:
    """What a client declared about its audio (all optional; defaults = original protocol)."""

    sample_rate: int | None = None
    encoding: str | None = None
    lookahead: tuple[int, int] | None = None


@dataclass
class Start:
    config: StreamConfig


@dataclass
class Audio:
    samples: np.ndarray | None  # None: a bare final marker
    final: bool


@dataclass
class Close:
    pass


@dataclass
class Ping:
    pass


ClientMessage = Start | Audio | Close | Ping


def parse(obj: Any, encoding: str) -> ClientMessage:
    """One decoded JSON value -> a client message; `encoding` is the stream's default."""
    if not isinstance(obj, dict):
        raise ProtocolError("invalid_message", "a message must be a JSON object")
    kind = obj.get("type")
    if kind is None:
        raise ProtocolError("missing_field", "'type' is required")
    if kind == "audio":
        return parse_audio(obj, encoding)
    if kind == "close":
        return Close()
    if kind == "ping":
        return Ping()
    if kind in START_TYPES:
        return Start(parse_config(obj))
    raise ProtocolError("unknown_type", f"unknown message type {str(kind)[:40]!r}")


def parse_audio(obj: dict, encoding: str) -> Audio:
    final = obj.get("final", False)
    if not isinstance(final, bool):
        raise ProtocolError("invalid_field", "'final' must be a boolean")
    has_data, has_samples = obj.get("data") is not None, obj.get("samples") is not None
    if has_data and has_samples:
        raise ProtocolError("invalid_field", "send either 'data' or 'samples', not both")
    if has_samples:
        return Audio(decode_samples(obj["samples"]), final)
    if has_data:
        raw = decode_base64(obj["data"])
        return Audio(decode_bytes(raw, parse_encoding(obj.get("encoding") or encoding)), final)
    if not final:
        raise ProtocolError("missing_field", "audio needs 'data' or 'samples'")
    return Audio(None, True)


def parse_config(obj: dict, from_url: bool = False) -> StreamConfig:
    """Fields of a start/config message or (`from_url`) of WebSocket query parameters."""
    config = StreamConfig()
    if obj.get("sample_rate") is not None:
        config.sample_rate = parse_sample_rate(obj["sample_rate"], from_url)
    if obj.get("encoding") is not None:
        config.encoding = parse_encoding(obj["encoding"], "invalid_config")
    if obj.get("lookahead") is not None:
        config.lookahead = parse_lookahead(obj["lookahead"])
    return config


def parse_encoding(value: Any, code: str = "invalid_field") -> str:
    if value not in ENCODINGS:
        raise ProtocolError(code, f"'encoding' must be one of {', '.join(ENCODINGS)}")
    return value


def parse_lookahead(value: Any) -> Lookahead:
    try:
        return model_config.parse_lookahead(value)
    except ValueError:
        raise ProtocolError("invalid_config", "'lookahead' must look like \"70,1\" or [70, 1]") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class NativeSession(Session):
    def __init__(self, ctx: ServerContext, channel: Channel, query: dict[str, str]) -> None:
        super().__init__(ctx, channel)
        self.protocol = channel.transport
        self._query = query
        self.declared = StreamConfig()
        self._first = True
        self._hello_sent = False
        # TCP has no handshake: with an API key, the first message must carry it
        self._key_pending = ctx.config.api_key is not None and channel.transport == "tcp"

    @property
    def encoding(self) -> str:
        return self.declared.encoding or "pcm16"

    async def on_open(self) -> None:
        self.declared = parse_config(self._query, from_url=True)
        if self._key_pending:
            self._full_line = self.channel.max_line
            self.channel.max_line = min(self._full_line, PRE_AUTH_MAX_LINE)
            self._nursery.start_soon(self._auth_deadline)
        else:
            self._open()

    async def _auth_deadline(self) -> None:
        """Unauthenticated connections hold no stream, and not for long either."""
        await trio.sleep(self.config.handshake_timeout)
        if self._key_pending:
            self.end("unauthorized", error_body("unauthorized", "no API key within the handshake timeout"))

    def _open(self) -> None:
        rate = self.declared.sample_rate or audio.SAMPLE_RATE
        self.stream = self.open_stream(self.declared.lookahead, rate)

    def split(self, frame: str | bytes) -> Iterator[str | bytes]:
        # the original server accepted several newline-separated messages per frame
        if isinstance(frame, bytes) or "\n" not in frame:
            yield frame
            return
        start = 0
        while start < len(frame):  # one line at a time: a frame of tiny lines is not copied at once
            end = frame.find("\n", start)
            end = len(frame) if end < 0 else end
            if line := frame[start:end].strip():
                yield line
            start = end + 1

    async def on_unit(self, unit: str | bytes) -> None:
        obj = _sniff_json(unit) if isinstance(unit, bytes) else wire.loads(unit)
        first, self._first = self._first, False
        if obj is RAW_AUDIO:  # a binary frame of raw audio in the declared encoding
            await self._audio(Audio(decode_bytes(unit, self.encoding), False))
            return
        if first and await self._first_message(obj):
            return
        message = parse(obj, self.encoding)
        del obj  # parsed JSON (a samples list) can be many times the audio it carries
        if isinstance(message, Start):
            raise ProtocolError("bad_state", "start/config is only accepted as the first message")
        await self._dispatch(message)

    async def _first_message(self, obj: Any) -> bool:
        """Authenticate and apply a start/config; True when the message is consumed."""
        fields = obj if isinstance(obj, dict) else {}
        if self._key_pending:
            if not key_ok(self.config.api_key, fields.get("api_key")):
                raise ProtocolError("unauthorized", "a valid API key is required")
            self._key_pending = False
            self.channel.max_line = self._full_line
        if fields.get("type") not in START_TYPES:
            if self.stream is None:
                self._open()
            return False
        await self._start(parse_config(fields))
        return True

    async def _start(self, config: StreamConfig) -> None:
        updates = {k: v for k, v in vars(config).items() if v is not None}
        self.declared = replace(self.declared, **updates)
        stream = self.stream
        if stream is not None and self._lookahead() != stream.lookahead:
            stream.release()  # nothing was pushed yet: reopen with the requested mode
            stream = None
        if stream is None:
            self._open()
        else:
            stream.set_input_rate(self.declared.sample_rate or audio.SAMPLE_RATE)
        await self.send({"type": "started", **self._stream_info(self.stream)})

    def _lookahead(self) -> tuple[int, int]:
        return tuple(self.declared.lookahead or self.ctx.engine.default_lookahead)

    async def _dispatch(self, message: Audio | Close | Ping) -> None:
        if isinstance(message, Ping):
            await self.send({"type": "pong"})
        elif isinstance(message, Close):
            self.stream.finalize()
        else:
            await self._audio(message)

    async def _audio(self, message: Audio) -> None:
        stream = self.stream
        if message.samples is not None and len(message.samples):
            await self.push(stream, message.samples)
        if message.final:
            stream.finalize()

    async def on_admitted(self, stream: EngineStream) -> None:
        if not self._hello_sent:
            self._hello_sent = True
            await self.send({"type": "hello", **self._stream_info(stream)})

    def _stream_info(self, stream: EngineStream) -> dict:
        return {
            "stream_id": stream.sid,
            "sample_rate": stream.input_rate,
            "model_sample_rate": self.ctx.engine.sample_rate,
            "encoding": self.encoding,
            "lookahead": list(stream.lookahead),
            "chunk_seconds": self.ctx.engine.chunk_seconds(stream.lookahead),
            "model": self.config.model_name,
            "protocol_version": PROTOCOL_VERSION,
        }

    async def on_result(self, stream: EngineStream, result, text: str) -> None:
        if result.error:
            await self.send(self.error_message(result.error, "inference failed for this stream"))
        await self.send(_result_message(stream, result, text))

    async def on_stream_done(self, stream: EngineStream, error: str | None) -> None:
        if error:
            self.end(error)
        elif self.pending_end:
            self.end_after_final(self.pending_end)
        else:
            self.end("completed")


def _result_message(stream: EngineStream, result, text: str) -> dict:
    message = {
        "type": "result",
        "stream_id": stream.sid,
        "text": text,  # the transcript so far, as in the original protocol
        "delta": result.text,
        "token_ids": result.token_ids,
        "is_final": result.is_final,
        "utterance_end": result.utterance_end,
        "start": result.start,
        "end": result.end,
        "token_times": result.token_times,
        "words": stream.words,  # the words this result completes: {word, start, end}
        "audio_seconds": result.audio_seconds,
        "latency": result.latency,
    }
    if result.error:
        message["error"] = result.error
    return message


def _sniff_json(frame: bytes) -> Any:
    """Original clients may send JSON objects in binary frames; anything else is raw audio."""
    if not frame.startswith(b"{"):
        return RAW_AUDIO
    try:
        obj = wire.loads(frame)
    except ProtocolError:
        return RAW_AUDIO
    return obj if isinstance(obj, dict) else RAW_AUDIO
