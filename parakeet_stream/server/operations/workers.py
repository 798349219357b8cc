"""`parakeet-serve --workers N`: the doors in N worker processes, the engine in this one.

This process loads the model, runs the engine and serves it to the workers over a Unix socket
(engine/ipc/service.py). It opens every listening socket itself (TCP, WebSocket, HTTP, the agent): one
per worker on each port, bound with SO_REUSEPORT, so that the kernel spreads new connections evenly
over the workers (a socket shared by all would let whichever worker wakes first take them all), and
keeps them, so that connections arriving for a worker being restarted wait in its socket's backlog;
gRPC's port is shared the way gRPC shares one (SO_REUSEPORT too). A worker
speaks the protocols with an EngineClient (engine/ipc/engine_client.py) where the in-process server has the
engine: JSON, base64, resampling, WebSocket framing and gRPC no longer share the engine's
interpreter lock. Metrics are written by every worker into one folder and read by any of them
(metrics.py), so /metrics is one view of the whole server.

Signals: the first SIGINT/SIGTERM is passed to every worker (each drains its connections), then
the engine stops once they all exited; a second one is passed on too (workers stop at once).
A worker that dies is started again; its connections are lost, its streams cancelled in the
engine (their slots go to the others), the other workers' streams go on.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from ...engine import ASREngine
from ...engine.ipc.service import EngineService
from ..context import ServerConfig
from ..transport.channel import SEND_BUFFER_BYTES
from .metrics import MULTIPROCESS_DIR

log = logging.getLogger(__name__)

ENGINE_SOCKET = "PARAKEET_ENGINE_SOCKET"
LISTEN_FDS = "PARAKEET_LISTEN_FDS"  # door=fd,fd;door=fd
READY_FD = "PARAKEET_READY_FD"  # the worker writes one line there once listening
WORKER_INDEX = "PARAKEET_WORKER"
READY_TIMEOUT = 120.0  # seconds for a worker to start (it imports what the server imports)
POLL_S = 0.05
RESTART_AFTER_S = 1.0  # a worker that died is started again no sooner than this after its start
BACKLOG = 4096


def default_workers(device: str, cores: int | None = None) -> int:
    """On a CPU the model's encoder takes every core (its thread team) and the server's protocol
    work is a small share of a step: one process. On a GPU the engine's process needs about three
    busy threads (its stages) and the protocol work of hundreds of streams needs cores of its own:
    a worker per four cores, at most eight."""
    if not device.startswith("cuda"):
        return 0
    cores = cores or os.cpu_count() or 1
    return max(1, min(8, cores // 4))


class _Worker:
    def __init__(self, index: int, argv: list[str], env: dict[str, str], fds: list[int]) -> None:
        self.index = index
        read, write = os.pipe()
        env = {**env, READY_FD: str(write), WORKER_INDEX: str(index)}
        self.proc = subprocess.Popen([sys.executable, "-m", "parakeet_stream.server.worker", *argv], env=env,
                                     pass_fds=[*fds, write], start_new_session=True)  # signals come from us only
        os.close(write)
        self._ready = read
        self.started = time.monotonic()
        log.info("worker %d started (pid %d)", index, self.proc.pid)

    def wait_ready(self, timeout: float) -> bool:
        """True once it listens; False if it exited or took longer than `timeout`."""
        try:
            readable, _, _ = select.select([self._ready], [], [], timeout)
            return bool(readable) and os.read(self._ready, 64).startswith(b"ready")
        finally:
            os.close(self._ready)


def serve_in_workers(argv: list[str], count: int, engine: ASREngine, config: ServerConfig,
                     announce) -> str:
    """Serve through `count` worker processes until signalled; returns "drained" or "not drained".
    `announce(ports)` once every worker listens. Raises OSError where a port cannot be opened."""
    sockets = {door: _listen(config.host, port, count) for door, port in _doors(config).items()}
    ports = {door: per_worker[0][0].getsockname()[1] for door, per_worker in sockets.items()}
    if config.grpc_port is not None:
        ports["grpc"] = config.grpc_port or _free_port(config.host)
        argv = [*argv, "--grpc-port", str(ports["grpc"])]
    with tempfile.TemporaryDirectory(prefix="parakeet-serve-") as run_dir:
        service = EngineService(engine, str(Path(run_dir) / "engine.sock")).start()
        metrics = Path(run_dir) / "metrics"
        metrics.mkdir()
        env = {**os.environ, ENGINE_SOCKET: service.path, MULTIPROCESS_DIR: str(metrics)}
        pool = _Pool(argv, env, sockets, str(metrics))
        try:
            pool.start(count)
            announce(ports)
            return pool.supervise()
        finally:
            pool.stop()
            service.close()
            for per_worker in sockets.values():
                for socks in per_worker:
                    for sock in socks:
                        sock.close()


class _Pool:
    """The workers: started, restarted when one dies, passed the signals."""

    def __init__(self, argv: list[str], env: dict[str, str], sockets: dict[str, list[list[socket.socket]]],
                 metrics: str) -> None:
        self._argv, self._env, self._sockets, self._metrics = argv, env, sockets, metrics
        self.workers: list[_Worker] = []

    def start(self, count: int) -> None:
        self.workers = [self._worker(i) for i in range(count)]
        for worker in self.workers:
            if not worker.wait_ready(READY_TIMEOUT):
                raise RuntimeError(f"worker {worker.index} did not start (exit code {worker.proc.poll()})")

    def supervise(self) -> str:
        """Until every worker exited after a signal: "drained", or "not drained" after a second."""
        signals: list[int] = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda s, _: signals.append(s))
        passed = 0
        while True:
            if len(signals) > passed:
                name = signal.Signals(signals[-1]).name
                if passed:
                    log.warning("%s again: the workers stop now, cutting their connections", name)
                else:
                    log.info("%s: draining %d workers", name, len(self.workers))
                passed = len(signals)
                for worker in self.workers:
                    if worker.proc.poll() is None:
                        worker.proc.send_signal(signal.SIGTERM)
            if signals and all(w.proc.poll() is not None for w in self.workers):
                return "drained" if passed == 1 else "not drained"
            if not signals:
                self.workers = [self._restarted(w) for w in self.workers]
            time.sleep(POLL_S)

    def stop(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()

    def _worker(self, index: int) -> _Worker:
        own = {door: per_worker[index] for door, per_worker in self._sockets.items()}
        fds = ";".join(f"{door}={','.join(str(s.fileno()) for s in socks)}" for door, socks in own.items())
        return _Worker(index, self._argv, {**self._env, LISTEN_FDS: fds},
                       [s.fileno() for socks in own.values() for s in socks])

    def _restarted(self, worker: _Worker) -> _Worker:
        code = worker.proc.poll()
        if code is None or time.monotonic() - worker.started < RESTART_AFTER_S:
            return worker
        log.warning("worker %d exited (code %s): its connections are lost; starting it again", worker.index, code)
        mark_process_dead(worker.proc.pid, self._metrics)
        fresh = self._worker(worker.index)
        if not fresh.wait_ready(READY_TIMEOUT):
            log.error("worker %d did not start again", worker.index)
        return fresh


def _doors(config: ServerConfig) -> dict[str, int]:
    doors = {"tcp": config.tcp_port, "ws": config.ws_port, "http": config.http_port}
    if config.agent_port is not None:
        doors["agent"] = config.agent_port
    return doors


def _listen(host: str, port: int, count: int) -> list[list[socket.socket]]:
    """For each of `count` workers, listening sockets on every address of `host` (as trio's
    listeners open them; one address when the port is 0, whose port the others then take)."""
    per_worker: list[list[socket.socket]] = [[] for _ in range(count)]
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE):
        try:
            first = _bound(family, kind, proto, address)
        except OSError as exc:
            if exc.errno == errno.EAFNOSUPPORT:  # e.g. IPv6 switched off: trio skips it too
                continue
            raise
        chosen = (*address[:1], first.getsockname()[1], *address[2:])
        socks = [first] + [_bound(family, kind, proto, chosen) for _ in range(count - 1)]
        for worker, sock in zip(per_worker, socks):
            worker.append(sock)
        if port == 0:
            break
    if not per_worker[0]:
        raise OSError(f"cannot listen on {host} port {port}")
    return per_worker


def _bound(family: int, kind: int, proto: int, address: tuple) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
