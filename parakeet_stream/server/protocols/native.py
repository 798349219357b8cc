"""The native protocol (a superset of the original parakeet-streaming protocol), on TCP and
WebSocket: client messages parsed and validated, engine results turned into `result` messages.
One segment per connection: the connection ends with its final result."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import trio

from ... import audio
from ...engine.phrases import Phrase, PhraseError, as_written, check_phrases
from ...model import config as model_config
from ...model.config import Lookahead
from ..streams.guard import key_ok
from ..streams.language import checked_language
from ..streams.phrases import refused
from ..streams.protocol import Accept, Protocol, Refusal
from ..streams.schema import InvalidField, Message, Schema
from ..streams.session import Session
from ..streams.speakers import SpeakerTimeline, checked_speakers
from ..streams.wire import ENCODINGS, decode_bytes, decode_samples, parse_sample_rate
from ..streams.words import WordTracker
from ..transport.channel import ChannelClosed
from ..transport.codes import ProtocolError

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..context import ServerContext
    from ..streams.connection import Connection
    from ..streams.segments import Segment
    from ..transport.tcp import TcpChannel

# 3: results carry `words`; 4: start takes `phrases`, hello and started echo them; 5: start takes
# `language`, hello, started and results carry it; 6: start takes `diarize` and `max_speakers`, words carry
# `speaker` where it is on
PROTOCOL_VERSION = 6
PRE_AUTH_MAX_LINE = 65536  # TCP with an API key: the longest first line (it carries the key)


@dataclass
class StreamConfig:
    """What a client declared about its audio (all optional; defaults = original protocol)."""

    sample_rate: int | None = None
    encoding: str | None = None
    lookahead: tuple[int, int] | None = None
    phrases: tuple[Phrase, ...] | None = None
    language: str | None = None
    diarize: bool | None = None
    max_speakers: int | None = None


class PhraseSpec(msgspec.Struct, forbid_unknown_fields=True):
    """A phrase with its weight (a bare string: the default weight)."""

    text: str
    weight: float | None = None


class Start(Message, tag="start"):
    sample_rate: int | None = None
    encoding: str | None = None
    lookahead: str | list[int] | None = None
    phrases: list[str | PhraseSpec] | None = None
    language: str | None = None
    diarize: bool | None = None
    max_speakers: int | None = None
    codes = {
        "sample_rate": "invalid_config", "encoding": "invalid_config", "lookahead": "invalid_config",
        "phrases": "invalid_phrases", "language": "invalid_config", "diarize": "invalid_config",
        "max_speakers": "invalid_config",
    }


class Config(Start, tag="config"):
    """The original protocol's name for start."""


class Audio(Message, tag="audio"):
    data: bytes | None = None  # base64 in the JSON
    samples: list[float] | None = None
    encoding: str | None = None
    final: bool = False


class Close(Message, tag="close"):
    pass


class Ping(Message, tag="ping"):
    pass


class KeyLine(msgspec.Struct):
    """The first TCP line with an API key: any message, with "api_key"."""

    api_key: str | None = None


SCHEMA = Schema(Start, Config, Audio, Close, Ping)
KEY_LINE = Schema(KeyLine)


def audio_samples(message: Audio, encoding: str) -> np.ndarray | None:
    """The samples of an audio message (None: a bare final marker); `encoding`: the stream's."""
    if message.data is not None and message.samples is not None:
        raise ProtocolError("invalid_field", "send either 'data' or 'samples', not both")
    if message.samples is not None:
        return decode_samples(message.samples)
    if message.data is not None:
        return decode_bytes(message.data, message.encoding or encoding)
    if not message.final:
        raise ProtocolError("missing_field", "audio needs 'data' or 'samples'")
    return None


def stream_config(message: Start) -> StreamConfig:
    config = StreamConfig()
    if message.sample_rate is not None:
        config.sample_rate = parse_sample_rate(message.sample_rate)
    if message.encoding is not None:
        config.encoding = parse_encoding(message.encoding)
    if message.lookahead is not None:
        config.lookahead = parse_lookahead(message.lookahead)
    if message.phrases is not None:
        config.phrases = parse_phrases(message.phrases)
    config.language = message.language
    config.diarize, config.max_speakers = message.diarize, message.max_speakers
    return config


