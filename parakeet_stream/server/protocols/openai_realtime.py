"""`/v1/realtime` (with `intent` or `model` in the URL): OpenAI's Realtime API, transcription
sessions, as the official `openai` SDK (3.x) speaks it.

The client appends base64 audio to an input buffer; the server answers with transcription
deltas of the current item and, once an item ends, `committed` and `completed`. An item ends at
the model's end of utterance (`<EOU>`) when turn detection is on (speech_started/speech_stopped
frame it), and at the client's `input_audio_buffer.commit` in any mode. A commit ends the
engine stream (flushing the last words); audio appended while it drains waits for the next one.
Times (`audio_start_ms`, `audio_end_ms`) count from the first audio of the connection.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import wire
from ..codes import ProtocolError
from ..context import ServerContext
from ..session import Channel, Session
from ..stream import EngineStream, text_tokens
from ..wire import decode_base64, decode_bytes, parse_sample_rate

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


def event_id() -> str:
    return f"event_{uuid.uuid4().hex}"


def item_id() -> str:
    return f"item_{uuid.uuid4().hex}"


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


class OpenAIRealtimeSession(Session):
    protocol = "openai"

    def __init__(self, ctx: ServerContext, channel: Channel) -> None:
        super().__init__(ctx, channel)
        self.format = AudioFormat()
        self.turn_detection: dict | None = dict(SERVER_VAD)
        self.transcription: dict | None = {"model": self.config.model_name}
        self.noise_reduction: dict | None = None
        self._tokenizer = ctx.engine.model.tokenizer
        self._error_context: tuple[str | None, str | None] = (None, None)  # (client event_id, param)
        self._item: Item | None = None
        self._previous_item: str | None = None
        self._offset = 0.0  # connection seconds where the current engine stream starts
        self._stream_seconds = 0.0  # audio appended to the current engine stream
        self._cleared_seconds = 0.0  # waiting audio dropped by a clear (it follows the stream)
        self._item_start = 0.0  # connection seconds where the next item starts
        self._commit_waiting = False  # a commit of the audio held while a committed stream drains

    # -- client events ----------------------------------------------------------------
    async def on_open(self) -> None:
        await self.send({"type": "session.created", "event_id": event_id(), "session": self._session()})

    async def on_unit(self, unit: str | bytes) -> None:
        event = self._event(unit)
        client_event = event.get("event_id")
        try:
            await self._dispatch(event)
        except ProtocolError as exc:  # the base class sends error_message(): give it the context
            self._error_context = (client_event if isinstance(client_event, str) else None, getattr(exc, "param", None))
            raise

    def _event(self, unit: str | bytes) -> dict:
        if isinstance(unit, bytes):
            raise ProtocolError("invalid_message", "binary frames are not part of the Realtime API")
        event = wire.loads(unit)
        if not isinstance(event, dict):
            raise ProtocolError("invalid_message", "an event must be a JSON object")
        return event

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
        session = event.get("session")
        if not isinstance(session, dict) or session.get("type") != "transcription":
            raise InvalidRequest(
                "invalid_field", "only transcription sessions are served: session.type must be 'transcription'",
                "session.type",
            )
        audio_input = _object(_object(session.get("audio"), "session.audio").get("input"), "session.audio.input")
        changes: dict[str, Any] = {}
        if "format" in audio_input:
            changes["format"] = parse_format(audio_input["format"])
            if changes["format"] != self.format and self._holds_audio():
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
        for name, value in changes.items():  # applied only once every field is valid
            setattr(self, name, value)
        await self.send({"type": "session.updated", "event_id": event_id(), "session": self._session()})

    def _session(self) -> dict:
        audio_input = {
            "format": self.format.describe(),
            "noise_reduction": self.noise_reduction,
            "transcription": self.transcription,
            "turn_detection": self.turn_detection,
        }
        return {"type": "transcription", "audio": {"input": audio_input}}

    async def _append(self, event: dict) -> None:
        if "audio" not in event:
            raise InvalidRequest("missing_field", "'audio' is required", "audio")
        try:
            raw = decode_base64(event["audio"])
        except ProtocolError as exc:  # its message names the native field
            raise InvalidRequest(exc.code, "'audio' must be a base64 string", "audio") from None
        samples = decode_bytes(raw, self.format.encoding)
        await self._audio(samples)

    async def _audio(self, samples: np.ndarray) -> None:
        if self.hold_while_draining(samples):  # the next stream opens once this one is done
            return
        stream = self.stream
        if stream is None:
            stream = self.stream = self.open_stream(None, self.format.rate)
        await self.push(stream, samples)
        self._stream_seconds += len(samples) / self.format.rate

    async def _commit(self) -> None:
        stream = self.stream
        if stream is not None and stream.finalized:
            if not self.held_audio:
                raise self._empty_commit()
            self._commit_waiting = True  # taken up when the draining stream is done
            return
        if stream is None or self._offset + self._stream_seconds <= self._item_start:
            raise self._empty_commit()
        item = self._current_item()
        item.committed = True
        await self.send(
            {"type": "input_audio_buffer.committed", "event_id": event_id(), "item_id": item.id,
             "previous_item_id": self._previous_item}
        )
        stream.finalize()

    def _empty_commit(self) -> InvalidRequest:
        return InvalidRequest(
            "input_audio_buffer_commit_empty", "Error committing input audio buffer: the buffer is empty."
        )

    async def _clear(self) -> None:
        """Drop the audio not yet committed: the waiting audio, or the current engine stream."""
        stream = self.stream
        if stream is not None and stream.finalized:
            self._cleared_seconds += sum(len(w) for w in self.held_audio) / self.format.rate
            self.held_audio, self._commit_waiting = [], False
        elif stream is not None:
            self._retire(stream)
            self._end_stream()
            self._item = None
            self._item_start = self._offset
        await self.send({"type": "input_audio_buffer.cleared", "event_id": event_id()})

    def _holds_audio(self) -> bool:
        return self.stream is not None or bool(self.held_audio)

    # -- results ----------------------------------------------------------------------
    async def on_admitted(self, stream: EngineStream) -> None:
        """session.created was sent at connect: results simply start to flow."""

    async def on_result(self, stream: EngineStream, result, text: str) -> None:
        if result.error:
            await self.send(self.error_message(result.error, "inference failed for this stream"))
            return
        times = [s for _, s in text_tokens(self._tokenizer, result)]
        if times or result.text:
            await self._transcribe(result.text, times[0] if times else 0.0)
        if result.utterance_end and self.turn_detection is not None and self._item is not None:
            await self._complete(self._offset + min(result.audio_seconds, self._stream_seconds))

    async def _transcribe(self, text: str, first_token: float) -> None:
        item = self._current_item()
        if not item.speaking and not item.committed and self.turn_detection is not None:
            item.speaking = True
            start = _ms(self._offset + first_token)
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

    async def on_stream_done(self, stream: EngineStream, error: str | None) -> None:
        end = self._offset + self._stream_seconds
        if error:
            self._end_stream()
            self.end(error)
            return
        if self._item is not None:
            await self._complete(end)
        self._item = None
        self._end_stream()
        self._item_start = self._offset
        if self.pending_end:
            self.end(self.pending_end)
            return
        waiting, self.held_audio = self.held_audio, []
        for samples in waiting:  # within the budget: checked as it arrived
            await self._audio(samples)
        if self._commit_waiting:
            self._commit_waiting = False
            await self._commit()

    def _end_stream(self) -> None:
        self.stream = None
        self._offset += self._stream_seconds + self._cleared_seconds
        self._stream_seconds = self._cleared_seconds = 0.0

    # -- messages ---------------------------------------------------------------------
    def error_message(self, code: str, message: str) -> dict:
        (client_event, param), self._error_context = self._error_context, (None, None)
        kind = "server_error" if code in SERVER_ERRORS else "invalid_request_error"
        error = {"type": kind, "code": code, "message": message, "param": param or PARAMS.get(code),
                 "event_id": client_event}
        return {"type": "error", "event_id": event_id(), "error": error}

    def queued_message(self, position: int, estimated_wait_s: float | None) -> dict | None:
        return None  # OpenAI has no such event: a queued client simply waits for transcripts

    def closed_message(self, reason: str) -> dict | None:
        return None  # the WebSocket close frame carries the reason


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
