"""Listeners for TCP, WebSocket, HTTP, the HAProxy agent and gRPC; graceful drain on shutdown; the
memory closed connections leave handed back (operations/memory.py)."""
from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from trio_websocket import WebSocketRequest, WebSocketServer

from .context import ServerConfig, ServerContext
from .operations.http import handle_http
from .operations.memory import reclaim_after_closes
from .operations.replica import handle_agent
from .protocols.doors import handle_tcp, handle_websocket
from .protocols.riva import RivaDoor, serve_riva
from .transport import ws_adapter
from .transport.channel import SEND_BUFFER_BYTES

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05
FINAL_GRACE_S = 5.0  # after the drain timeout: time for the final results of what was made final


async def serve(ctx: ServerContext, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until `ctx.shutdown` is set, then drain the connections and return.

    Reports {"tcp": port, "ws": port, "http": port[, "agent": port][, "grpc": port]} through `task_status` once
    listening. HTTP and the agent keep answering while draining (/ready 503, `drain`).
    """
    config = ctx.config
    async with trio.open_nursery() as handlers:
        tcp = await _listeners(config, "tcp", config.tcp_port)
        ws = await _listeners(config, "ws", config.ws_port)
        http = await _listeners(config, "http", config.http_port)
        config.ports = {"tcp": _port(tcp), "ws": _port(ws), "http": _port(http)}
        handlers.start_soon(reclaim_after_closes, ctx)
        handlers.start_soon(
            partial(trio.serve_listeners, _guarded(partial(handle_http, ctx)), http, handler_nursery=handlers)
        )
        if config.agent_port is not None:
            agent = await _listeners(config, "agent", config.agent_port)
            config.ports["agent"] = _port(agent)
            handlers.start_soon(
                partial(trio.serve_listeners, _guarded(partial(handle_agent, ctx)), agent, handler_nursery=handlers)
            )
        riva = await handlers.start(serve_riva, ctx) if config.grpc_port is not None else None
        async with trio.open_nursery() as accepting:
            accepting.start_soon(
                partial(trio.serve_listeners, _guarded(partial(handle_tcp, ctx)), tcp, handler_nursery=handlers)
            )
            ws_adapter.install()
            websockets = WebSocketServer(
                _guarded(partial(handle_websocket, ctx)),
                ws,
                handler_nursery=handlers,
                max_message_size=config.max_message_bytes,
                connect_timeout=config.handshake_timeout,
                disconnect_timeout=1,
            )
            accepting.start_soon(websockets.run)
            task_status.started(config.ports)
            await ctx.shutdown.wait()
            accepting.cancel_scope.cancel()  # stop accepting; sessions see the shutdown too
        await _drain(ctx, riva)
        handlers.cancel_scope.cancel()


async def _listeners(config: ServerConfig, door: str, port: int) -> list[trio.SocketListener]:
    """The listeners of one port: opened here, or (a worker process, operations/workers.py) the
    sockets the server's main process opened for every worker."""
    if door in config.listen_fds:
        return [trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))
                for fd in config.listen_fds[door]]
    return await open_listeners(config.host, port)


async def open_listeners(host: str, port: int) -> list[trio.SocketListener]:
    listeners = await trio.open_tcp_listeners(port, host=host)
    if port == 0 and len(listeners) > 1:  # one address family each got its own free port
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    for listener in listeners:
        listener.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    return listeners


async def _drain(ctx: ServerContext, riva: RivaDoor | None) -> None:
    """Active segments (and gRPC calls) go on until they end or the drain timeout passes; then their
    input is made final and they have FINAL_GRACE_S more for their final results."""
    with trio.move_on_after(ctx.config.drain_timeout):
        await _all_closed(ctx, riva)
    if _open(ctx, riva):
        log.warning("drain timeout: finalizing the segments of %d connections", _open(ctx, riva))
        ctx.drain_expired.set()
        with trio.move_on_after(FINAL_GRACE_S):
            await _all_closed(ctx, riva)
    if _open(ctx, riva):
        log.warning("closing %d connections", _open(ctx, riva))


def _open(ctx: ServerContext, riva: RivaDoor | None) -> int:
    """Connections and gRPC calls still open."""
    return ctx.open_sessions + (riva.open_calls if riva is not None else 0)


async def _all_closed(ctx: ServerContext, riva: RivaDoor | None) -> None:
    while _open(ctx, riva):
        await trio.sleep(DRAIN_POLL_S)


def _guarded(handler: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """A failing connection must never take the listeners down."""

    async def run(conn: trio.SocketStream | WebSocketRequest) -> None:
        try:
            await handler(conn)
        except Exception:
            log.exception("connection handler failed")

    return run


def _port(listeners: list[trio.SocketListener]) -> int:
    return listeners[0].socket.getsockname()[1]
