"""`/v1/realtime`: vLLM's realtime transcription API over WebSocket."""
from __future__ import annotations

import time
import uuid
from typing import Any

from ... import audio
from .. import wire
from ..codes import ProtocolError
from ..context import ServerContext
from ..session import Channel, Session
from ..stream import EngineStream
from ..wire import decode_base64, decode_bytes, parse_sample_rate

# our codes -> the names vLLM's realtime server uses for the same failures
VLLM_CODES = {
    "unknown_type": "unknown_event",
    "invalid_base64": "invalid_audio",
    "invalid_audio_length": "invalid_audio",
}


class VllmRealtimeSession(Session):
    protocol = "realtime"

    def __init__(self, ctx: ServerContext, channel: Channel, query: dict[str, str]) -> None:
        super().__init__(ctx, channel)
        self._query = query
        self.sample_rate = audio.SAMPLE_RATE
        self._created = False

    async def on_open(self) -> None:
        if "sample_rate" in self._query:
            self.sample_rate = parse_sample_rate(self._query["sample_rate"], from_url=True)
        self._ensure_stream()

    def _ensure_stream(self) -> EngineStream:
        """The stream of the current utterance; a new one after transcription.done."""
        if self.stream is None:
            self.stream = self.open_stream(None, self.sample_rate)
        return self.stream

    async def on_unit(self, unit: str | bytes) -> None:
        if isinstance(unit, bytes):
            raise ProtocolError("invalid_message", "binary frames are not part of the realtime API")
        event = wire.loads(unit)
        if not isinstance(event, dict):
            raise ProtocolError("invalid_message", "an event must be a JSON object")
        kind = event.get("type")
        if kind == "session.update":
            self._update(event)
        elif kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            self._commit(event)
        else:
            raise ProtocolError("unknown_type", f"Unknown event type: {str(kind)[:40]}")

    def _update(self, event: dict[str, Any]) -> None:
        # any model name is accepted: this server serves exactly one
        session = event.get("session") if isinstance(event.get("session"), dict) else event
        if session.get("sample_rate") is None:
            return
        stream = self._ensure_stream()
        if stream.received_samples:
            raise ProtocolError("bad_state", "sample_rate can only change before audio is sent")
        self.sample_rate = parse_sample_rate(session["sample_rate"])
        stream.set_input_rate(self.sample_rate)

    async def _append(self, event: dict[str, Any]) -> None:
        if "audio" not in event:
            raise ProtocolError("missing_field", "'audio' is required")
        samples = decode_bytes(decode_base64(event["audio"]), "pcm16")
        stream = self._ensure_stream()
        if stream.finalized:
            raise ProtocolError("stream_closed", "wait for transcription.done before the next utterance")
        await self.push(stream, samples)

    def _commit(self, event: dict[str, Any]) -> None:
        final = event.get("final", False)
        if not isinstance(final, bool):
            raise ProtocolError("invalid_field", "'final' must be a boolean")
        stream = self._ensure_stream()
        if final:
            stream.finalize()

    async def on_admitted(self, stream: EngineStream) -> None:
        if not self._created:
            self._created = True
            await self.send(
                {
                    "type": "session.created",
                    "id": f"sess-{uuid.uuid4().hex}",
                    "created": int(time.time()),
                    "model": self.config.model_name,
                    "sample_rate": self.sample_rate,
                }
            )

    async def on_result(self, stream: EngineStream, result, text: str) -> None:
        if result.error:
            await self.send(self.error_message(result.error, "inference failed for this stream"))
        elif result.text:
            await self.send({"type": "transcription.delta", "delta": result.text})

    async def on_stream_done(self, stream: EngineStream, error: str | None) -> None:
        self.stream = None
        if error:
            self.end(error)
            return
        usage = {"prompt_tokens": 0, "completion_tokens": stream.token_count, "total_tokens": stream.token_count}
        await self.send({"type": "transcription.done", "text": stream.text, "usage": usage})
        if self.pending_end:
            self.end(self.pending_end)

    def error_message(self, code: str, message: str) -> dict:
        return {"type": "error", "error": message, "code": VLLM_CODES.get(code, code)}

    def closed_message(self, reason: str) -> dict | None:
        return None  # the WebSocket close frame carries the reason