def parse_phrases(items: list[str | PhraseSpec]) -> tuple[Phrase, ...]:
    try:
        return check_phrases(item if isinstance(item, str) else (item.text, item.weight) for item in items)
    except PhraseError as exc:
        raise refused(exc, "'phrases'") from None


def url_config(query: dict[str, str]) -> StreamConfig:
    """The same fields as WebSocket query parameters (text, so digits are read as numbers)."""
    config = StreamConfig()
    if query.get("sample_rate") is not None:
        config.sample_rate = parse_sample_rate(query["sample_rate"], from_url=True)
    if query.get("encoding") is not None:
        config.encoding = parse_encoding(query["encoding"])
    if query.get("lookahead") is not None:
        config.lookahead = parse_lookahead(query["lookahead"])
    config.language = query.get("language")
    if query.get("diarize") is not None:
        config.diarize = parse_flag(query["diarize"], "diarize")
    if query.get("max_speakers") is not None:
        config.max_speakers = query["max_speakers"]  # checked_speakers refuses it unless a whole number
        if config.max_speakers.isdigit():
            config.max_speakers = int(config.max_speakers)
    return config


def parse_flag(value: str, name: str) -> bool:
    if value not in ("true", "false"):
        raise ProtocolError("invalid_config", f"'{name}' must be true or false")
    return value == "true"


def parse_encoding(value: str) -> str:
    if value not in ENCODINGS:
        raise ProtocolError("invalid_config", f"'encoding' must be one of {', '.join(ENCODINGS)}")
    return value


def parse_lookahead(value: str | list[int]) -> Lookahead:
    try:
        return model_config.parse_lookahead(value)
    except ValueError:
        raise ProtocolError("invalid_config", "'lookahead' must look like \"70,1\" or [70, 1]") from None


def split_lines(frame: str | bytes) -> tuple[str | bytes, ...] | Iterator[str]:
    """The original server accepted several newline-separated messages per frame."""
    if isinstance(frame, bytes) or "\n" not in frame:
        return (frame,)
    return _lines(frame)


def _lines(frame: str) -> Iterator[str]:
    start = 0
    while start < len(frame):  # one line at a time: a frame of tiny lines is not copied at once
        end = frame.find("\n", start)
        end = len(frame) if end < 0 else end
        if line := frame[start:end].strip():
            yield line
        start = end + 1


async def tcp_handshake(ctx: ServerContext, channel: TcpChannel) -> Accept | Refusal | None:
    """TCP has no headers: with an API key, the first line (at most PRE_AUTH_MAX_LINE bytes,
    within the handshake timeout) must carry it as "api_key" in any message, which is then
    handled as the first message; any other first line is refused. No segment, hence no slot,
    before that."""
    if ctx.config.api_key is None:
        return Accept({})
    with trio.move_on_after(ctx.config.handshake_timeout):
        try:
            line = await channel.receive(PRE_AUTH_MAX_LINE)
            key = KEY_LINE.decode(line).api_key
        except InvalidField:  # JSON, but no object with a string "api_key"
            key = None
        except ProtocolError as exc:
            return Refusal(400, exc.code, exc.message)
        except ChannelClosed:
            return None
        if not key_ok(ctx.config.api_key, key):
            return Refusal(401, "unauthorized", "a valid API key is required")
        return Accept({}, first=line)
    return Refusal(401, "unauthorized", "no API key within the handshake timeout")


