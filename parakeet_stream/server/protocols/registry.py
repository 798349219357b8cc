"""The protocols the server speaks, one module each: a module translates one API's messages
(its Session subclass) and declares how a connection reaches it (its `Protocol` entries: door,
WebSocket path and dialect, handshake, error codes).

Adding a protocol = one new module + one line in PROTOCOLS. A connection is served by the first
entry that accepts its door, path and query: the catch-all native entries come last.
"""
from __future__ import annotations

from ..streams.protocol import Protocol
from . import deepgram, native, openai_realtime, vllm

PROTOCOLS: tuple[Protocol, ...] = (
    openai_realtime.PROTOCOL,  # ws /v1/realtime, with intent=transcription or model=... in the URL
    vllm.PROTOCOL,  # ws /v1/realtime
    deepgram.PROTOCOL,  # ws /v1/listen
    native.WEBSOCKET,  # ws, any other path
    native.TCP,  # tcp
)


def find(door: str, path: str, query: dict[str, str]) -> Protocol:
    return next(p for p in PROTOCOLS if p.serves(door, path, query))
