"""`/v1/realtime` (with `intent` or `model` in the URL): OpenAI's Realtime API, transcription
sessions, as the official `openai` SDK (3.x) speaks it.

The client appends base64 audio to an input buffer; the server answers with transcription
deltas of the current item and, once an item ends, `committed` and `completed`. An item ends at
the model's end of utterance (`<EOU>`) when turn detection is on (speech_started/speech_stopped
frame it), and at the client's `input_audio_buffer.commit` in any mode. With `semantic_vad`, an
end of utterance where the item's words cannot end a sentence (sentence_ends.py: "send it to the")
waits for the speaker: the item goes on with the next words, or ends once the silence since its
last word lasted its eagerness' UNFINISHED_WAIT. A commit ends the
segment (flushing the last words); audio appended while it drains waits for the next one, and
a commit of it is committed at once, its segment made final when it opens. Times
(`audio_start_ms`, `audio_end_ms`) count from the first audio of the connection. The client
events and the settings they set are typed in openai_events.py; each segment boosts the key
phrases the session's transcription settings named when it opened, in their `language` (a
multilingual model's).
"""
from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...engine.phrases import PhraseError
from ...sentence_ends import unfinished
from ..streams.language import checked_language
from ..streams.protocol import Protocol
from ..streams.schema import InvalidField
from ..streams.segments import State
from ..streams.session import Session
from ..streams.wire import decode_bytes
from ..streams.words import first_text_time, last_text_time
from ..transport.codes import KEEP_OPEN, ProtocolError
from .openai_events import (SCHEMA, TRANSCRIPTION_PATH, Append, Clear, Commit, SemanticVad, SessionUpdate, Settings,
                            Transcription, client_event_id)

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..streams.connection import Connection
    from ..streams.segments import Segment

TRANSCRIPTION = "conversation.item.input_audio_transcription"
# semantic_vad: seconds of silence after the last word that end an item whose words cannot end a
# sentence (high: as soon as Flux's default would, medium twice that, low four times)
UNFINISHED_WAIT = {"high": 0.7, "medium": 1.4, "auto": 1.4, "low": 2.8}
SERVER_ERRORS = {"inference_error", "internal_error"}
# the `param` of the audio decoding errors (raised by wire, which knows no OpenAI)
PARAMS = {"invalid_audio_length": "audio", "invalid_samples": "audio"}
CODES = {
    "input_audio_buffer_commit_empty": KEEP_OPEN,  # OpenAI's own: a commit with no audio
    "invalid_phrases": KEEP_OPEN,  # an error event: the session goes on with its settings unchanged
    "unsupported_language": KEEP_OPEN,  # likewise
}


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
    last_word: float = 0.0  # connection seconds of its last text token
    held: bool = False  # an end of utterance came where its words cannot end a sentence


