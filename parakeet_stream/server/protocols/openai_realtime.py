"""`/v1/realtime` (with `intent` or `model` in the URL): OpenAI's Realtime API, transcription
sessions, as the official `openai` SDK (3.x) speaks it.

The client appends base64 audio to an input buffer; the server answers with transcription
deltas of the current item and, once an item ends, `committed` and `completed`. An item ends at
the model's end of utterance (`<EOU>`) when turn detection is on (speech_started/speech_stopped
frame it), and at the client's `input_audio_buffer.commit` in any mode. A commit ends the
segment (flushing the last words); audio appended while it drains waits for the next one, and
so does a commit of it. Times (`audio_start_ms`, `audio_end_ms`) count from the first audio of
the connection.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import wire
from ..codes import KEEP_OPEN, ProtocolError
from ..protocol import Protocol
from ..session import Session
from ..wire import decode_base64, decode_bytes, parse_sample_rate
from ..words import first_text_time

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..connection import Connection
    from ..segment import Segment

DEFAULT_RATE = 24000  # OpenAI's PCM rate
G711_FORMATS = {"audio/pcmu": "mulaw", "audio/pcma": "alaw"}
SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
# what the SDK's types hold, echoed in session.updated; other fields are dropped
TURN_FIELDS = {
    "server_vad": {"type", "create_response", "idle_timeout_ms", "interrupt_response",
                   "prefix_padding_ms", "silence_duration_ms", "threshold"},
    "semantic_vad": {"type", "create_response", "eagerness", "interrupt_response"},
}
TRANSCRIPTION_FIELDS = {"model", "language", "languages", "prompt", "keywords", "delay"}
NOISE_REDUCTION_FIELDS = {"type", "strength"}
SERVER_ERRORS = {"inference_error", "internal_error"}
# the `param` of the audio decoding errors (raised by wire, which knows no OpenAI)
PARAMS = {"invalid_base64": "audio", "invalid_audio_length": "audio", "invalid_samples": "audio"}
CODES = {"input_audio_buffer_commit_empty": KEEP_OPEN}  # OpenAI's own: a commit with no audio


def event_id() -> str:
    return f"event_{uuid.uuid4().hex}"


def item_id() -> str:
    return f"item_{uuid.uuid4().hex}"


def is_openai(query: dict[str, str]) -> bool:
    """/v1/realtime speaks OpenAI's dialect when the URL says so, as the openai SDK's always
    does (`model=...` or `intent=transcription`); vLLM's clients send neither."""
    return query.get("intent") == "transcription" or "model" in query


