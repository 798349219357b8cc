"""`parakeet-serve --workers N`: the doors in worker processes, the engine in the main one.

(Every door across the engine client API is run by the modules that take `either_engine`; the
lifecycle module runs its real-process tests with two workers too. Here: what only processes show.)
"""
from __future__ import annotations

import os
import re
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack

import numpy as np
import pytest
import riva.client as riva_client
import trio
from helpers import (
    Raw,
    Server,
    assert_clean_log,
    audio_file,
    audio_messages,
    behind_service,
    collect_until_final,
    http_get,
    metric,
    multipart,
    post,
    result_tokens,
    run_stream,
    tokens_of,
    transcribe_raw,
    varied_audios,
    wait_until,
)

from parakeet_stream.client import encode_audio
from parakeet_stream.engine.errors import EngineError
from parakeet_stream.engine.inbox import Inbox
from parakeet_stream.engine.ipc import engine_client, engine_connection
from parakeet_stream.engine.ipc.engine_client import EngineClient
from parakeet_stream.engine.ipc.messages import HEADER, Answer, Ask, Audio, Framer, FromEngine, Open, Opened, ToEngine
from parakeet_stream.engine.ipc.service import hello, packets
from parakeet_stream.server.cli import build_parser
from parakeet_stream.server.operations.workers import default_workers

PEER = re.compile(r"\[worker (\d)\] parakeet_stream.connections: connection open peer=127\.0\.0\.1:(\d+)")


@pytest.fixture
def workers(tiny_model_dir, tmp_path):
    server = Server(tiny_model_dir, tmp_path / "server.log", "--workers", "2", "--dtype", "float32",
                    "--max-num-streams", "8", "--drain-timeout", "2")
    yield server
    server.close()


def worker_of(server: Server) -> dict[int, int]:
    """Client port -> the worker that took its connection, from the connection log."""
    return {int(port): int(index) for index, port in PEER.findall(server.log())}


def worker_pids(server: Server) -> dict[int, int]:
    """Worker index -> pid of its latest start."""
    return {int(i): int(pid) for i, pid in re.findall(r"worker (\d) started \(pid (\d+)\)", server.log())}


async def open_until_both_workers(server: Server, stack: AsyncExitStack, audio: list[dict],
                                  most: int = 24) -> list[Raw]:
    """Native TCP connections, each sent `audio`, until both workers hold at least one."""
    conns = []
    for _ in range(most):
        conn = await stack.enter_async_context(Raw.open(server.url("tcp")))
        await conn.until("hello")
        for message in audio:
            await conn.send(message)
        conns.append(conn)
        await wait_until(lambda: _port(conn) in worker_of(server))
        if len({worker_of(server)[_port(c)] for c in conns}) == 2:
            return conns
    pytest.fail(f"{most} connections all went to one worker")


def _port(conn: Raw) -> int:
    return conn.tcp.socket.getsockname()[1]


async def test_streams_over_both_workers_give_the_one_process_tokens_and_one_metrics_view(workers, sentence,
                                                                                         solo_tokens):
    seen: set[int] = set()
    streams = 0
    while len(seen) < 2:
        assert streams < 24, "every connection went to one worker"
        async with trio.open_nursery() as nursery:
            results = {}
            for kind in ("tcp", "ws"):
                nursery.start_soon(lambda k: _keep(results, k, transcribe_raw(workers.url(k), sentence)), kind)
        assert all(result_tokens(r) == solo_tokens for r in results.values())
        streams += 2
        seen = {int(i) for i in re.findall(r"\[worker (\d)\] parakeet_stream.connections: connection closed",
                                            workers.log())}
    _, body = await http_get(workers.ports["http"], "/metrics")  # any worker: every worker's series
    assert metric(body, 'parakeet_streams_total{protocol="tcp"}') + metric(
        body, 'parakeet_streams_total{protocol="ws"}') == streams
    assert_clean_log(workers.log())


async def _keep(box: dict, key: str, work) -> None:
    box[key] = await work


