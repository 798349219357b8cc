"""Small drivers shared by tests: the engine alone, an in-process server, raw protocol
connections, and a real `parakeet-serve` process. (The fixtures are in conftest.py.)"""

from __future__ import annotations

import base64
import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import soundfile as sf
import trio
import wsproto
from trio_websocket import ConnectionClosed, open_websocket_url
from wsproto.events import CloseConnection, Request, TextMessage

from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine, StreamResult, chunker
from parakeet_stream.engine.ipc.engine_client import EngineClient
from parakeet_stream.engine.ipc.service import EngineService
from parakeet_stream.engine.phrases import MAX_PHRASE_TOKENS, PhraseError
from parakeet_stream.server import ServerConfig, ServerContext, serve

TIMEOUT = 10
# what tests pin of the bundled demo model, measured from it by tests/fixtures/make_demo_pins.py
DEMO_PINS = Path(__file__).parent / "fixtures" / "demo_pins.json"
# the engine's stats that move with timing, for comparing the rest exactly (the audio counted, the
# live streams' backlog at the last plan: checked on their own)
MOVING = {"audio_seconds": 0, "streams_behind": 0, "longest_backlog_chunks": 0, "oldest_chunk_wait_s": 0}
PACKET = 1600  # 100 ms at 16 kHz


@contextmanager
def behind_service(engine: ASREngine) -> Iterator[EngineClient]:
    """`engine` served on a Unix socket and reached by an EngineClient, as a server's worker
    processes reach the engine process (here all in this process: the same socket and messages)."""
    with tempfile.TemporaryDirectory(prefix="engine-") as folder:
        service = EngineService(engine, f"{folder}/engine.sock").start()
        client = EngineClient.connect(service.path)
        try:
            yield client
        finally:
            client.close()
            service.close()


@contextmanager
def engine_reached(where: str, model_dir: Path, **options) -> Iterator[ASREngine | EngineClient]:
    """An ASREngine ("in-process"), or the same behind the engine client API ("engine-process")."""
    with ASREngine(model_dir, **options) as engine:
        if where == "in-process":
            yield engine
        else:
            with behind_service(engine) as client:
                yield client


def collect_until_final(engine: ASREngine, sid: int, timeout: float = 60.0) -> list[StreamResult]:
    out: list[StreamResult] = []
    waited = 0.0
    while waited < timeout:
        if not engine.wait_for_update(sid, timeout=0.5):
            waited += 0.5
        batch = engine.collect(sid)
        out += batch
        if any(r.is_final for r in batch):
            return out
    raise TimeoutError(f"stream {sid} produced no final result")


def tokens_of(results: list[StreamResult]) -> list[int]:
    return [t for r in results for t in r.token_ids]


def demo_pins() -> dict:
    return orjson.loads(DEMO_PINS.read_bytes())


def run_stream(engine: ASREngine, audio: np.ndarray, lookahead=None, packet: int = 2560,
               phrases: tuple = ()) -> list[StreamResult]:
    sid = engine.create_stream(lookahead, phrases=phrases)
    for i in range(0, len(audio), packet):
        engine.push_audio(sid, audio[i : i + packet])
    engine.finalize(sid)
    return collect_until_final(engine, sid)


def diarized_speakers(engine: ASREngine, audios: list[np.ndarray], packet: int = 2560) -> list[np.ndarray]:
    """Diarized streams pushed side by side, packet by packet: each one's speaker probabilities
    [frames, speakers], from all its results."""
    sids = [engine.create_stream(diarize=True) for _ in audios]
    for at in range(0, max(map(len, audios)), packet):
        for sid, audio in zip(sids, audios):
            if at < len(audio):
                engine.push_audio(sid, audio[at : at + packet])
    for sid in sids:
        engine.finalize(sid)
    return [np.concatenate([r.speakers for r in collect_until_final(engine, sid) if r.speakers is not None])
            for sid in sids]


def varied_audios(wavs: dict[str, np.ndarray], n: int) -> list[np.ndarray]:
    """n distinct signals cut from the fixture wavs (different offsets, lengths and gains)."""
    base = list(wavs.values())
    out = []
    for i in range(n):
        w = base[i % len(base)]
        start = (i * 997) % 6000
        end = len(w) - (i * 1291) % 9000
        out.append((w[start:end] * (0.6 + 0.1 * (i % 5))).astype(np.float32))
    return out


