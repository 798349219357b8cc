"""Trio server in front of the ASR engine: TCP, WebSocket (native, /v1/realtime, /v1/listen, /v2/listen), HTTP, gRPC.

Layers, lowest first (a module imports its own layer and those below; every layer is handed the
settings and shared state of context.py):
- transport/: the bytes-level channels under one connection (TCP, WebSocket), the error codes.
- streams/: one connection and its audio streams through the engine: loops, budgets, sessions,
  segments, and what every protocol reads and writes.
- protocols/: the APIs, one module each, their registry and doors; files/ (uploads), riva/ (gRPC).
- operations/: health, metrics, the replica's agent, memory, ports, worker processes.
- top: app.py (the listeners and the drain), cli.py (parakeet-serve), worker.py (a worker's main).

Words used in this package, one meaning each:
- door: the way a client comes in, `tcp` or `ws` (protocols/doors.py); channel: the transport
  under one connection (transport/tcp.py, transport/websocket.py).
- connection: one client, from accept to close (streams/connection.py): its loops, budgets and end.
- protocol: an API the server speaks, declared in protocols/ (a `Protocol` entry each, listed in
  protocols/registry.py); session: that protocol's side of one connection (streams/session.py
  and its subclasses).
- stream: one client's audio through the engine (the engine's word, engine/__init__.py), named by
  its id `sid`: the engine's object for it is a Sequence, a door's an EngineStream (streams/stream.py).
- segment: an EngineStream for one stretch of a connection's audio (`Segment`, streams/segments.py);
  a connection runs one (native) or several in turn.
- final: the client's end of input for a segment (`Segment.finalize`, as the engine's).
- finished: a segment's lifecycle end: its final result delivered, or cancelled.
- end: a connection's end (`Connection.end(reason)`); then its channel closes.
- utterance: what the model ends with <EOU> or endpointing (`utterance_end`); a segment may
  hold several.
"""
from .app import serve
from .context import ServerConfig, ServerContext

__all__ = ["ServerConfig", "ServerContext", "serve"]
