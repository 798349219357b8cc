"""`/v1/realtime`: vLLM's realtime transcription API over WebSocket.

Each `commit` with `final: true` ends an utterance (a segment); `transcription.done` follows its
last delta, and the next audio starts a new one. Audio appended before that `done` waits for the
next utterance, and so does a `commit final` sent behind it. `language` (in `session.update` or the
URL, as vLLM's transcription API names it) is what a multilingual model transcribes.
"""
from __future__ import annotations

import functools
import time
import uuid
from typing import TYPE_CHECKING

import msgspec

from ..streams.language import checked_language
from ..streams.protocol import Protocol
from ..streams.schema import Message, Schema
from ..streams.segments import State
from ..streams.session import Session
from ..streams.wire import decode_bytes, parse_sample_rate
from ..transport.codes import ProtocolError

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..streams.connection import Connection
    from ..streams.segments import Segment

# our codes -> the names vLLM's realtime server uses for the same failures
VLLM_CODES = {
    "unknown_type": "unknown_event",
    "invalid_base64": "invalid_audio",
    "invalid_audio_length": "invalid_audio",
}


class SessionFields(msgspec.Struct):
    sample_rate: int | None = None  # any model name is accepted: this server serves exactly one
    language: str | None = None


class SessionUpdate(Message, tag="session.update"):
    session: SessionFields | None = None
    sample_rate: int | None = None  # read when there is no `session`
    language: str | None = None  # likewise
    codes = {"sample_rate": "invalid_config", "session.sample_rate": "invalid_config",
             "language": "invalid_config", "session.language": "invalid_config"}


class Append(Message, tag="input_audio_buffer.append"):
    audio: bytes  # base64 PCM16 in the JSON


class Commit(Message, tag="input_audio_buffer.commit"):
    final: bool = False


SCHEMA = Schema(SessionUpdate, Append, Commit, unknown="Unknown event type:")


class VllmRealtimeSession(Session):
    announces_queue = True

    def __init__(self, connection: Connection, query: dict[str, str]) -> None:
        super().__init__(connection, query)
        self._query = query
        self._created = False

    def open(self) -> None:
        if "sample_rate" in self._query:
            self.segments.rate = parse_sample_rate(self._query["sample_rate"], from_url=True)
        self.segments.language = checked_language(self.connection.ctx.engine, self._query.get("language"))
        self.segments.open()  # wait for a slot at once: session.created says it is ours

    async def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            raise ProtocolError("invalid_message", "binary frames are not part of the realtime API")
        event = SCHEMA.decode(message)
        if isinstance(event, SessionUpdate):
            self._update(event.session or event)
        elif isinstance(event, Append):
            await self.segments.push(decode_bytes(event.audio, "pcm16"))
        else:
            self._commit(event.final)

    def _update(self, fields: SessionFields | SessionUpdate) -> None:
        if fields.language is not None:
            self._set_language(fields.language)
        if fields.sample_rate is None:
            return
        segment = self.segments.current or self.segments.open()
        if segment.received_samples:
            raise ProtocolError("bad_state", "sample_rate can only change before audio is sent")
        self.segments.rate = parse_sample_rate(fields.sample_rate)
        segment.set_input_rate(self.segments.rate)

    def _set_language(self, requested: str) -> None:
        """The language of the segments opened from now on; an open segment without audio yet is
        opened again in it."""
        segments = self.segments
        segments.language = checked_language(self.connection.ctx.engine, requested)
        segment = segments.current
        if segment is not None and segments.state is State.OPEN and not segment.received_samples \
                and segment.language != segments.language:
            segments.discard()
            segments.open()

    def _commit(self, final: bool) -> None:
        """Without `final`, a start marker (opens the segment); with it, the end of the utterance."""
        segments = self.segments
        if segments.state is State.DRAINING:  # then it ends the audio waiting behind the segment
            if final and segments.audio_waiting:
                segments.defer(functools.partial(self._commit, True))
            return
        segment = segments.current or segments.open()
        if final:
            segment.finalize()

    def on_admitted(self, segment: Segment) -> None:
        if not self._created:
            self._created = True
            self.post(
                {
                    "type": "session.created",
                    "id": f"sess-{uuid.uuid4().hex}",
                    "created": int(time.time()),
                    "model": self.config.model_name,
                    "sample_rate": self.segments.rate,
                }
            )

    def on_result(self, segment: Segment, result: StreamResult) -> None:
        if result.text:
            self.post({"type": "transcription.delta", "delta": result.text})

    def on_segment_finished(self, segment: Segment) -> None:
        usage = {"prompt_tokens": 0, "completion_tokens": segment.token_count, "total_tokens": segment.token_count}
        self.post({"type": "transcription.done", "text": segment.text, "usage": usage})

    def error_message(self, code: str, message: str) -> dict:
        return {"type": "error", "error": message, "code": VLLM_CODES.get(code, code)}


PROTOCOL = Protocol(name="vllm", metric="realtime", door="ws", path="/v1/realtime", session=VllmRealtimeSession)