class OpenAIRealtimeSession(Session):
    """The input buffer's commit and clear decide on the segments' state (streams/segments.py):

    | state    | commit                                             | clear                          |
    | IDLE     | input_audio_buffer_commit_empty                    | cleared                        |
    | OPEN     | committed; the segment's input is final (DRAINING) | the segment is dropped (IDLE)  |
    |          | (commit_empty when no audio since the last item)   |                                |
    | DRAINING | audio waiting: committed at once, its segment made | the audio waiting behind the   |
    |          | final when it opens; none: commit_empty            | last commit is dropped         |

    Each transition posts its events in the same step, so an item is committed once, and a clear
    never meets a commit half done.
    """

    def __init__(self, connection: Connection, options: object) -> None:
        super().__init__(connection, options)
        self.settings = Settings(transcription=Transcription(model=self.config.model_name))
        self.segments.rate = self.settings.format.rate
        self._error_context: tuple[str | None, str | None] = (None, None)  # (client event_id, param)
        self._item: Item | None = None  # the item the current segment's words go to
        self._waiting: deque[Item] = deque()  # committed items whose audio waits for its segment
        self._previous_item: str | None = None  # the last item committed
        self._item_start = 0.0  # connection seconds where the next item starts

    # -- client events ----------------------------------------------------------------
    def open(self) -> None:
        self.post({"type": "session.created", "event_id": event_id(), "session": self.settings.describe()})

    async def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            raise ProtocolError("invalid_message", "binary frames are not part of the Realtime API")
        try:
            event = SCHEMA.decode(message)
        except ProtocolError as exc:
            self._error_context = (client_event_id(message), getattr(exc, "path", None))
            raise
        try:
            if isinstance(event, Append):
                await self.segments.push(decode_bytes(event.audio, self.settings.format.encoding))
            elif isinstance(event, Commit):
                self._commit()
            elif isinstance(event, Clear):
                self._clear()
            else:
                self._update(event)
        except ProtocolError as exc:  # the connection sends error_message(): give it the context
            self._error_context = (event.event_id, getattr(exc, "path", None))
            raise

    def _update(self, event: SessionUpdate) -> None:
        settings = self.settings.updated(event.session, holds_audio=self.segments.state is not State.IDLE)
        if settings.phrases != self.settings.phrases:
            try:  # what the model cannot boost is refused with the update, not at the next audio
                self.connection.ctx.engine.check_phrases(settings.phrases)
            except PhraseError as exc:
                raise InvalidField(exc.code, exc.message, f"{TRANSCRIPTION_PATH}.keywords") from None
        try:
            language = checked_language(self.connection.ctx.engine, settings.language)
        except ProtocolError as exc:
            raise InvalidField(exc.code, exc.message, f"{TRANSCRIPTION_PATH}.language") from None
        self.settings = settings
        self.segments.rate = self.settings.format.rate
        self.segments.phrases = self.settings.phrases
        self.segments.language = language
        self.post({"type": "session.updated", "event_id": event_id(), "session": self.settings.describe()})

    def _commit(self) -> None:
        segments = self.segments
        match segments.state:
            case State.DRAINING if segments.audio_waiting:
                item = Item(item_id(), start=0.0)  # it starts where its segment opens
                self._commit_item(item)
                self._waiting.append(item)
                segments.defer(self._open_committed)
            case State.OPEN if segments.current.heard_until() > self._item_start:
                self._commit_item(self._current_item())
                segments.current.finalize()
            case _:
                raise InvalidField(
                    "input_audio_buffer_commit_empty", "Error committing input audio buffer: the buffer is empty."
                )

    def _open_committed(self) -> None:
        """The audio of a committed item is in its own segment now: its input is final."""
        item, segment = self._waiting.popleft(), self.segments.current
        item.start = segment.offset
        self._item = item
        segment.finalize()

    def _clear(self) -> None:
        """Drop the audio not yet committed: what waits behind the last commit, or the current segment."""
        segments = self.segments
        match segments.state:
            case State.DRAINING:
                segments.drop_waiting_audio()
            case State.OPEN:
                segments.discard()
                self._item = None
                self._item_start = segments.offset
        self.post({"type": "input_audio_buffer.cleared", "event_id": event_id()})

    # -- results ----------------------------------------------------------------------
    def on_result(self, segment: Segment, result: StreamResult) -> None:
        first = first_text_time(self.info.tokenizer, result)
        if first is not None or result.text:
            self._transcribe(segment, result.text, first or 0.0)
        if first is not None:
            self._current_item().last_word = segment.offset + last_text_time(self.info.tokenizer, result)
            self._item.held = False
        item, now = self._item, segment.heard_until(result)
        if self.settings.turn_detection is None or item is None:
            return
        if result.utterance_end:
            item.held = self._waits(item)
        if (result.utterance_end and not item.held) or (item.held and now - item.last_word >= self._wait()):
            self._complete(now)

    def _waits(self, item: Item) -> bool:
        """semantic_vad: whether an end of utterance here leaves the speaker time to go on (English only:
        the counts are of English sentences)."""
        english = (self.segments.language or "en").lower().startswith("en")
        return isinstance(self.settings.turn_detection, SemanticVad) and english and unfinished(item.text)

    def _wait(self) -> float:
        return UNFINISHED_WAIT[self.settings.turn_detection.eagerness or "auto"]

    def _transcribe(self, segment: Segment, text: str, first_token: float) -> None:
        item = self._current_item()
        if not item.speaking and not item.committed and self.settings.turn_detection is not None:
            item.speaking = True
            start = _ms(segment.offset + first_token)
            self._post_item_event(item, "input_audio_buffer.speech_started", audio_start_ms=start)
        delta = text if item.text else text.lstrip()
        if delta:
            item.text += delta
            self._post_item_event(item, f"{TRANSCRIPTION}.delta", content_index=0, delta=delta)

    def _current_item(self) -> Item:
        if self._item is None:
            self._item = Item(item_id(), self._item_start)
        return self._item

    def _commit_item(self, item: Item) -> None:
        item.committed = True
        self._post_item_event(item, "input_audio_buffer.committed", previous_item_id=self._previous_item)
        self._previous_item = item.id

    def _post_item_event(self, item: Item, kind: str, **fields) -> None:
        self.post({"type": kind, "event_id": event_id(), "item_id": item.id, **fields})

    def _complete(self, end: float) -> None:
        """End the current item at `end` (connection seconds): speech_stopped (unless the client
        committed it), committed (once), completed."""
        item = self._item
        if item.speaking and not item.committed:
            self._post_item_event(item, "input_audio_buffer.speech_stopped", audio_end_ms=_ms(end))
        if not item.committed:
            self._commit_item(item)
        usage = {"type": "duration", "seconds": round(max(0.0, end - item.start), 3)}
        self._post_item_event(item, f"{TRANSCRIPTION}.completed", content_index=0, transcript=item.text, usage=usage)
        self._item, self._item_start = None, end

    def on_segment_finished(self, segment: Segment) -> None:
        if self._item is not None:
            self._complete(segment.heard_until())
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