async def test_a_worker_that_dies_loses_only_its_connections_and_is_started_again(workers, sentence, solo_tokens):
    first, rest = audio_messages(sentence)[:10], audio_messages(sentence)[10:]
    async with AsyncExitStack() as stack:
        conns = await open_until_both_workers(workers, stack, first)
        owner = worker_of(workers)
        victim = owner[_port(conns[0])]
        os.kill(worker_pids(workers)[victim], signal.SIGKILL)
        for conn in conns:
            if owner[_port(conn)] == victim:
                with trio.fail_after(5):
                    await conn.rest()  # its connection ends with it
            else:
                for message in rest:
                    await conn.send(message)
                results = [m for m in await conn.until("result", is_final=True) if m["type"] == "result"]
                assert result_tokens(results) == solo_tokens
    await wait_until(lambda: "starting it again" in workers.log(), timeout=10)
    # the dead worker's streams were cancelled in the engine: every slot is free again
    async def active() -> float:
        _, body = await http_get(workers.ports["http"], "/metrics")
        return metric(body, "parakeet_active_streams")

    with trio.fail_after(10):
        while await active():
            await trio.sleep(0.05)
    assert result_tokens(await transcribe_raw(workers.url("tcp"), sentence)) == solo_tokens
    assert_clean_log(workers.log())


async def test_when_the_engine_process_dies_every_stream_fails_and_the_workers_exit(workers, sentence):
    pids = worker_pids(workers)
    async with Raw.open(workers.url("tcp")) as conn:
        await conn.until("hello")
        for message in audio_messages(sentence)[:5]:
            await conn.send(message)
        workers.proc.kill()
        with trio.fail_after(10):
            seen = await conn.rest()
    assert any(m.get("code") == "inference_error" for m in seen), seen
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        await trio.sleep(0.05)
    assert not any(_alive(pid) for pid in pids.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped by init) is gone too
        return stat.read().split(") ")[1][0] != "Z"