class InvalidRequest(ProtocolError):
    """A refused client event, with the parameter it concerns (OpenAI's `param`)."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(code, message)
        self.param = param


@dataclass
class AudioFormat:
    encoding: str = "pcm16"  # wire.decode_bytes name
    rate: int = DEFAULT_RATE

    def describe(self) -> dict:
        if self.encoding == "pcm16":
            return {"type": "audio/pcm", "rate": self.rate}
        return {"type": next(name for name, enc in G711_FORMATS.items() if enc == self.encoding)}


@dataclass
class Item:
    """One user audio item: the tokens since the previous item ended."""

    id: str
    start: float  # connection seconds
    text: str = ""
    speaking: bool = False  # speech_started was sent
    committed: bool = False


def parse_format(value: Any) -> AudioFormat:
    if not isinstance(value, dict):
        raise InvalidRequest("invalid_field", "'format' must be an object", "session.audio.input.format")
    kind = value.get("type", "audio/pcm")
    if kind in G711_FORMATS:
        return AudioFormat(G711_FORMATS[kind], 8000)
    if kind != "audio/pcm":
        raise InvalidRequest(
            "invalid_field", "'format.type' must be audio/pcm, audio/pcmu or audio/pcma",
            "session.audio.input.format.type",
        )
    try:
        return AudioFormat("pcm16", parse_sample_rate(value.get("rate", DEFAULT_RATE)))
    except ProtocolError as exc:
        message = exc.message.replace("'sample_rate'", "'format.rate'")
        raise InvalidRequest("invalid_field", message, "session.audio.input.format.rate") from None


def parse_turn_detection(value: Any) -> dict | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in TURN_FIELDS:
        raise InvalidRequest(
            "invalid_field", "'turn_detection' must be null, server_vad or semantic_vad",
            "session.audio.input.turn_detection",
        )
    defaults = SERVER_VAD if kind == "server_vad" else {}
    return {**defaults, **_known(value, TURN_FIELDS[kind])}


def parse_optional_object(value: Any, fields: set[str], param: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise InvalidRequest("invalid_field", f"'{param.rsplit('.', 1)[-1]}' must be an object or null", param)
    return None if value is None else _known(value, fields)


def _known(value: dict, fields: set[str]) -> dict:
    return {k: v for k, v in value.items() if k in fields}


def _object(value: Any, param: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("invalid_field", f"'{param.rsplit('.', 1)[-1]}' must be an object", param)
    return value


@dataclass
class Settings:
    """A transcription session's settings: what session.update sets, session.created/updated echo."""

    format: AudioFormat = field(default_factory=AudioFormat)
    turn_detection: dict | None = field(default_factory=lambda: dict(SERVER_VAD))
    transcription: dict | None = None
    noise_reduction: dict | None = None

    def updated(self, session: Any, holds_audio: bool) -> Settings:
        """These settings with a session.update's changes, once every field is valid."""
        if not isinstance(session, dict) or session.get("type") != "transcription":
            raise InvalidRequest(
                "invalid_field", "only transcription sessions are served: session.type must be 'transcription'",
                "session.type",
            )
        audio_input = _object(_object(session.get("audio"), "session.audio").get("input"), "session.audio.input")
        changes: dict[str, Any] = {}
        if "format" in audio_input:
            changes["format"] = parse_format(audio_input["format"])
            if changes["format"] != self.format and holds_audio:
                raise InvalidRequest(
                    "bad_state", "the audio format can only change while the input buffer is empty",
                    "session.audio.input.format",
                )
        if "turn_detection" in audio_input:
            changes["turn_detection"] = parse_turn_detection(audio_input["turn_detection"])
        if "transcription" in audio_input:
            changes["transcription"] = parse_optional_object(
                audio_input["transcription"], TRANSCRIPTION_FIELDS, "session.audio.input.transcription"
            )
        if "noise_reduction" in audio_input:
            changes["noise_reduction"] = parse_optional_object(
                audio_input["noise_reduction"], NOISE_REDUCTION_FIELDS, "session.audio.input.noise_reduction"
            )
        return replace(self, **changes)

    def describe(self) -> dict:
        audio_input = {
            "format": self.format.describe(),
            "noise_reduction": self.noise_reduction,
            "transcription": self.transcription,
            "turn_detection": self.turn_detection,
        }
        return {"type": "transcription", "audio": {"input": audio_input}}


