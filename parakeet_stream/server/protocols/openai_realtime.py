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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..codes import KEEP_OPEN, ProtocolError
from ..protocol import Protocol
from ..schema import InvalidField
from ..session import Session
from ..wire import decode_bytes
from ..words import first_text_time
from .openai_events import SCHEMA, Append, Clear, Commit, SessionUpdate, Settings, Transcription, client_event_id

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..connection import Connection
    from ..segment import Segment

SERVER_ERRORS = {"inference_error", "internal_error"}
# the `param` of the audio decoding errors (raised by wire, which knows no OpenAI)
PARAMS = {"invalid_audio_length": "audio", "invalid_samples": "audio"}
CODES = {"input_audio_buffer_commit_empty": KEEP_OPEN}  # OpenAI's own: a commit with no audio


def event_id() -> str:
    return f"event_{uuid.uuid4().hex}"


def item_id() -> str:
    return f"item_{uuid.uuid4().hex}"


def is_openai(query: dict[str, str]) -> bool:
    """/v1/realtime speaks OpenAI's dialect when the URL says so, as the openai SDK's always
    does (`model=...` or `intent=transcription`); vLLM's clients send neither."""
    return query.get("intent") == "transcription" or "model" in query


@dataclass
class Item:
    """One user audio item: the tokens since the previous item ended."""

    id: str
    start: float  # connection seconds
    text: str = ""
    speaking: bool = False  # speech_started was sent
    committed: bool = False


class OpenAIRealtimeSession(Session):
    def __init__(self, connection: Connection, options: object) -> None:
        super().__init__(connection, options)
        self.settings = Settings(transcription=Transcription(model=self.config.model_name))
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
        try:
            event = SCHEMA.decode(message)
        except ProtocolError as exc:
            self._error_context = (client_event_id(message), getattr(exc, "path", None))
            raise
        try:
            await self._dispatch(event)
        except ProtocolError as exc:  # the connection sends error_message(): give it the context
            self._error_context = (event.event_id, getattr(exc, "path", None))
            raise

    async def _dispatch(self, event: Append | Commit | Clear | SessionUpdate) -> None:
        if isinstance(event, Append):
            await self.segments.push(decode_bytes(event.audio, self.settings.format.encoding))
        elif isinstance(event, Commit):
            await self._commit()
        elif isinstance(event, Clear):
            await self._clear()
        else:
            await self._update(event)

    async def _update(self, event: SessionUpdate) -> None:
        holds_audio = self.segments.current is not None or self.segments.holding
        self.settings = self.settings.updated(event.session, holds_audio)
        self.segments.rate = self.settings.format.rate
        await self.send({"type": "session.updated", "event_id": event_id(), "session": self.settings.describe()})

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

    def _empty_commit(self) -> InvalidField:
        return InvalidField(
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
