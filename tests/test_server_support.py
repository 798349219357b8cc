"""Shared helpers for the server tests: an in-process server, raw protocol connections,
and a real `parakeet-serve` process. (Imported by the test_server_* modules; holds no tests.)"""
from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import numpy as np
import orjson
import pytest
import trio
import wsproto
from helpers import run_stream, tokens_of
from trio_websocket import ConnectionClosed, open_websocket_url
from wsproto.events import Request, TextMessage

from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine
from parakeet_stream.server import ServerConfig, ServerContext, serve

TIMEOUT = 10
PACKET = 1600  # 100 ms at 16 kHz


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with ASREngine(tiny_model_dir, max_num_streams=4, max_queue=4) as e:
        yield e


@pytest.fixture(scope="module")
def sentence(wavs) -> np.ndarray:
    """The fixture sentence, exactly representable in PCM16 (so every encoding sends the same samples)."""
    return pcm16_exact(wavs["sentence"])


def pcm16_exact(samples: np.ndarray) -> np.ndarray:
    return np.frombuffer(encode_audio(samples, "pcm16"), "<i2").astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def solo_tokens(engine, sentence) -> list[int]:
    """What the engine alone transcribes for the sentence (the reference for every transport)."""
    return tokens_of(run_stream(engine, sentence))


@asynccontextmanager
async def running_server(engine: ASREngine, **overrides) -> AsyncIterator[ServerContext]:
    ports = {"tcp_port": 0, "ws_port": 0, "http_port": 0, "grpc_port": 0}
    config = ServerConfig(**{**ports, "drain_timeout": 10, **overrides})
    ctx = ServerContext.create(engine, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, ctx)
        yield ctx
        ctx.shutdown.set()


def url(ctx: ServerContext, kind: str, path: str = "/") -> str:
    port = ctx.config.ports[kind]
    return f"tcp://127.0.0.1:{port}" if kind == "tcp" else f"ws://127.0.0.1:{port}{path}"


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode(encode_audio(samples, "pcm16")).decode()


def audio_messages(samples: np.ndarray, packet: int = PACKET) -> list[dict]:
    """The original protocol: base64 PCM16 packets, then an empty final packet."""
    out = [
        {"type": "audio", "data": pcm16_b64(samples[i : i + packet]), "encoding": "pcm16", "final": False}
        for i in range(0, len(samples), packet)
    ]
    return out + [{"type": "audio", "data": "", "encoding": "pcm16", "final": True}]


class Raw:
    """A bare native-protocol connection: send anything, read parsed messages."""

    def __init__(self, send_bytes, receive, ws=None) -> None:
        self._send_bytes = send_bytes
        self._receive = receive
        self.ws = ws

    @classmethod
    @asynccontextmanager
    async def open(cls, address: str, headers=None) -> AsyncIterator[Raw]:
        if address.startswith("tcp://"):
            host, port = address[6:].split(":")
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                yield cls(partial_send(stream), LineReader(stream).next)
            return
        async with open_websocket_url(address, extra_headers=headers) as ws:
            yield cls(ws.send_message, partial_ws_receive(ws), ws)

    async def send(self, message: dict | str | bytes) -> None:
        if isinstance(message, dict):
            message = orjson.dumps(message).decode()
        await self._send_bytes(message)

    async def recv(self) -> dict | None:
        with trio.fail_after(TIMEOUT):
            raw = await self._receive()
        return None if raw is None else orjson.loads(raw)

    async def until(self, kind: str, **fields) -> list[dict]:
        """Messages up to and including the first of `kind` (with `fields`); fails at EOF."""
        seen = []
        while (message := await self.recv()) is not None:
            seen.append(message)
            if message["type"] == kind and all(message.get(k) == v for k, v in fields.items()):
                return seen
        raise AssertionError(f"connection closed before {kind} {fields}: {seen[-5:]}")

    async def rest(self) -> list[dict]:
        """Every message until the server closes the connection."""
        seen = []
        while (message := await self.recv()) is not None:
            seen.append(message)
        return seen

    @property
    def close_code(self) -> int | None:
        return None if self.ws is None or self.ws.closed is None else self.ws.closed.code