class NativeSession(Session):
    several_segments = False
    announces_queue = True
    sends_failed_results = True  # after the error, a final result with its `error` field

    def __init__(self, connection: Connection, query: dict[str, str]) -> None:
        super().__init__(connection, query)
        self._query = query
        self.declared = StreamConfig()
        self.encoding = "pcm16"
        self._first = True
        self._hello_sent = False
        self._words = WordTracker(self.info)
        self._speakers: SpeakerTimeline | None = None  # with diarize: true

    def open(self) -> None:
        self._declare(url_config(self._query))
        self._open()

    def _declare(self, config: StreamConfig) -> None:
        updates = {k: v for k, v in vars(config).items() if v is not None}
        self.declared = replace(self.declared, **updates)
        self.encoding = self.declared.encoding or "pcm16"
        self.segments.rate = self.declared.sample_rate or audio.SAMPLE_RATE
        self.segments.phrases = self.declared.phrases or ()
        self.segments.language = checked_language(self.connection.ctx.engine, self.declared.language)
        self.segments.diarize = bool(self.declared.diarize)
        most = checked_speakers(self.info, self.segments.diarize, self.declared.max_speakers)
        self._speakers = SpeakerTimeline(self.info, most) if self.segments.diarize else None

    def _open(self) -> None:
        self.segments.open(self.declared.lookahead)

    async def on_message(self, message: str | bytes) -> None:
        parsed = _sniff_json(message) if isinstance(message, bytes) else SCHEMA.decode(message)
        first, self._first = self._first, False
        if parsed is None:  # a binary frame of raw audio in the declared encoding
            await self.segments.push(decode_bytes(message, self.encoding))
        elif isinstance(parsed, Audio):
            samples, final = audio_samples(parsed, self.encoding), parsed.final
            del parsed  # a `samples` list is 8 times the float32 audio it carries: not while push waits
            if samples is not None and len(samples):
                await self.segments.push(samples)
            if final:
                self.segments.current.finalize()
        elif isinstance(parsed, Ping):
            self.post({"type": "pong"})
        elif isinstance(parsed, Close):
            self.segments.current.finalize()
        elif first:
            self._start(stream_config(parsed))
        else:
            raise ProtocolError("bad_state", "start/config is only accepted as the first message")

    def _start(self, config: StreamConfig) -> None:
        self._declare(config)
        segment = self.segments.current
        lookahead = tuple(self.declared.lookahead or self.info.default_lookahead)
        wanted = (lookahead, self.segments.phrases, self.segments.language, self.segments.diarize)
        if wanted != (segment.lookahead, segment.phrases, segment.language, segment.diarize):
            self.segments.discard()  # nothing was pushed yet: reopen with the requested mode, phrases, language, speakers
            self._open()
        else:
            segment.set_input_rate(self.segments.rate)
        self.post({"type": "started", **self._stream_info(self.segments.current)})

    def on_admitted(self, segment: Segment) -> None:
        if not self._hello_sent:
            self._hello_sent = True
            self.post({"type": "hello", **self._stream_info(segment)})

    def _stream_info(self, segment: Segment) -> dict:
        return {
            "stream_id": segment.sid,
            "sample_rate": segment.input_rate,
            "model_sample_rate": self.info.sample_rate,
            "encoding": self.encoding,
            "lookahead": list(segment.lookahead),
            "chunk_seconds": self.info.chunk_seconds[segment.lookahead],
            "phrases": [{"text": as_written(p, self.info.tokenizer), "weight": p.weight} for p in segment.phrases],
            "language": segment.language,
            "diarize": segment.diarize,
            "model": self.config.model_name,
            "protocol_version": PROTOCOL_VERSION,
        }

    def on_result(self, segment: Segment, result: StreamResult) -> None:
        message = {
            "type": "result",
            "stream_id": segment.sid,
            "text": segment.text,  # the transcript so far, as in the original protocol
            "delta": result.text,
            "token_ids": result.token_ids,
            "is_final": result.is_final,
            "utterance_end": result.utterance_end,
            "start": result.start,
            "end": result.end,
            "token_times": result.token_times,
            # the words this result completes: {word, start, end, confidence} (and speaker with diarize)
            "words": self._words_of(result),
            "audio_seconds": result.audio_seconds,
            "latency": result.latency,
            "language": result.language,
        }
        if result.error:
            message["error"] = result.error
        self.post(message)

    def _words_of(self, result: StreamResult) -> list[dict]:
        words = self._words.update(result, result.audio_seconds, close=result.is_final)
        if self._speakers is None:
            return words
        self._speakers.add(result)
        return self._speakers.label(words)

    def last_message(self, reason: str) -> dict:
        return {"type": "closed", "reason": reason}


def _sniff_json(frame: bytes) -> Message | None:
    """Original clients may send JSON objects in binary frames; anything else (None) is raw audio."""
    if not frame.startswith(b"{"):
        return None
    try:
        return SCHEMA.decode(frame)
    except InvalidField:
        raise
    except ProtocolError:  # not JSON
        return None


WEBSOCKET = Protocol(name="native", metric="ws", door="ws", session=NativeSession, split=split_lines)
TCP = Protocol(name="native", metric="tcp", door="tcp", session=NativeSession, split=split_lines, handshake=tcp_handshake)