def test_workers_flag_and_its_default():
    assert build_parser().parse_args(["--workers", "3"]).workers == 3
    assert build_parser().parse_args([]).workers == "auto"
    for bad in ("-1", "abc"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--workers", bad])
    assert default_workers("cpu", 64) == 0
    assert [default_workers("cuda", cores) for cores in (2, 16, 64)] == [1, 4, 8]


async def test_grpc_uploads_and_the_agent_are_served_by_the_workers(tiny_model_dir, tmp_path, sentence):
    server = Server(tiny_model_dir, tmp_path / "server.log", "--workers", "2", "--dtype", "float32", "--agent-port", "0")
    try:
        pcm = encode_audio(sentence, "pcm16")
        config = riva_client.StreamingRecognitionConfig(
            config=riva_client.RecognitionConfig(encoding=riva_client.AudioEncoding.LINEAR_PCM,
                                                 sample_rate_hertz=16000, language_code="en-US"))
        asr = riva_client.ASRService(riva_client.Auth(uri=f"127.0.0.1:{server.ports['grpc']}", use_ssl=False))
        for _ in range(4):  # calls land on either worker (they share the port)
            responses = await trio.to_thread.run_sync(
                lambda: list(asr.streaming_response_generator([pcm[i:i + 3200] for i in range(0, len(pcm), 3200)],
                                                              config)))
            text = "".join(r.alternatives[0].transcript for resp in responses for r in resp.results if r.is_final)
            assert text.strip() == (await transcribe_text(server, sentence))
        answer = await post(server.ports["http"], "/v1/audio/transcriptions",
                            multipart({"model": "whisper-1", "response_format": "text"}, audio_file(sentence)),
                            "multipart/form-data; boundary=b0undary")
        assert answer.status == 200 and answer.body.decode().strip() == await transcribe_text(server, sentence)
        stream = await trio.open_tcp_stream("127.0.0.1", server.ports["agent"])
        async with stream:
            line = await stream.receive_some(100)
        assert re.fullmatch(rb"up ready \d+%\n", line)
        assert_clean_log(server.log())
    finally:
        server.close()


async def transcribe_text(server: Server, samples) -> str:
    results = await transcribe_raw(server.url("tcp"), samples)
    return " ".join(results[-1]["text"].split())


def test_the_engine_service_refuses_a_bad_message_and_drops_only_a_client_that_sends_no_frames(engine, sentence,
                                                                                               solo_tokens):
    """The engine process's socket is this user's only, but a worker with a bug must not take the
    engine or the other workers down: a message the engine refuses is dropped alone; bytes that are
    no frame end that client's connection."""
    with behind_service(engine) as good:
        path = good._connection._sock.getpeername()
        framer = Framer(FromEngine)
        with socket.socket(socket.AF_UNIX) as careless, socket.socket(socket.AF_UNIX) as broken:
            careless.connect(path)
            careless.sendall(framer.frame(Audio([10**6], [0], b"abc")))  # 3 bytes: no float32 samples
            careless.sendall(framer.frame(Audio([1, 2], [3], bytes(12))))  # one size for two streams
            careless.sendall(framer.frame(Audio([1], [2], bytes(12))))  # 3 samples, 2 announced
            careless.sendall(framer.frame(Audio([1, 2], [5, -2], bytes(12))))  # a negative size, the sum right
            careless.sendall(framer.frame(Open(1, None, False, [])))
            assert any(isinstance(m, Opened) and m.ref == 1 for m in _messages(careless, framer, Opened))
            broken.connect(path)
            broken.sendall(HEADER.pack(5) + b"\xc1\xc1\xc1\xc1\xc1")  # msgpack's never-used byte
            broken.settimeout(10)
            while broken.recv(65536):  # until the engine closes it
                pass
        assert tokens_of(run_stream(good, sentence)) == solo_tokens


def test_packets_sent_together_reach_the_engine_in_one_message_each_stream_its_own(engine, wavs):
    """A worker's audio leaves in the order pushed, what was queued together as one message of many
    streams' packets, and a stream's small packets are held until they make a chunk ready: the
    engine process reads and pushes once for many streams, about one packet per chunk of each, and
    every stream still gets exactly its own samples, in order, before its final."""
    audios = varied_audios(wavs, 4)
    alone = [tokens_of(run_stream(engine, audio)) for audio in audios]
    got: list[tuple[list[int], list[int]]] = []
    push_many = engine.push_many

    def counted(sids, packets):
        got.append((list(sids), [packet.size for packet in packets]))
        push_many(sids, packets)

    engine.push_many = counted
    try:
        with behind_service(engine) as client:
            sids = [client.create_stream() for _ in audios]
            first, more = client.info.ready_samples[client.info.default_lookahead]
            sent = 0
            for start in range(0, max(map(len, audios)), 320):  # 20 ms packets
                for sid, audio in zip(sids, audios):
                    if start < len(audio):
                        client.push_audio(sid, audio[start:start + 320])
                        sent += 1
            for sid in sids:
                client.finalize(sid)
            together = [tokens_of(collect_until_final(client, sid)) for sid in sids]
    finally:
        del engine.push_many
    assert together == alone
    received = {sid: [size for sids_, sizes in got for s, size in zip(sids_, sizes) if s == sid] for sid in sids}
    for sid, audio in zip(sids, audios):
        assert sum(received[sid]) == len(audio)
        assert len(received[sid]) <= 2 + (len(audio) - first) // more  # a packet per chunk, and the rest at the final
    assert len(got) < sent // 8


def test_streams_pushed_from_many_threads_at_once_all_reach_their_final_with_their_own_tokens(engine, wavs):
    """The engine's threads wake the service's writer and the Scheduler without a lock they share
    with them: with 8 streams (4 of them queued) pushed in 20 ms packets from 4 threads at once
    (news arriving while the Scheduler plans and while the writer sends), no stream's news is lost
    and none waits for a wake-up that never comes."""
    audios = varied_audios(wavs, 8)
    alone = [tokens_of(run_stream(engine, audio)) for audio in audios]
    with behind_service(engine) as client:
        sids = [client.create_stream() for _ in audios]

        def feed(mine: list[int]) -> None:
            for start in range(0, max(len(audios[k]) for k in mine), 320):
                for k in mine:
                    if start < len(audios[k]):
                        client.push_audio(sids[k], audios[k][start:start + 320])
            for k in mine:
                client.finalize(sids[k])

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(feed, [list(range(i, len(audios), 4)) for i in range(4)]))
        together = [tokens_of(collect_until_final(client, sid)) for sid in sids]
    assert together == alone


