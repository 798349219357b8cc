"""`/v1/listen`: Deepgram's live streaming API, as the official deepgram-sdk speaks it.

Binary frames carry audio in the encoding the URL declares; text frames carry the control
messages `KeepAlive`, `Finalize` and `CloseStream`. Engine results become `Results` messages:
interim ones (with `interim_results=true`) while a segment grows, and one final per segment,
where a segment ends at the model's end of utterance (`speech_final`, unless `endpointing=false`),
at `Finalize` (`from_finalize`) or at the end of the stream.
`UtteranceEnd` follows once `utterance_end_ms` of audio passed after the last finalized word. `Metadata` is the last message before the close.
Each `Finalize` ends the engine stream; later audio opens a new one, its times offset so that
every time is counted from the start of the connection.
"""
from __future__ import annotations

import datetime
import hashlib
import uuid
from dataclasses import dataclass, field

import numpy as np

from ... import audio
from .. import wire
from ..codes import ProtocolError
from ..context import ServerContext
from ..session import Channel, Session
from ..stream import EngineStream, group_words, text_tokens, timed_words
from ..wire import decode_bytes, parse_sample_rate

PATH = "/v1/listen"
ENCODINGS = {"linear16": "pcm16", "mulaw": "mulaw", "alaw": "alaw"}
BOOLEANS = ("interim_results", "vad_events")
# accepted and ignored: formatting, billing and hints our model has no use for (LiveKit's and
# Pipecat's Deepgram plugins send most of them on every connection)
IGNORED = {
    "model", "version", "language", "tag", "mip_opt_out", "punctuate", "smart_format", "numerals",
    "no_delay", "filler_words", "profanity_filter", "keywords", "keyterm", "dictation", "measurements",
}
# features we do not have: accepted only when they ask for nothing ("false")
FALSE_ONLY = {"diarize", "multichannel", "detect_language", "sentiment", "topics", "intents"}
KNOWN = {"encoding", "sample_rate", "channels", "endpointing", "utterance_end_ms", *BOOLEANS, *IGNORED, *FALSE_ONLY}


@dataclass
class Options:
    """What the URL's query parameters ask for."""

    encoding: str = "pcm16"
    sample_rate: int = audio.SAMPLE_RATE
    interim_results: bool = False
    vad_events: bool = False
    # Segments end at the model's <EOU>, a trained end-of-turn detector: `endpointing` ms are
    # accepted but not used (a gap between token times is not silence: waiting for it would end
    # segments inside words). endpointing=false: segments still end there, never as speech_final.
    speech_final: bool = True
    utterance_end_ms: int | None = None
    model: str = "parakeet"


def parse_options(query: dict[str, str]) -> Options:
    """Query parameters -> Options; unknown or unsupported ones raise ProtocolError."""
    unknown = sorted(set(query) - KNOWN - {"api_key"})
    if unknown:
        raise ProtocolError("invalid_config", f"unsupported query parameter(s): {', '.join(unknown)[:200]}")
    if enabled := sorted(name for name in FALSE_ONLY if query.get(name, "false") != "false"):
        raise ProtocolError("invalid_config", f"not supported by this server: {', '.join(enabled)}")
    options = Options(model=query.get("model", "parakeet"))
    encoding = query.get("encoding")
    if encoding is None:
        raise ProtocolError("invalid_config", "'encoding' is required: containerized audio is not supported")
    if encoding not in ENCODINGS:
        raise ProtocolError("invalid_config", f"'encoding' must be one of {', '.join(ENCODINGS)}")
    options.encoding = ENCODINGS[encoding]
    if "sample_rate" not in query:
        raise ProtocolError("invalid_config", "'sample_rate' is required with 'encoding'")
    options.sample_rate = parse_sample_rate(query["sample_rate"], from_url=True)
    if query.get("channels", "1") != "1":
        raise ProtocolError("invalid_config", "only 'channels=1' is supported")
    for name in BOOLEANS:
        setattr(options, name, _boolean(query, name))
    if query.get("endpointing") == "false":
        options.speech_final = False
    elif "endpointing" in query:
        _milliseconds(query, "endpointing")
    if "utterance_end_ms" in query:
        options.utterance_end_ms = _milliseconds(query, "utterance_end_ms")
    return options