# -- servers and connections ---------------------------------------------------------------


def pcm16_exact(samples: np.ndarray) -> np.ndarray:
    """Samples exactly representable in PCM16 (so every encoding sends the same samples)."""
    return np.frombuffer(encode_audio(samples, "pcm16"), "<i2").astype(np.float32) / 32768.0


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

    def __init__(self, send_bytes, receive, ws=None, tcp: trio.SocketStream | None = None) -> None:
        self._send_bytes = send_bytes
        self._receive = receive
        self.ws = ws
        self.tcp = tcp

    @classmethod
    @asynccontextmanager
    async def open(cls, address: str, headers=None) -> AsyncIterator[Raw]:
        if address.startswith("tcp://"):
            host, port = address[6:].split(":")
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                yield cls(partial_send(stream), LineReader(stream).next, tcp=stream)
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


async def refused_handshake(address: str):
    """The HTTP response of a WebSocket handshake the server refuses (websockets' client, in a thread)."""
    import pytest
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    def attempt():
        with pytest.raises(InvalidStatus) as info:
            connect(address)
        return info.value.response

    return await trio.to_thread.run_sync(attempt)


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

    def frame(self, event) -> bytes:
        """One wsproto event (e.g. BytesMessage) as bytes on the wire."""
        return self._ws.send(event)

    async def close_code(self, timeout: float = 5) -> int | None:
        """Read until the server's close frame (its code) or EOF (None)."""
        with trio.fail_after(timeout):
            while data := await self.stream.receive_some(65536):
                self._ws.receive_data(data)
                for event in self._ws.events():
                    if isinstance(event, CloseConnection):
                        return event.code
        return None

    async def drop(self) -> None:
        await trio.aclose_forcefully(self.stream)


class PoisonedEngine:
    """The real engine, except that the next stream created fails like a crashed model thread."""

    def __init__(self, engine: ASREngine) -> None:
        self._engine = engine
        self.poisoned: set[int] = set()
        self.poison_next = False

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def create_stream(self, lookahead=None, **options) -> int:
        sid = self._engine.create_stream(lookahead, **options)
        if self.poison_next:
            self.poisoned.add(sid)
            self.poison_next = False
        return sid

    def collect(self, sid: int) -> list[StreamResult]:
        results = self._engine.collect(sid)
        if sid in self.poisoned and results:
            self._engine.cancel(sid)
            return [StreamResult(sid, [], "", is_final=True, error="inference_error")]
        return results


class SpyEngine:
    """The real engine, noting the key phrases each stream is created with (`created`: (sid,
    phrases) in order); a phrase whose text is in `too_many_tokens` is refused as the engine
    refuses one too many tokens long for its model."""

    def __init__(self, engine: ASREngine, too_many_tokens: tuple[str, ...] = ()) -> None:
        self._engine = engine
        self.created: list[tuple[int, tuple]] = []
        self.too_many_tokens = too_many_tokens

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def check_phrases(self, phrases) -> None:
        if any(p.text in self.too_many_tokens for p in phrases):
            raise PhraseError(f"a phrase must be at most {MAX_PHRASE_TOKENS} tokens")
        self._engine.check_phrases(phrases)

    def create_stream(self, lookahead=None, bulk=False, phrases=(), language=None, diarize=False) -> int:
        self.check_phrases(phrases)
        sid = self._engine.create_stream(lookahead, bulk, phrases, language, diarize)
        self.created.append((sid, phrases))
        return sid

    def phrases(self) -> list[tuple]:
        """The phrases of each stream created, in order."""
        return [phrases for _, phrases in self.created]


