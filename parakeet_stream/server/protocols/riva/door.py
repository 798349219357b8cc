"""The gRPC door: grpc's asyncio server on a thread of its own, with its own event loop.

Trio and the gRPC loop share no objects. Trio reaches the door through `RivaDoor`'s thread-safe
methods (`open_calls`, `begin_drain`, `finish`: a lock, or `loop.call_soon_threadsafe`); the
door's thread answers `start` and `stop` through the trio token (`run_sync_soon`), so the trio
loop never waits on gRPC and no trio worker thread does either. The engine wakes the calls from
its threads with `loop.call_soon_threadsafe` (engine_stream.py). Every call is a coroutine on
this one loop: no thread per stream.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import grpc
import trio
from riva.client.proto.riva_asr_pb2_grpc import add_RivaSpeechRecognitionServicer_to_server

from ...context import ServerContext
from .parsing import TolerantParsing
from .servicer import RivaServicer
from .state import DoorState

STOP_GRACE_S = 1.0  # after the drain: calls still open are cancelled this long after the stop


class RivaDoor:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.state = DoorState()
        self._servicer = RivaServicer(ctx, self.state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._stopped: Callable[[None], None] = lambda _: None  # stop()'s reply

    @property
    def open_calls(self) -> int:
        return self.state.open_calls

    def start(self, reply: Callable[[int | BaseException], None]) -> None:
        """Start the thread; it calls `reply` with the port once listening, or with the error."""
        self._thread = threading.Thread(target=self._run, args=(reply,), name="riva-grpc", daemon=True)
        self._thread.start()

    def stop(self, reply: Callable[[None], None]) -> None:
        """Stop listening and cancel what is left; the thread calls `reply(None)` as it ends."""
        self._stopped = reply
        with contextlib.suppress(RuntimeError):  # the loop already ended
            self._loop.call_soon_threadsafe(self._stop.set)
        if not self._thread.is_alive():  # it ended before it could know whom to tell
            reply(None)

    def begin_drain(self) -> None:
        """New calls get UNAVAILABLE; calls waiting for a slot get it too, at once."""
        self.state.drain()
        self._loop.call_soon_threadsafe(self._servicer.on_drain)

    def finish(self) -> None:
        """The drain timeout passed: every stream is finalized (its final result is still sent)."""
        self._loop.call_soon_threadsafe(self._servicer.on_finish)

    def _run(self, reply: Callable[[int | BaseException], None]) -> None:
        try:
            asyncio.run(self._serve(reply))
        finally:
            self._stopped(None)

    async def _serve(self, reply: Callable[[int | BaseException], None]) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            server, port = await self._listen()
        except Exception as exc:
            reply(exc)
            return
        reply(port)
        await self._stop.wait()
        await server.stop(STOP_GRACE_S)

    async def _listen(self) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[TolerantParsing()], options=server_options(self.ctx))
        add_RivaSpeechRecognitionServicer_to_server(self._servicer, server)
        host, port = self.ctx.config.host, self.ctx.config.grpc_port
        try:
            port = server.add_insecure_port(address(host, port))
        except RuntimeError:  # grpc's way of saying so (its message only points to its debug log)
            raise OSError(f"cannot listen for gRPC on {address(host, port)}: address in use or not available") from None
        await server.start()
        return server, port


def server_options(ctx: ServerContext) -> list[tuple[str, int]]:
    config, stats = ctx.config, ctx.engine.stats()
    return [
        # a second server on the same port must fail, not share it; worker processes share theirs
        ("grpc.so_reuseport", int(bool(config.listen_fds))),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        # a connection may carry no more streams than the engine could ever hold (slots + queue)
        ("grpc.max_concurrent_streams", stats["max_num_streams"] + stats["max_queue"]),
        ("grpc.server_handshake_timeout_ms", int(config.handshake_timeout * 1000)),
    ]


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_riva(ctx: ServerContext, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the door beside the trio listeners: listening once started (the port goes into
    `ctx.config.ports["grpc"]`), draining with the server, stopped when cancelled."""
    door = RivaDoor(ctx)
    ctx.config.ports["grpc"] = await _answer_from_door(door.start)
    try:
        task_status.started(door)
        await ctx.shutdown.wait()
        door.begin_drain()
        await ctx.drain_expired.wait()
        door.finish()
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await _answer_from_door(door.stop)


async def _answer_from_door(action: Callable[[Callable], None]):
    """`action(reply)`, then wait until the door's thread calls `reply(value)`: it hops into
    trio with the trio token, so no trio worker thread waits on the door."""
    token, answered, box = trio.lowlevel.current_trio_token(), trio.Event(), []

    def reply(value) -> None:
        box.append(value)
        token.run_sync_soon(answered.set)

    action(reply)
    await answered.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]
