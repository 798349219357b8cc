"""Scale-out: replicas of the tiny model behind a real HAProxy started from deploy/haproxy.cfg,
and the replica contract (/health, /ready, the agent port) in every state."""
from __future__ import annotations

import csv
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
import trio
from helpers import (
    Raw,
    ServerProcess,
    audio_messages,
    http_get,
    result_tokens,
    running_server,
)

from parakeet_stream.engine import ASREngine

CONFIG = Path(__file__).parents[1] / "deploy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if os.path.exists(p)), None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")
CHECK_INTERVAL = 1.0  # `inter` and `agent-inter` in deploy/haproxy.cfg


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def replica(model_dir: Path, slots: int, queue: int, *args: str) -> ServerProcess:
    return ServerProcess(
        model_dir, "--max-num-streams", str(slots), "--max-queue", str(queue), "--agent-port", "0", *args
    )


class Balancer:
    """`haproxy -f deploy/haproxy.cfg` with every port set through the environment."""

    def __init__(self, replicas: list[ServerProcess], log: Path) -> None:
        self.ports = {name: free_port() for name in ("tcp", "ws", "http", "stats")}
        env = {
            **os.environ,
            "PS_BIND": "127.0.0.1",
            **{f"PS_{name.upper()}_PORT": str(port) for name, port in self.ports.items()},
        }
        for i, server in enumerate(replicas, 1):
            for kind in ("tcp", "ws", "http", "agent"):
                env[f"PS_R{i}_{kind.upper()}"] = str(server.ports[kind])
        self.log = log.open("w")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=env, stdout=self.log, stderr=self.log)

    def url(self, kind: str, path: str = "/") -> str:
        port = self.ports[kind]
        return f"tcp://127.0.0.1:{port}" if kind == "tcp" else f"ws://127.0.0.1:{port}{path}"

    async def servers(self) -> dict[tuple[str, str], dict]:
        """HAProxy's view: (backend, server) -> its row of the CSV status page."""
        stream = await trio.open_tcp_stream("127.0.0.1", self.ports["stats"])
        async with stream:  # HTTP/1.0: HAProxy closes after the answer
            await stream.send_all(b"GET /;csv HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
        head, _, chunked = data.partition(b"\r\n\r\n")
        assert head.split()[1] == b"200" and b"chunked" in head
        body = b""
        while (size := int(chunked.split(b"\r\n", 1)[0], 16)) > 0:
            start = chunked.index(b"\r\n") + 2
            body, chunked = body + chunked[start : start + size], chunked[start + size + 2 :]
        rows = csv.DictReader(io.StringIO(body.decode().lstrip("# ")))
        return {(row["pxname"], row["svname"]): row for row in rows}

    async def wait_for(self, predicate, timeout: float = 10.0) -> dict:
        """Poll the status page until `predicate(servers)` holds."""
        with trio.fail_after(timeout):
            while True:
                try:
                    servers = await self.servers()
                    if predicate(servers):
                        return servers
                except OSError:
                    pass
                await trio.sleep(0.1)

    async def wait_weights(self, *weights: int) -> None:
        """Until both stream backends see replica i UP with the agent's weight `weights[i]`."""

        def applied(servers) -> bool:
            return all(
                servers[(backend, f"r{i}")]["status"] == "UP" and int(servers[(backend, f"r{i}")]["weight"]) == w
                for backend in ("replicas_tcp", "replicas_ws")
                for i, w in enumerate(weights, 1)
            )

        await self.wait_for(applied)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def cluster(tiny_model_dir, tmp_path):
    """cluster((slots, queue, *args), ...) -> (replicas, balancer); everything is stopped afterwards."""
    started: list = []

    def start(*specs: tuple) -> tuple[list[ServerProcess], Balancer]:
        replicas = []
        for slots, queue, *args in specs:
            replicas.append(replica(tiny_model_dir, slots, queue, *args))
            started.append(replicas[-1])
        balancer = Balancer(replicas, tmp_path / "haproxy.log")
        started.append(balancer)
        return replicas, balancer

    yield start
    for thing in reversed(started):
        thing.close()


async def load(server: ServerProcess) -> tuple[int, int]:
    """(active, queued) streams of one replica."""
    status, body = await http_get(server.ports["http"], "/health")
    health = orjson.loads(body)
    return health["active"], health["queued"]


async def streams_total(server: ServerProcess) -> float:
    _, body = await http_get(server.ports["http"], "/metrics")
    return sum(float(n) for n in re.findall(r"^parakeet_streams_total\{.*\} (\S+)$", body.decode(), re.M))


async def agent(port: int) -> str:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        data = b""
        while chunk := await stream.receive_some(1024):
            data += chunk
    return data.decode()


async def ready(port: int) -> tuple[int, dict]:
    status, body = await http_get(port, "/ready")
    return status, orjson.loads(body)


class Client:
    """One stream through the balancer: first message, then (when released) audio to the final."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.go = trio.Event()
        self.first: dict | None = None
        self.seen: list[dict] = []

    async def run(self, samples, paced: float = 0.0, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with Raw.open(self.address) as conn:
            self.first = await conn.recv()
            task_status.started(self)
            await self.go.wait()
            for message in audio_messages(samples):
                await conn.send(message)
                if paced:
                    await trio.sleep(paced)
            self.seen = [self.first, *await conn.rest()]
            self.close_code = conn.close_code

    @property
    def tokens(self) -> list[int]:
        return result_tokens([m for m in self.seen if m["type"] == "result"])

    @property
    def final(self) -> bool:
        return sum(1 for m in self.seen if m["type"] == "result" and m["is_final"]) == 1


async def hold(address: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A stream that sends nothing: reports its first message, then waits."""
    async with Raw.open(address) as conn:
        task_status.started(await conn.recv())
        await trio.sleep_forever()


@needs_haproxy
async def test_streams_spread_evenly_and_give_solo_tokens(cluster, sentence, solo_tokens):
    (a, b), lb = cluster((2, 2), (2, 2))
    await lb.wait_weights(4, 4)
    async with trio.open_nursery() as nursery:
        clients = [await nursery.start(Client(lb.url(kind)).run, sentence) for kind in ("tcp", "ws", "tcp", "ws")]
        assert [c.first["type"] for c in clients] == ["hello"] * 4
        assert [await load(a), await load(b)] == [(2, 0), (2, 0)]
        for c in clients:
            c.go.set()
    for c in clients:
        assert c.final and c.tokens == solo_tokens


@needs_haproxy
async def test_sigterm_drains_one_replica_while_the_other_takes_new_streams(cluster, sentence, solo_tokens):
    (a, b), lb = cluster((2, 2, "--drain-timeout", "20"), (2, 2))
    await lb.wait_weights(4, 4)
    exit_code = {}
    async with trio.open_nursery() as nursery:
        first = [await nursery.start(Client(lb.url(kind)).run, sentence, 0.1) for kind in ("tcp", "ws", "tcp", "ws")]
        assert [await load(a), await load(b)] == [(2, 0), (2, 0)]
        for c in first:
            c.go.set()
        await trio.sleep(0.5)  # mid-stream

        async def terminate() -> None:
            exit_code["a"] = await trio.to_thread.run_sync(a.terminate)

        nursery.start_soon(terminate)
        status, body = await _wait_ready(a, 503)
        assert body["reason"] == "draining" and await agent(a.ports["agent"]) == "drain\n"
        assert (await http_get(a.ports["http"], "/health"))[0] == 200  # alive: not restarted
        with trio.fail_after(5):  # listeners close at once: HAProxy redispatches to b
            while await _accepts(a.ports["tcp"]):
                await trio.sleep(0.02)
        b_before = await streams_total(b)
        late = [await nursery.start(Client(lb.url(kind)).run, sentence) for kind in ("tcp", "ws")]
        assert [c.first["type"] for c in late] == ["queued", "queued"]  # b's slots are busy; nobody refused
        assert await streams_total(b) == b_before + 2
        for c in late:
            c.go.set()
    assert exit_code["a"] == 0
    for c in first + late:
        assert c.final and c.tokens == solo_tokens
    drained = [c for c in first if c.seen[-1] == {"type": "closed", "reason": "server_shutdown"}]
    assert len(drained) == 2 and all(c.close_code in (None, 1001) for c in drained)


@needs_haproxy
async def test_sigkill_closes_its_clients_and_new_streams_go_to_the_other(cluster, sentence, solo_tokens):
    (a, b), lb = cluster((3, 2), (3, 2))
    await lb.wait_weights(5, 5)
    async with Raw.open(lb.url("tcp")) as one, Raw.open(lb.url("tcp")) as two:  # leastconn: one each
        assert [(await one.recv())["type"], (await two.recv())["type"]] == ["hello", "hello"]
        assert [await load(a), await load(b)] == [(1, 0), (1, 0)]
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        with trio.fail_after(5):  # no hang: one of the two sees its connection end
            async with trio.open_nursery() as nursery:
                for conn in (one, two):
                    nursery.start_soon(_closed_then_cancel, conn, nursery.cancel_scope)
        b_before = await streams_total(b)
        with trio.fail_after(CHECK_INTERVAL + 2):  # redispatched at once, marked down within `inter`
            for kind in ("tcp", "ws", "tcp"):
                async with Raw.open(lb.url(kind)) as conn:
                    assert (await conn.recv())["type"] == "hello"
        assert await streams_total(b) == b_before + 3
        await lb.wait_for(lambda s: s[("replicas_tcp", "r1")]["status"].startswith("DOWN"), CHECK_INTERVAL + 2)
        async with trio.open_nursery() as nursery:
            c = await nursery.start(Client(lb.url("tcp")).run, sentence)
            c.go.set()
        assert c.final and c.tokens == solo_tokens


@needs_haproxy
async def test_replicas_get_streams_in_proportion_to_their_capacity(cluster):
    (a, b), lb = cluster((4, 4), (2, 2))
    await lb.wait_weights(8, 4)
    async with trio.open_nursery() as nursery:
        for _ in range(6):  # one backend: HAProxy balances each frontend's streams on its own
            assert (await nursery.start(hold, lb.url("tcp")))["type"] == "hello"
        assert [await load(a), await load(b)] == [(4, 0), (2, 0)]
        nursery.cancel_scope.cancel()


@needs_haproxy
async def test_full_replicas_queue_then_refuse_with_queue_full(cluster):
    (a, b), lb = cluster((2, 1), (2, 1))
    await lb.wait_weights(3, 3)
    async with trio.open_nursery() as nursery:
        for kind in ("tcp", "ws", "tcp", "ws"):
            assert (await nursery.start(hold, lb.url(kind)))["type"] == "hello"
        queued = [await nursery.start(hold, lb.url("tcp")) for _ in range(2)]  # leastconn: one each
        assert [m["type"] for m in queued] == ["queued", "queued"] and [m["position"] for m in queued] == [1, 1]
        assert [await load(a), await load(b)] == [(2, 1), (2, 1)]
        await _refused(lb)  # before HAProxy's checks notice: a replica refuses
        # once both are marked down, the backup entries still bring the replicas' own answer
        await lb.wait_for(
            lambda s: all(s[("replicas_tcp", f"r{i}")]["status"].startswith("DOWN") for i in (1, 2)),
            CHECK_INTERVAL + 3,
        )
        await _refused(lb)
        nursery.cancel_scope.cancel()


async def _refused(lb: Balancer) -> None:
    async with Raw.open(lb.url("tcp")) as conn:
        assert [m["code"] for m in await conn.rest()] == ["queue_full"]
    async with Raw.open(lb.url("ws")) as conn:
        assert [m["code"] for m in await conn.rest()] == ["queue_full"] and conn.close_code == 1013


async def test_health_ready_and_agent_in_every_state(tiny_model_dir):
    with ASREngine(tiny_model_dir, max_num_streams=2, max_queue=1) as engine:
        async with _server(engine) as ctx:
            http, agent_port = ctx.config.ports["http"], ctx.config.ports["agent"]

            async def signals() -> tuple[int, str, int, str, str]:
                health_status, body = await http_get(http, "/health")
                ready_status, ready_body = await ready(http)
                return health_status, orjson.loads(body)["status"], ready_status, ready_body["reason"], await agent(
                    agent_port
                )

            assert await signals() == (200, "ok", 200, "free_slot", "up ready 3%\n")
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    await nursery.start(hold, f"tcp://127.0.0.1:{ctx.config.ports['tcp']}")
                assert await signals() == (200, "ok", 200, "queue_room", "up ready 1%\n")
                assert (await nursery.start(hold, f"tcp://127.0.0.1:{ctx.config.ports['tcp']}"))["type"] == "queued"
                assert await signals() == (200, "ok", 503, "queue_full", "up ready 0%\n")
                ctx.shutdown.set()  # what SIGTERM does
                assert await signals() == (200, "draining", 503, "draining", "drain\n")
                nursery.cancel_scope.cancel()
        engine.shutdown()  # its stage threads end: a broken engine
        async with _server(engine) as ctx:
            http = ctx.config.ports["http"]
            status, body = await http_get(http, "/health")
            assert status == 503 and orjson.loads(body)["status"] == "broken"
            status, body = await ready(http)
            assert status == 503 and body["reason"] == "broken"
            assert await agent(ctx.config.ports["agent"]) == "down\n"


async def test_health_says_broken_while_an_engine_stage_is_stalled(tiny_model_dir, wavs):
    """A GPU that no longer answers leaves a stage waiting forever: the orchestrator must see it."""
    with ASREngine(tiny_model_dir, max_num_streams=2) as engine:
        engine.pipeline.stall_seconds = 0.3
        runner, release = engine.runner, threading.Event()
        real = runner.encode
        runner.encode = lambda step: (release.wait(30), real(step))
        try:
            async with _server(engine) as ctx:
                http, url = ctx.config.ports["http"], f"tcp://127.0.0.1:{ctx.config.ports['tcp']}"
                async with Raw.open(url) as conn:
                    for message in audio_messages(next(iter(wavs.values()))[:16000])[:-1]:
                        await conn.send(message)
                    with trio.fail_after(9):  # the limit: 0.3 s, or ten times the longest step so far
                        while (answer := await http_get(http, "/health"))[0] == 200:
                            await trio.sleep(0.05)
                    health = orjson.loads(answer[1])
                    assert health["status"] == "broken" and health["stalled"]["stage"] == "encode", health
                    assert await agent(ctx.config.ports["agent"]) == "down\n"
                    _, metrics = await http_get(http, "/metrics")
                    assert re.search(rb"^parakeet_stalled_seconds (0\.[3-9]|[1-9])", metrics, re.M), metrics[:300]
                    runner.encode = real
                    release.set()
                    with trio.fail_after(5):
                        while (answer := await http_get(http, "/health"))[0] != 200:
                            await trio.sleep(0.05)
                    assert orjson.loads(answer[1])["stalled"] is None
        finally:
            release.set()


@asynccontextmanager
async def _server(engine: ASREngine):
    async with running_server(engine, agent_port=0) as ctx:
        yield ctx


async def _wait_ready(server: ServerProcess, status: int) -> tuple[int, dict]:
    with trio.fail_after(5):
        while (answer := await ready(server.ports["http"]))[0] != status:
            await trio.sleep(0.02)
    return answer


async def _accepts(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True


async def _closed_then_cancel(conn: Raw, scope: trio.CancelScope) -> None:
    await conn.rest()
    scope.cancel()