async def http_status(port: int, request: bytes, timeout: float = 5.0) -> int | None:
    """Send raw bytes to an HTTP listener; the status of the answer (None: closed without one).
    The server must close the connection after answering, within `timeout`."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    async with stream:
        with trio.fail_after(timeout):
            try:
                await stream.send_all(request)
                while chunk := await stream.receive_some(65536):
                    data += chunk
            except trio.BrokenResourceError:
                pass
    match = re.match(rb"HTTP/1\.1 (\d+)", data)
    return int(match.group(1)) if match else None


# -- file uploads (HTTP) --------------------------------------------------------------

TIMEOUT = 30


def audio_file(samples: np.ndarray, rate: int = 16000, fmt: str = "WAV", subtype: str = "PCM_16",
               channels: int = 1) -> bytes:
    """`samples` in a file; PCM16 as the native protocol quantizes (x 32768, rounded), so that
    both paths carry the same samples."""
    if subtype == "PCM_16":
        samples = np.frombuffer(encode_audio(samples, "pcm16"), "<i2")
    data = np.repeat(samples[:, None], channels, axis=1) if channels > 1 else samples
    out = io.BytesIO()
    sf.write(out, data, rate, format=fmt, subtype=subtype)
    return out.getvalue()


def multipart(fields: dict[str, str], file: bytes | None, boundary: str = "b0undary",
              filename: str = "audio.wav") -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    if file is not None:
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n")
        parts.append(head.encode() + file + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return orjson.loads(self.body)


def head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def post(port: int, path: str, body: bytes, content_type: str, **headers: str) -> Answer:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **headers}
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head(path, headers) + body)
        return await read_answer(stream)


async def read_answer(stream: trio.SocketStream) -> Answer:
    """The whole answer, read until the server closes (it always does)."""
    data = b""
    with trio.fail_after(TIMEOUT):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return Answer(int(lines[0].split()[1]), headers, body)


def openai_error(answer: Answer, status: int, code: str) -> dict:
    """The answer is OpenAI's error shape with this status and code; returns the error."""
    assert answer.status == status, (answer.status, answer.body)
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert error["message"]
    return error


# -- a server process whose log is checked (hostile-client and fuzz tests) -----------------

HANDSHAKE_S = 2.0


class Server:
    """`parakeet-serve` in a subprocess with its log in a file (a pipe nobody reads could block it)."""

    def __init__(self, model_dir: Path, log_path: Path, *args: str) -> None:
        cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", str(model_dir), "--log-level", "info"]
        cmd += ["--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0", "--handshake-timeout", str(HANDSHAKE_S), *args]
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        for line in self.proc.stdout:
            if line.startswith("parakeet-serve ready:"):
                break
        else:
            raise RuntimeError(f"server did not start: {self.log()[-2000:]}")
        self.ports = {k: int(v) for k, v in re.findall(r"(\w+)://127\.0\.0\.1:(\d+)", line)}

    def url(self, kind: str, path: str = "/") -> str:
        port = self.ports[kind]
        return f"tcp://127.0.0.1:{port}" if kind == "tcp" else f"ws://127.0.0.1:{port}{path}"

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def log(self) -> str:
        return self.log_path.read_text()

    async def health(self) -> dict:
        status, body = await http_get(self.ports["http"], "/health")
        assert status == 200
        return orjson.loads(body)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


def assert_clean_log(log: str) -> None:
    assert "Traceback" not in log, log[-3000:]
    assert not re.search(r" (ERROR|CRITICAL) ", log), log[-3000:]


def cut_whole(model, audios: list[np.ndarray], lookahead) -> list[list[tuple[np.ndarray, int, int]]]:
    """Every chunk of whole utterances, a stream each, as the engine's pre-encode stage cuts them
    (chunker.FrontEnds): per stream, (mel frames [window, n_mels], valid start, valid length) per chunk."""
    spec = model.encoder.chunk_spec(lookahead)
    store = chunker.FrontEnds(model.features, len(audios))
    fronts = [chunker.FrontEnd(model.features, spec) for _ in audios]
    last = [True] * len(audios)
    rows = store.lay_out(fronts, list(range(len(audios))), *store.new_frames(fronts, audios, last))
    windows = store.cut(fronts, rows, list(range(len(audios))), [0] * len(audios), last)
    out: list[list[tuple[np.ndarray, int, int]]] = [[] for _ in audios]
    frames = windows.frames.cpu().numpy()
    for i, owner in enumerate(windows.owner.tolist()):
        out[owner].append((frames[i], int(windows.start[i]), int(windows.length[i])))
    return out
