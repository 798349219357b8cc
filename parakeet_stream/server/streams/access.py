"""The access log: one line when a connection opens and one when it closes, the same for every
door (TCP and WebSocket connections, gRPC calls, HTTP uploads), on the `parakeet_stream.connections`
logger (silence it on its own with `logging.getLogger("parakeet_stream.connections").setLevel(...)`).

Reasons: `completed` (done, whoever closed), `vanished` (the client left in the middle of a
stream), `server_shutdown` (drained, or cut by a second signal), or the error code that ended it.
"""
from __future__ import annotations

import logging

log = logging.getLogger("parakeet_stream.connections")


def opened(peer: str, door: str, protocol: str) -> str:
    """Log the open line; returns the words that name the connection in its close line."""
    where = f"peer={peer} door={door} protocol={protocol}"
    log.info("connection open %s", where)
    return where


def closed(where: str, reason: str, audio_seconds: float, results: int) -> None:
    log.info("connection closed %s reason=%s audio_s=%.1f results=%d", where, reason, audio_seconds, results)
