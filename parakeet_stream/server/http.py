"""Small HTTP/1.1 server on h11: /health, /ready, /metrics and static files."""
from __future__ import annotations

import logging
from urllib.parse import urlsplit

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST

from . import jsonio
from .context import ServerContext
from .static import static_file

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16384
JSON = "application/json"
Response = tuple[int, bytes, str]


async def handle_http(ctx: ServerContext, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    try:
        with trio.move_on_after(ctx.config.handshake_timeout):
            request = await _read_request(conn, stream)
            if request is not None:
                status, body, content_type = route(ctx, request.method, request.target)
                await _respond(conn, stream, status, body, content_type)
    except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(MAX_REQUEST_BYTES))
        elif isinstance(event, h11.Request):
            return event
        else:
            return None


async def _respond(
    conn: h11.Connection, stream: trio.SocketStream, status: int, body: bytes, content_type: str
) -> None:
    headers = [
        ("content-type", content_type),
        ("content-length", str(len(body))),
        ("connection", "close"),
        ("cache-control", "no-store"),
    ]
    data = conn.send(h11.Response(status_code=status, headers=headers))
    data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    await stream.send_all(data)


def route(ctx: ServerContext, method: bytes, target: bytes) -> Response:
    if method != b"GET":
        return 405, _json({"error": "method not allowed"}), JSON
    path = urlsplit(target.decode("latin-1")).path
    if path == "/health":
        return 200, _json(health(ctx)), JSON
    if path == "/ready":
        ready = ctx.ready()
        return (200 if ready else 503), _json({"ready": ready, **ctx.engine.stats()}), JSON
    if path == "/metrics":
        return 200, ctx.metrics.render(), CONTENT_TYPE_LATEST
    found = static_file(path)
    if found is None:
        return 404, _json({"error": "not found"}), JSON
    return 200, *found


def health(ctx: ServerContext) -> dict:
    return {
        "status": "draining" if ctx.shutdown.is_set() else "ok",
        "model": ctx.config.model_name,
        "sample_rate": ctx.engine.sample_rate,
        "ports": ctx.config.ports,
        "connections": ctx.open_sessions,
        **ctx.engine.stats(),
    }


def _json(obj: dict) -> bytes:
    return jsonio.dumps(obj)