def _boolean(query: dict[str, str], name: str) -> bool:
    value = query.get(name, "false")
    if value not in ("true", "false"):
        raise ProtocolError("invalid_config", f"'{name}' must be true or false")
    return value == "true"


def _milliseconds(query: dict[str, str], name: str) -> int:
    value = query[name]
    if not (value.isascii() and value.isdigit() and len(value) <= 6):
        raise ProtocolError("invalid_config", f"'{name}' must be a whole number of milliseconds")
    return int(value)


def handshake_error(exc: ProtocolError) -> dict:
    """The body of a refused handshake, shaped like Deepgram's (HTTP 400)."""
    return {"err_code": "INVALID_QUERY_PARAMETER", "err_msg": exc.message, "request_id": str(uuid.uuid4())}


def credentials(headers: dict[str, str], offered: list[str]) -> tuple[str | None, str | None]:
    """(key, subprotocol to answer with): `Authorization: Token KEY`, or the browser form
    `Sec-WebSocket-Protocol: token, KEY` (`offered`: the subprotocols the client proposed)."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() in ("token", "bearer") and token.strip():
        return token.strip(), None
    if len(offered) == 2 and offered[0].lower() == "token":
        return offered[1], offered[0]
    return None, None


@dataclass
class Segment:
    """The tokens since the last final Results (connection times)."""

    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    start: float = 0.0


class DeepgramSession(Session):
    protocol = "deepgram"

    def __init__(self, ctx: ServerContext, channel: Channel, options: Options) -> None:
        super().__init__(ctx, channel)
        self.options = options
        self.request_id = str(uuid.uuid4())
        self.created = datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        self._tokenizer = ctx.engine.model.tokenizer
        self._frame_seconds = ctx.engine.model.frame_seconds  # one encoder frame: a token's span
        self._offset = 0.0  # connection seconds where the current engine stream starts
        self._received_seconds = 0.0
        self._stream_seconds = 0.0  # audio in the current engine stream (its padding not counted)
        self._segment = Segment()
        self._last_final_word_end: float | None = None  # awaiting its UtteranceEnd
        self._from_finalize = False
        self._closing = False

    async def on_unit(self, unit: str | bytes) -> None:
        if isinstance(unit, bytes):
            samples = decode_bytes(unit, self.options.encoding)
            if self._closing:
                raise ProtocolError("stream_closed", "audio after CloseStream")
            self._received_seconds += len(samples) / self.options.sample_rate
            await self._audio(samples)
            return
        event = wire.loads(unit)
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "KeepAlive":
            return  # receiving it restarted the idle clock
        if kind == "Finalize":
            self._finalize()
        elif kind == "CloseStream":
            self._closing = True
            if not self._finalize():
                self.end("completed", self.closed_message("completed"))
        else:
            raise ProtocolError("unknown_type", f"unknown message type {str(kind)[:40]!r}")

    async def _audio(self, samples: np.ndarray) -> None:
        if self.hold_while_draining(samples):  # the next stream opens once this one is done
            return
        stream = self.stream
        if stream is None:
            stream = self.stream = self.open_stream(None, self.options.sample_rate)
            self._stream_seconds = 0.0
        await self.push(stream, samples)
        self._stream_seconds += len(samples) / self.options.sample_rate

    def _finalize(self) -> bool:
        """End the current engine stream (flushing its words); False when there is none."""
        stream = self.stream
        if stream is None or not stream.received_samples:
            return False
        if not stream.finalized:
            self._from_finalize = not self._closing
            stream.finalize()
        return True

    async def on_admitted(self, stream: EngineStream) -> None:
        """Deepgram has no greeting: results simply start to flow."""

    async def on_result(self, stream: EngineStream, result, text: str) -> None:
        if result.error:
            await self.send(self.error_message(result.error, "inference failed for this stream"))
            return
        segment = self._segment
        real = text_tokens(self._tokenizer, result)
        now = self._offset + min(result.audio_seconds, self._stream_seconds)
        await self._utterance_end(self._offset + real[0][1] if real else now)  # the gap, up to the next word
        if real and not segment.token_ids:
            segment.start = self._offset + real[0][1]
            if self.options.vad_events:
                await self.send({"type": "SpeechStarted", "channel": [0, 1], "timestamp": round(segment.start, 3)})
        for token, seconds in real:
            segment.token_ids.append(token)
            segment.token_times.append(self._offset + seconds)
        segment.text += result.text
        if result.utterance_end or result.is_final:
            await self._send_final(now, speech_final=result.utterance_end)
        elif self.options.interim_results and real:
            await self.send(self._results(now, is_final=False, speech_final=False))
        if result.is_final and self._closing:
            await self._utterance_end(now, ended=True)

    async def _send_final(self, now: float, speech_final: bool) -> None:
        from_finalize, self._from_finalize = self._from_finalize, False
        segment = self._segment
        if segment.token_ids or from_finalize:
            message = self._results(now, is_final=True, speech_final=speech_final and self.options.speech_final)
            message["from_finalize"] = from_finalize
            await self.send(message)
        if words := self._words(now):
            self._last_final_word_end = words[-1]["end"]
        self._segment = Segment(start=now)

    async def _utterance_end(self, now: float, ended: bool = False) -> None:
        """UtteranceEnd once `utterance_end_ms` of audio without a word followed the last
        finalized one (or the audio ended)."""
        last, wait = self._last_final_word_end, self.options.utterance_end_ms
        if wait is None or last is None or self._segment.token_ids:
            return
        if ended or now - last >= wait / 1000:
            self._last_final_word_end = None
            await self.send({"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": last})

    def _results(self, now: float, is_final: bool, speech_final: bool) -> dict:
        segment = self._segment
        start = segment.start if segment.token_ids else now
        words = self._words(now)
        alternative = {
            "transcript": segment.text.strip(),
            "confidence": 1.0 if words else 0.0,
            "words": words,
        }
        return {
            "type": "Results",
            "channel_index": [0, 1],
            "duration": round(max(0.0, now - start), 3),
            "start": round(start, 3),
            "is_final": is_final,
            "speech_final": speech_final,
            "channel": {"alternatives": [alternative]},
            "metadata": {
                "request_id": self.request_id,
                "model_info": self._model_info(),
                "model_uuid": self._model_uuid(),
            },
        }

    def _words(self, now: float) -> list[dict]:
        segment = self._segment
        groups = group_words(self._tokenizer, list(zip(segment.token_ids, segment.token_times)))
        words = timed_words(self._tokenizer, groups, self._frame_seconds, now)
        return [{**word, "confidence": 1.0} for word in words]

    async def on_stream_done(self, stream: EngineStream, error: str | None) -> None:
        self._offset += self._stream_seconds
        self._stream_seconds = 0.0
        self.stream = None
        if error:
            self.end(error)
            return
        waiting, self.held_audio = self.held_audio, []
        for samples in waiting:  # within the budget: checked as it arrived
            await self._audio(samples)
        if self.pending_end or (self._closing and not self._finalize()):
            self.end(self.pending_end or "completed", self.closed_message("completed"))

    def _model_info(self) -> dict:
        return {"name": self.config.model_name, "version": "parakeet-stream", "arch": "parakeet"}

    def _model_uuid(self) -> str:
        return str(uuid.UUID(hashlib.md5(self.config.model_name.encode()).hexdigest()))

    def queued_message(self, position: int, estimated_wait_s: float | None) -> dict | None:
        return None  # Deepgram has no such message: a queued client simply waits for results

    def error_message(self, code: str, message: str) -> dict:
        return {"type": "Error", "variant": code, "description": message}

    def closed_message(self, reason: str) -> dict | None:
        """Deepgram's last message before the close: Metadata about the whole request."""
        duration = round(self._received_seconds, 3)
        model = self._model_uuid()
        return {
            "type": "Metadata",
            "transaction_key": "deprecated",
            "request_id": self.request_id,
            "sha256": hashlib.sha256(self.request_id.encode()).hexdigest(),
            "created": self.created,
            "duration": duration,
            "channels": 1,
            "models": [model],
            "model_info": {model: self._model_info()},
        }