def test_a_stream_s_audio_is_held_only_while_it_makes_no_chunk_ready(engine):
    """The engine client's chunk gate (`_ChunkGate`) against the engine's own rule (Inbox): fed the
    same packets, the engine's inbox behind the gate has every chunk ready as soon as an inbox fed
    every packet at once has it, in every lookahead mode, and nothing is left behind at the end."""
    rng = np.random.default_rng(7)
    features = engine.model.cfg.features
    for mode in engine.info.lookahead_modes:
        inbox = lambda: Inbox(engine.model.encoder.chunk_spec(mode), features.hop_length, features.n_fft)  # noqa: E731
        direct, behind = inbox(), inbox()
        gate = engine_client._ChunkGate(*engine.info.ready_samples[mode])
        for size in rng.integers(1, 3000, 300):
            packet = np.zeros(size, np.float32)
            direct.add(packet)
            if (released := gate.add(packet)) is not None:
                behind.add(released)
            assert behind.chunks_ready == direct.chunks_ready
        if (rest := gate.rest()) is not None:  # at the final
            behind.add(rest)
        assert behind.samples_in == direct.samples_in and gate.rest() is None


def test_a_worker_whose_engine_stops_reading_waits_with_a_bounded_queue(engine, monkeypatch):
    """The engine client sends from a thread of its own; if the engine process stops reading, the
    audio queued for it stays bounded and push_audio waits (as a blocking send did), until the
    engine is gone: then nothing waits any more."""
    monkeypatch.setattr(engine_connection, "QUEUE_BYTES", 1 << 16)
    answers = {"stats": {}, "totals": {"steps": 0, "chunks": 0, "seconds": {}}, "latency": {}, "healthy": True}
    with socket.socket(socket.AF_UNIX) as listener, tempfile.TemporaryDirectory() as folder:
        listener.bind(f"{folder}/engine.sock")
        listener.listen()
        opened = threading.Event()

        def stalled_engine():  # says hello, answers the client's first questions and its Open, then reads no more
            sock, _ = listener.accept()
            framer = Framer(ToEngine)
            sock.sendall(framer.frame(hello(engine)))
            while not opened.is_set():
                for message in framer.receive(sock) or []:
                    if isinstance(message, Ask):
                        sock.sendall(framer.frame(Answer(message.ref, answers[message.what])))
                    elif isinstance(message, Open):
                        sock.sendall(framer.frame(Opened(message.ref, 1, 0)))
                        opened.set()
            return sock

        with ThreadPoolExecutor(2) as pool:
            engine_side = pool.submit(stalled_engine)
            client = EngineClient.connect(f"{folder}/engine.sock")
            sid = client.create_stream()
            packet = np.zeros(1 << 18, np.float32)  # 1 MiB

            def push_until_failed() -> int:
                for pushed in range(64):
                    try:
                        client.push_audio(sid, packet)
                    except EngineError as exc:
                        assert exc.code == "inference_error"
                        return pushed
                return 64

            pushing = pool.submit(push_until_failed)
            time.sleep(2.0)
            assert not pushing.done()  # waiting: the kernel's buffers and the queue are full
            assert client._connection._queued <= engine_connection.QUEUE_BYTES + packet.nbytes
            engine_side.result().close()  # the engine process goes away
            assert pushing.result(timeout=10) < 64  # the waiting push returned, the next ones failed
            assert client.collect(sid)[-1].error == "inference_error"


def test_audio_messages_keep_to_their_size_bound_and_a_larger_packet_goes_alone(monkeypatch):
    monkeypatch.setattr(engine_connection, "AUDIO_BYTES", 40)  # 10 samples
    sent = [(1, np.arange(4, dtype=np.float32)), (2, np.arange(5, dtype=np.float32)),
            (3, np.arange(12, dtype=np.float32)), (1, np.arange(2, dtype=np.float32))]
    messages = list(engine_connection._audio_messages(iter(sent)))
    assert [m.sids for m in messages] == [[1, 2], [3], [1]]
    received = [(sid, packet) for m in messages for sid, packet in zip(m.sids, packets(m))]
    assert [sid for sid, _ in received] == [sid for sid, _ in sent]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(received, sent))


def _messages(sock: socket.socket, framer: Framer, until: type) -> list:
    sock.settimeout(10)
    seen: list = []
    while not any(isinstance(m, until) for m in seen):
        seen += framer.feed(sock.recv(65536))
    return seen
