"""Count the calls and files on the server's message path, in one process (no --workers).

Inbound: a binary WebSocket audio message (native protocol, PCM16) from the channel's receive
to the engine's inbox (`Inbox.add`). Outbound: a result from `Outbox.publish` to the bytes
handed to the WebSocket (`WsChannel.send`).

How it counts: sys.setprofile (and threading.setprofile for the engine's threads) records every
call into the package while one stream runs. The path is the call stacks (the package's frames,
from the task or thread that runs them) at the points where the message moves:
- in: the frame received (WsChannel.receive), its bytes turned into samples (wire.decode_bytes),
  the samples buffered for the engine (EngineStream.take), handed to the engine (Inbox.add);
- out: the result published (Outbox.publish), the news told (Outbox.notify and what it calls, to
  the listener that wakes the event loop; from the engine's delivery of a step, StepRoute.deliver,
  itself not counted), the writer woken (Wakeup.set, where trio's loop calls it), the result
  collected (Outbox.take), turned into a message and queued (Connection.post, wire.dumps), sent
  (WsChannel.send).
Each function counts once however often it is called; a file counts once however many of its
functions are on the path. Calls that do not carry the message (checks, metrics, wake-ups of the
other loop, a word tracker) are left out of the path; `all package calls` counts every call of
the package while 20 messages and their results go by, for comparison.

    .venv/bin/python -m benchmarks.message_path [weights/demo]

(PACKAGE_ROOT=<folder> counts another copy of the package, imported from there.)
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

PACKAGE = str(Path(os.environ.get("PACKAGE_ROOT", Path(__file__).resolve().parent.parent)) / "parakeet_stream")
INBOUND = {"receive": "channel", "decode_bytes": "decode", "take": "buffer", "add": "inbox"}
INBOUND_FILES = {"receive": "websocket.py", "decode_bytes": "wire.py", "take": "stream.py", "add": "inbox.py"}
OUTBOUND_WRITER = [("take", "results.py"), ("post", "connection.py"), ("dumps", "wire.py"), ("send", "websocket.py")]
OUTBOUND = {("publish", "results.py"), ("notify", "results.py"), ("set_threadsafe", "wakeup.py"), ("set", "wakeup.py"),
            *OUTBOUND_WRITER}


def _ours(frame) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE)


def _name(code) -> tuple[str, str]:
    path = Path(code.co_filename).relative_to(PACKAGE).as_posix()
    return getattr(code, "co_qualname", code.co_name), path


class Recorder:
    def __init__(self) -> None:
        self.stacks: dict[str, list[list[tuple[str, str]]]] = defaultdict(list)
        self.calls: list[tuple[str, tuple[str, str]]] = []  # (thread, function) of every package call
        self.on = False

    def __call__(self, frame, event, arg) -> None:
        if event != "call" or not self.on or not _ours(frame):
            return
        code = frame.f_code
        thread = threading.current_thread().name
        self.calls.append((thread, _name(code)))
        key = code.co_name, Path(code.co_filename).name
        if key in OUTBOUND or (code.co_name in INBOUND and INBOUND_FILES[code.co_name] == key[1]):
            stack, f = [], frame
            while f is not None:
                if _ours(f):
                    stack.append(_name(f.f_code))
                f = f.f_back
            if key == ("set", "wakeup.py") and len(stack) > 1:
                return  # a set in trio's thread by the server itself: the wake-up hop is trio calling it
            self.stacks[key].append(stack)


async def run(model: str) -> None:
    from parakeet_stream.engine import ASREngine
    from parakeet_stream.server.app import serve
    from parakeet_stream.server.context import ServerConfig, ServerContext

    recorder = Recorder()
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    with ASREngine(model, max_num_streams=2, max_queue=2) as engine:
        config = ServerConfig(tcp_port=0, ws_port=0, http_port=0, grpc_port=None)
        ctx = ServerContext.create(engine, config)
        rng = np.random.default_rng(0)
        packet = (rng.standard_normal(1600) * 3000).astype("<i2").tobytes()  # 100 ms of noise
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, ctx)
            async with open_websocket_url(f"ws://127.0.0.1:{config.ports['ws']}/") as ws:
                for _ in range(5):  # admitted, warmed
                    await ws.send_message(packet)
                    await trio.sleep(0.05)
                recorder.on = True
                for _ in range(20):
                    await ws.send_message(packet)
                    await trio.sleep(0.05)
                await trio.sleep(1.0)
                recorder.on = False
                await ws.send_message('{"type": "close"}')
                with trio.move_on_after(30), contextlib.suppress(ConnectionClosed):
                    while '"closed"' not in await ws.get_message():
                        pass
            ctx.shutdown.set()
    sys.setprofile(None)
    threading.setprofile(None)
    report(recorder)


def _cut(stack: list[tuple[str, str]], below: set[str]) -> list[tuple[str, str]]:
    """A stack (innermost first) up to the first frame named in `below` (included)."""
    out = []
    for fn in stack:
        out.append(fn)
        if fn[0] in below:
            return out
    return out


def report(rec: Recorder) -> None:
    def union(keys, below, exclusive=()):
        seen: dict[tuple[str, str], None] = {}
        for key in keys:
            if not rec.stacks.get(key):  # (wire.dumps: a Python function before, orjson's own after)
                print(f"  (no call of {key})")
                continue
            for fn in reversed(_cut(rec.stacks[key][-1], below)):
                if fn[0] not in exclusive:
                    seen.setdefault(fn)
        return list(seen)

    # the reader's and writer's loops are where a message enters: counted, not what is above them
    inbound = union([(n, INBOUND_FILES[n]) for n in INBOUND], {"Connection._read_loop"})
    # the engine's side: publish, then the notification (_notify -> Outbox.notify -> the listener),
    # from the decode thread's delivery of a step (StepRoute.deliver, not counted)
    outbound = union([("publish", "results.py"), ("set_threadsafe", "wakeup.py")], {"StepRoute.deliver"},
                     exclusive={"StepRoute.deliver"})
    # the writer woken in trio's thread: Wakeup.set where trio calls it (run_sync_soon), if it does
    outbound += [fn for fn in union([("set", "wakeup.py")], {"Wakeup.set"}) if fn not in outbound]
    outbound += [fn for fn in union(OUTBOUND_WRITER, {"Connection._write_loop"}) if fn not in outbound]
    for title, path in (("in: WebSocket audio message -> Inbox.add", inbound),
                        ("out: Outbox.publish -> WsChannel.send", outbound)):
        files = dict.fromkeys(f for _, f in path)
        print(f"{title}: {len(path)} calls in {len(files)} files")
        for fn, f in path:
            print(f"  {f:40s} {fn}")
    counts = defaultdict(int)
    for thread, _ in rec.calls:
        counts[thread] += 1
    print("all package calls while recording, by thread:", dict(counts))
    if os.environ.get("STACKS"):
        for key, stacks in rec.stacks.items():
            for stack in dict.fromkeys(tuple(st) for st in stacks):
                print(key, " <- ".join(fn for fn, _ in stack))
    print("pushes:", len(rec.stacks[("add", "inbox.py")]), "results sent:", len(rec.stacks[("send", "websocket.py")]))


if __name__ == "__main__":
    from parakeet_stream.model.errors import ModelNotFound

    try:
        trio.run(run, sys.argv[1] if len(sys.argv) > 1 else "weights/demo")
    except ModelNotFound as exc:
        raise SystemExit(f"message_path: {exc}") from None