class OpenAIRealtimeSession(Session):
    def __init__(self, connection: Connection, options: object) -> None:
        super().__init__(connection, options)
        self.settings = Settings(transcription={"model": self.config.model_name})
        self.segments.rate = self.settings.format.rate
        self._error_context: tuple[str | None, str | None] = (None, None)  # (client event_id, param)
        self._item: Item | None = None
        self._previous_item: str | None = None
        self._item_start = 0.0  # connection seconds where the next item starts

    # -- client events ----------------------------------------------------------------
    async def open(self) -> None:
        await self.send({"type": "session.created", "event_id": event_id(), "session": self.settings.describe()})

    async def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            raise ProtocolError("invalid_message", "binary frames are not part of the Realtime API")
        event = wire.loads(message)
        if not isinstance(event, dict):
            raise ProtocolError("invalid_message", "an event must be a JSON object")
        client_event = event.get("event_id")
        try:
            await self._dispatch(event)
        except ProtocolError as exc:  # the connection sends error_message(): give it the context
            self._error_context = (client_event if isinstance(client_event, str) else None, getattr(exc, "param", None))
            raise

    async def _dispatch(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._commit()
        elif kind == "input_audio_buffer.clear":
            await self._clear()
        elif kind == "session.update":
            await self._update(event)
        else:
            raise InvalidRequest("unknown_type", f"Unsupported event type: {str(kind)[:40]!r}", "type")

    async def _update(self, event: dict) -> None:
        holds_audio = self.segments.current is not None or self.segments.holding
        self.settings = self.settings.updated(event.get("session"), holds_audio)
        self.segments.rate = self.settings.format.rate
        await self.send({"type": "session.updated", "event_id": event_id(), "session": self.settings.describe()})

    async def _append(self, event: dict) -> None:
        if "audio" not in event:
            raise InvalidRequest("missing_field", "'audio' is required", "audio")
        try:
            raw = decode_base64(event["audio"])
        except ProtocolError as exc:  # its message names the native field
            raise InvalidRequest(exc.code, "'audio' must be a base64 string", "audio") from None
        await self.segments.push(decode_bytes(raw, self.settings.format.encoding))

    async def _commit(self) -> None:
        segments = self.segments
        if segments.draining:
            if not segments.holding:
                raise self._empty_commit()
            segments.defer(self._commit)  # a commit of the audio waiting for the next segment
            return
        segment = segments.current
        if segment is None or segment.heard_until() <= self._item_start:
            raise self._empty_commit()
        item = self._current_item()
        item.committed = True
        await self.send(
            {"type": "input_audio_buffer.committed", "event_id": event_id(), "item_id": item.id,
             "previous_item_id": self._previous_item}
        )
        segment.finalize()

    def _empty_commit(self) -> InvalidRequest:
        return InvalidRequest(
            "input_audio_buffer_commit_empty", "Error committing input audio buffer: the buffer is empty."
        )

    async def _clear(self) -> None:
        """Drop the audio not yet committed: the waiting audio, or the current segment."""
        segments = self.segments
        if segments.draining:
            segments.drop_held()
        elif segments.current is not None:
            segments.discard()
            self._item = None
            self._item_start = segments.offset
        await self.send({"type": "input_audio_buffer.cleared", "event_id": event_id()})

    # -- results ----------------------------------------------------------------------
    async def on_result(self, segment: Segment, result: StreamResult) -> None:
        first = first_text_time(self.info.tokenizer, result)
        if first is not None or result.text:
            await self._transcribe(segment, result.text, first or 0.0)
        if result.utterance_end and self.settings.turn_detection is not None and self._item is not None:
            await self._complete(segment.heard_until(result))

    async def _transcribe(self, segment: Segment, text: str, first_token: float) -> None:
        item = self._current_item()
        if not item.speaking and not item.committed and self.settings.turn_detection is not None:
            item.speaking = True
            start = _ms(segment.offset + first_token)
            await self._send_item_event("input_audio_buffer.speech_started", audio_start_ms=start)
        delta = text if item.text else text.lstrip()
        if delta:
            item.text += delta
            await self._send_item_event(
                "conversation.item.input_audio_transcription.delta", content_index=0, delta=delta
            )

    def _current_item(self) -> Item:
        if self._item is None:
            self._item = Item(item_id(), self._item_start)
        return self._item

    async def _send_item_event(self, kind: str, **fields) -> None:
        await self.send({"type": kind, "event_id": event_id(), "item_id": self._item.id, **fields})

    async def _complete(self, end: float) -> None:
        """End the current item at `end` (connection seconds): speech_stopped (unless the client
        committed it), committed (once), completed."""
        item = self._item
        if item.speaking and not item.committed:
            await self._send_item_event("input_audio_buffer.speech_stopped", audio_end_ms=_ms(end))
        if not item.committed:
            await self._send_item_event("input_audio_buffer.committed", previous_item_id=self._previous_item)
        usage = {"type": "duration", "seconds": round(max(0.0, end - item.start), 3)}
        await self._send_item_event(
            "conversation.item.input_audio_transcription.completed",
            content_index=0, transcript=item.text, usage=usage,
        )
        self._previous_item, self._item, self._item_start = item.id, None, end

    async def on_segment_finished(self, segment: Segment) -> None:
        if self._item is not None:
            await self._complete(segment.heard_until())
        self._item = None
        self._item_start = self.segments.offset

    # -- messages ---------------------------------------------------------------------
    def error_message(self, code: str, message: str) -> dict:
        (client_event, param), self._error_context = self._error_context, (None, None)
        kind = "server_error" if code in SERVER_ERRORS else "invalid_request_error"
        error = {"type": kind, "code": code, "message": message, "param": param or PARAMS.get(code),
                 "event_id": client_event}
        return {"type": "error", "event_id": event_id(), "error": error}


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


PROTOCOL = Protocol(
    name="openai", metric="openai", door="ws", path="/v1/realtime", matches=is_openai,
    session=OpenAIRealtimeSession, codes=CODES,
)
