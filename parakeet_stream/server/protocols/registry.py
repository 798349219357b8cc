"""The registry: every API the server speaks on its TCP, WebSocket and HTTP doors, one line each.

PROTOCOLS: the streaming APIs. A module translates one API's messages (its Session subclass) and
declares how a connection reaches it (its `Protocol` entries: door, WebSocket path and dialect,
handshake, error codes). A connection is served by the first entry that accepts its door, path
and query: the catch-all native entries come last.

UPLOADS: the file transcription APIs, by the path a POST names on the HTTP port
(operations/http.py; files/exchange.py runs the module's handle() or refuse()).

Adding a protocol = one new module + one line here. (The gRPC door, riva/, is started beside
the listeners in app.py.)
"""
from __future__ import annotations

from ..streams.protocol import Protocol
from . import deepgram, deepgram_files, flux, native, openai_files, openai_realtime, vllm

PROTOCOLS: tuple[Protocol, ...] = (
    openai_realtime.PROTOCOL,  # ws /v1/realtime, with intent=transcription or model=... in the URL
    vllm.PROTOCOL,  # ws /v1/realtime
    deepgram.PROTOCOL,  # ws /v1/listen
    flux.PROTOCOL,  # ws /v2/listen
    native.WEBSOCKET,  # ws, any other path
    native.TCP,  # tcp
)

UPLOADS = {api.PATH: api for api in (openai_files, deepgram_files)}  # each: handle(), refuse()


def find(door: str, path: str, query: dict[str, str]) -> Protocol:
    return next(p for p in PROTOCOLS if p.serves(door, path, query))
