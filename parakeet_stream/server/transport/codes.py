"""Stable error codes sent to clients and what the server does with the connection. These are
shared by every protocol; a protocol's own codes are declared in its module (`Protocol.codes`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    closes: bool
    ws_close_code: int | None  # WebSocket close code when the connection is closed


KEEP_OPEN = Policy(closes=False, ws_close_code=None)

POLICIES: dict[str, Policy] = {
    # client mistakes on one message: the message is dropped, the stream goes on
    "invalid_json": KEEP_OPEN,
    "invalid_message": KEEP_OPEN,
    "unknown_type": KEEP_OPEN,
    "missing_field": KEEP_OPEN,
    "invalid_field": KEEP_OPEN,
    "invalid_base64": KEEP_OPEN,
    "invalid_audio_length": KEEP_OPEN,
    "invalid_samples": KEEP_OPEN,
    "stream_closed": KEEP_OPEN,
    "bad_state": KEEP_OPEN,
    # the connection cannot go on
    "invalid_utf8": Policy(True, 1007),
    "message_too_large": Policy(True, 1009),
    "invalid_config": Policy(True, 1008),
    "bad_request": Policy(True, 1002),  # a malformed HTTP request or WebSocket handshake: HTTP 400
    "bad_lookahead": Policy(True, 1008),
    "invalid_phrases": Policy(True, 1008),  # key phrases beyond a limit: the stream cannot start as asked
    "unsupported_language": Policy(True, 1008),  # a language the model does not transcribe
    "diarization_unavailable": Policy(True, 1008),  # speakers asked of a server without a diarizer
    "unauthorized": Policy(True, 1008),  # WebSocket: the handshake is refused with HTTP 401
    "forbidden_origin": Policy(True, 1008),  # WebSocket only: handshake refused with HTTP 403
    "idle_timeout": Policy(True, 1000),
    "slow_consumer": Policy(True, 1008),
    "queue_full": Policy(True, 1013),
    "inference_error": Policy(True, 1011),
    "internal_error": Policy(True, 1011),
}

# Reasons for a server-initiated close that is not an error (sent in a `closed` message).
CLOSE_REASONS: dict[str, int] = {
    "completed": 1000,
    "max_stream_seconds": 1000,
    "server_shutdown": 1001,
}


class ProtocolError(Exception):
    """A client-visible error: `code` is stable, `message` is safe to send."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_body(code: str, message: str) -> dict:
    """The server's own error message (native protocol; HTTP and refused handshakes)."""
    return {"type": "error", "code": code, "message": message}
