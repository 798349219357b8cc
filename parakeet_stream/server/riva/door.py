"""The gRPC door: grpc's asyncio server on a thread of its own, with its own event loop.

Trio and the gRPC loop share no objects. Trio reaches the door through `RivaDoor`'s thread-safe
methods (`open_calls`, `begin_drain`, `finish`: a lock, or `loop.call_soon_threadsafe`), and
starts and stops it in trio's worker threads, so the trio loop never waits on gRPC. The engine
wakes the calls from its threads with `loop.call_soon_threadsafe` (engine_stream.py). Every call
is a coroutine on this one loop: no thread per stream.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading

import grpc
import trio
from riva.client.proto.riva_asr_pb2_grpc import add_RivaSpeechRecognitionServicer_to_server

from ..context import ServerContext
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

    @property
    def open_calls(self) -> int:
        return self.state.open_calls

    def start(self) -> int:
        """Start the thread and listen; returns the port (blocking: run it in a worker thread)."""
        listening: concurrent.futures.Future[int] = concurrent.futures.Future()
        serve = self._serve(listening)
        self._thread = threading.Thread(target=asyncio.run, args=(serve,), name="riva-grpc", daemon=True)
        self._thread.start()
        try:
            return listening.result()
        except BaseException:
            self._thread.join()
            raise

    def stop(self) -> None:
        """Stop listening, cancel what is left, end the thread (blocking)."""
        with contextlib.suppress(RuntimeError):  # the loop already ended
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def begin_drain(self) -> None:
        """New calls get UNAVAILABLE; calls waiting for a slot get it too, at once."""
        self.state.drain()
        self._loop.call_soon_threadsafe(self._servicer.on_drain)

    def finish(self) -> None:
        """The drain timeout passed: every stream is finalized (its final result is still sent)."""
        self._loop.call_soon_threadsafe(self._servicer.on_finish)

    async def _serve(self, listening: concurrent.futures.Future) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            server, port = await self._listen()
        except BaseException as exc:
            listening.set_exception(exc)
            return
        listening.set_result(port)
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
        ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
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
    ctx.config.ports["grpc"] = await trio.to_thread.run_sync(door.start)
    try:
        task_status.started(door)
        await ctx.shutdown.wait()
        door.begin_drain()
        await ctx.finish.wait()
        door.finish()
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(door.stop)
