"""Small HTTP/1.1 server on h11: /health, /ready, /metrics, static files, and the file
transcription APIs (POST, protocols/*_files.py, listed in protocols/registry.py)."""
from __future__ import annotations

import functools
import logging
import math
import mimetypes
import re
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote, urlsplit

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST

from ...model.registry import REPO_WEIGHTS
from ..context import ServerContext
from ..protocols.files.exchange import serve_upload
from ..protocols.registry import UPLOADS
from ..streams import wire
from ..transport.channel import half_close_and_drain
from .replica import replica_state

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16384
JSON = "application/json"
Response = tuple[int, bytes, str]
# a hostname or IPv4 address as a CSP host-source can name it (IPv6 literals cannot be named)
_CSP_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")


async def handle_http(ctx: ServerContext, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    try:
        with trio.move_on_after(ctx.config.handshake_timeout) as scope:
            request = await _read_request(conn, stream)
            if request is not None and (upload := upload_api(request)):
                scope.deadline = math.inf  # an upload keeps its own clocks (protocols/files/exchange.py)
                await serve_upload(upload, ctx, conn, stream, request)
            elif request is not None:
                status, body, content_type = route(ctx, request.method, request.target)
                headers = security_headers(ctx, _host(request.headers))
                await _respond(conn, stream, status, body, content_type, headers, head=request.method == b"HEAD")
    except h11.RemoteProtocolError as exc:  # malformed: 400 (a transfer coding h11 lacks: 501); too big: 431
        with trio.move_on_after(1):
            await _refuse(stream, exc.error_status_hint)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def _refuse(stream: trio.SocketStream, status: int) -> None:
    """Answer a request h11 could not parse (its connection state is spent), then half-close
    and drain, so that the client reads the answer rather than a reset."""
    body = _json({"error": HTTPStatus(status).phrase.lower()})
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
    head += f"content-type: {JSON}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    try:
        await stream.send_all(head.encode() + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    await half_close_and_drain(stream, 1)


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    received = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            # never more than the head may take, so that no body byte is counted as part of it
            # (h11 alone lets a request that arrives whole pass)
            if received >= MAX_REQUEST_BYTES:
                raise h11.RemoteProtocolError("request header fields too large", error_status_hint=431)
            data = await stream.receive_some(MAX_REQUEST_BYTES - received)
            received += len(data)
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            return event
        else:
            return None


async def _respond(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    body: bytes,
    content_type: str,
    extra: Sequence[tuple[str, str]] = (),
    head: bool = False,  # the answer to a HEAD request: its headers only
) -> None:
    if content_type.startswith("text/") and "charset" not in content_type:
        content_type += "; charset=utf-8"
    headers = [
        ("content-type", content_type),
        ("content-length", str(len(body))),
        ("connection", "close"),
        ("cache-control", "no-store"),
        *extra,
    ]
    data = conn.send(h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase))
    if not head:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)


def upload_api(request: h11.Request):
    """The upload API module a POST names, or None."""
    if request.method != b"POST":
        return None
    try:
        return UPLOADS.get(urlsplit(request.target.decode("latin-1")).path.rstrip("/"))
    except ValueError:
        return None


def route(ctx: ServerContext, method: bytes, target: bytes) -> Response:
    if method != b"GET":
        return 405, _json({"error": "method not allowed"}), JSON
    try:
        path = urlsplit(target.decode("latin-1")).path
    except ValueError:  # e.g. an unclosed IPv6 bracket: "http://[::1/"
        return 400, _json({"error": "bad request"}), JSON
    if path == "/health":
        body = health(ctx)
        return (503 if body["status"] == "broken" else 200), _json(body), JSON
    if path == "/ready":
        state = replica_state(ctx)
        body = {"ready": state.ready, "reason": state.reason, "queue_room": state.queue_room, **ctx.engine.stats()}
        return (200 if state.ready else 503), _json(body), JSON
    if path == "/metrics":
        return 200, ctx.metrics.render(), CONTENT_TYPE_LATEST
    found = static_file(path)
    if found is None:
        return 404, _json({"error": "not found"}), JSON
    return 200, *found


def security_headers(ctx: ServerContext, host: str | None) -> list[tuple[str, str]]:
    """The page's Content-Security-Policy (own scripts and styles only, no inline code; the
    socket it may open is the server's WebSocket port) and headers that keep the page's URL,
    which may carry ?api_key=, out of Referer headers and other sites' frames."""
    ws = ctx.config.ports.get("ws", ctx.config.ws_port)
    name = host if host and _CSP_HOST.fullmatch(host) else "*"
    csp = (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        f"connect-src 'self' ws://{name}:{ws} wss://{name}:{ws}; "
        "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return [
        ("content-security-policy", csp),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ]


def _host(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The host name of the request's Host header, without the port."""
    for name, value in headers:
        if name == b"host":
            host = value.decode("latin-1").strip()
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return None


def health(ctx: ServerContext) -> dict:
    state = replica_state(ctx)
    return {
        "status": "broken" if not state.healthy else "draining" if ctx.shutdown.is_set() else "ok",
        "model": ctx.config.model_name,
        "demo_model": is_demo_model(ctx.config.model_name),
        "sample_rate": ctx.engine.info.sample_rate,
        "ports": ctx.config.ports,
        "connections": ctx.open_sessions,
        "precision": ctx.engine.info.precision.summary(),
        "start": {"seconds": ctx.engine.info.start_seconds, "cuda_graphs": ctx.engine.info.cuda_graphs,
                  "phases": ctx.engine.info.start_phases},
        "latency": ctx.engine.latency_figures(),
        **ctx.engine.stats(),
    }


@functools.cache
def is_demo_model(name: str) -> bool:
    """Whether `name` (a --model value) is the bundled demo model, which the captions page warns
    about: it understands synthetic speech only."""
    return name == "demo" or Path(name).resolve() == (REPO_WEIGHTS / "demo").resolve()


def _json(obj: dict) -> bytes:
    return wire.dumps(obj)

WEB_ROOT = Path(__file__).resolve().parents[2] / "web"

# Fixed types for what the page uses: module scripts need a JavaScript type whatever the
# system's mime.types says (browsers refuse `import` of text/plain), stylesheets need text/css.
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain",
}


def static_file(path: str, root: Path = WEB_ROOT) -> tuple[bytes, str] | None:
    """The file a GET of `path` names (`/` -> index.html), or None; never leaves `root`.

    `path` is the URL path, still percent-encoded: it is decoded once here, and any `..`,
    `.`-file, backslash or NUL segment is refused before the file system is asked.
    """
    try:
        segments = [s for s in unquote(path, errors="strict").split("/") if s]
    except UnicodeDecodeError:
        return None
    if any(s.startswith(".") or "\\" in s or "\0" in s for s in segments):
        return None
    root = root.resolve()
    candidate = root.joinpath(*segments) if segments else root / "index.html"
    try:
        candidate = candidate.resolve()
        if not candidate.is_relative_to(root) or not candidate.is_file():
            return None
        body = candidate.read_bytes()
    except (OSError, ValueError):
        return None
    suffix = candidate.suffix.lower()
    content_type = CONTENT_TYPES.get(suffix) or mimetypes.guess_type(candidate.name)[0] or "application/octet-stream"
    return body, content_type
