"""One worker process of `parakeet-serve --workers N` (operations/workers.py): the server's doors
on the listening sockets it inherited, with the engine of the main process behind an EngineClient."""
from __future__ import annotations

import contextlib
import logging
import os
import sys

import trio

from ..engine.ipc.engine_client import EngineClient
from .cli import build_parser, log_format, run, server_config
from .context import ServerContext
from .operations.memory import freeze_startup_objects
from .operations.workers import ENGINE_SOCKET, LISTEN_FDS, READY_FD, WORKER_INDEX


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    index = os.environ[WORKER_INDEX]
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format=log_format(f"worker {index}"))
    config = server_config(args)
    config.listen_fds = {door: [int(fd) for fd in fds.split(",")]
                         for door, fds in (item.split("=") for item in os.environ[LISTEN_FDS].split(";"))}
    engine = EngineClient.connect(os.environ[ENGINE_SOCKET])
    freeze_startup_objects()  # the modules' objects: a full collection would walk them all (86 ms here)
    trio.run(_serve, engine, config)
    return 0 if engine.healthy() else 1


async def _serve(engine: EngineClient, config) -> str:
    ctx = ServerContext.create(engine, config)
    token = trio.lowlevel.current_trio_token()

    def lost() -> None:  # the engine process is gone: every stream failed; drain what is left and exit
        logging.getLogger(__name__).error("the engine process is gone: stopping")
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(ctx.shutdown.set)

    engine.on_lost = lost
    return await run(ctx, announce=_ready)


def _ready(ports: dict[str, int]) -> None:
    fd = int(os.environ[READY_FD])
    os.write(fd, b"ready\n")
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