def partial_send(stream: trio.SocketStream):
    async def send(data: str | bytes) -> None:
        data = data.encode() if isinstance(data, str) else data
        await stream.send_all(data if data.endswith(b"\n") else data + b"\n")

    return send


def partial_ws_receive(ws):
    async def receive():
        try:
            return await ws.get_message()
        except ConnectionClosed:
            return None

    return receive


class LineReader:
    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> bytes | None:
        while b"\n" not in self._buffer:
            try:
                data = await self._stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line


async def transcribe_raw(address: str, samples: np.ndarray, paced: float = 0.0) -> list[dict]:
    """Original-protocol client: read hello, send audio (optionally paced), read to final."""
    async with Raw.open(address) as conn:
        hello = await conn.until("hello")
        for message in audio_messages(samples):
            await conn.send(message)
            if paced:
                await trio.sleep(paced)
        results = [m for m in await conn.until("result", is_final=True) if m["type"] == "result"]
        assert hello[-1]["sample_rate"] == 16000
        return results


async def hold_every_slot(ctx, release: trio.Event, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Native WebSocket clients take every slot (started once they all have one) until `release`."""
    async with AsyncExitStack() as holders:
        for _ in range(ctx.engine.stats()["max_num_streams"]):
            conn = await holders.enter_async_context(Raw.open(url(ctx, "ws")))
            await conn.until("hello")
        task_status.started()
        await release.wait()


def result_tokens(results: list[dict]) -> list[int]:
    return [t for r in results for t in r["token_ids"]]


async def wait_until(predicate, timeout: float = 5.0, step: float = 0.02) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(step)


class ServerProcess:
    """`python -m parakeet_stream.server.cli` in a subprocess, ports read from its ready line."""

    def __init__(self, model_dir: Path, *args: str) -> None:
        cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", str(model_dir)]
        cmd += ["--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0", "--log-level", "warning", *args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        self.config_lines: list[str] = []
        for line in self.proc.stdout:
            if line.startswith("parakeet-serve ready:"):
                self.ready_line = line
                break
            self.config_lines.append(line)
        else:
            raise RuntimeError(f"server did not start: {self.proc.stderr.read()[-2000:]}")
        self.ports = {k: int(v) for k, v in re.findall(r"(\w+)://127\.0\.0\.1:(\d+)", self.ready_line)}

    def url(self, kind: str, path: str = "/") -> str:
        port = self.ports[kind]
        return f"tcp://127.0.0.1:{port}" if kind == "tcp" else f"ws://127.0.0.1:{port}{path}"

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=TIMEOUT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def metric(text: bytes, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text.decode(), re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


class BareWebSocket:
    """A WebSocket client on a plain TCP stream: it can stop reading, or drop without a close frame."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)

    @classmethod
    async def connect(cls, port: int, path: str = "/", sock: trio.socket.SocketType | None = None) -> BareWebSocket:
        sock = sock or trio.socket.socket()
        await sock.connect(("127.0.0.1", port))
        client = cls(trio.SocketStream(sock))
        await client.stream.send_all(client._ws.send(Request(host=f"127.0.0.1:{port}", target=path)))
        client._ws.receive_data(await client.stream.receive_some(65536))
        return client

    @staticmethod
    def raw_text_frame(payload: bytes) -> bytes:
        """A masked text frame with any bytes, even ones that are not UTF-8."""
        mask = b"\x01\x02\x03\x04"
        return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    def frames(self, *messages: dict) -> bytes:
        return b"".join(self._ws.send(TextMessage(data=orjson.dumps(m).decode())) for m in messages)

    async def drop(self) -> None:
        await trio.aclose_forcefully(self.stream)
