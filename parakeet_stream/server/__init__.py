"""Trio server in front of the ASR engine: TCP, WebSocket (native, /v1/realtime, /v1/listen, /v2/listen), HTTP.

Words used in this package, one meaning each:
- door: the way a client comes in, `tcp` or `ws` (doors.py); channel: the transport under one
  connection (tcp.py, websocket.py).
- connection: one client, from accept to close (connection.py): its loops, budgets and end.
- protocol: an API the server speaks, declared in protocols/ (a `Protocol` entry each);
  session: that protocol's side of one connection (session.py and its subclasses).
- segment: the server's handle on one engine stream (segment.py); a connection runs one
  (native) or several in turn (segments.py).
- final: the client's end of input for a segment (`Segment.finalize`, as the engine's).
- finished: a segment's lifecycle end: its final result delivered, or cancelled.
- end: a connection's end (`Connection.end(reason)`); then its channel closes.
- utterance: what the model ends with <EOU> or endpointing (`utterance_end`); a segment may
  hold several.
"""
from .app import serve
from .context import ServerConfig, ServerContext

__all__ = ["ServerConfig", "ServerContext", "serve"]
