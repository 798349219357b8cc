"""Connection lifecycle: vanishing and slow clients, timeouts, limits, auth, HTTP, shutdown."""
from __future__ import annotations

import logging
import re
import socket

import orjson
import pytest
import trio
import riva.client as riva_client
from helpers import (
    BareWebSocket,
    Raw,
    ServerProcess,
    audio_file,
    audio_messages,
    http_get,
    metric,
    multipart,
    post,
    result_tokens,
    running_server,
    transcribe_raw,
    url,
    wait_until,
)
from trio_websocket import ConnectionRejected, open_websocket_url

from parakeet_stream.client import encode_audio
from parakeet_stream.server.operations.http import static_file


@pytest.fixture(params=[0, 2], ids=["one-process", "two-workers"])
def server_process(tiny_model_dir, request):
    """The server as one process, and with its doors in two worker processes (--workers 2)."""
    server = ServerProcess(tiny_model_dir, "--max-num-streams", "3", "--max-queue", "4", "--drain-timeout", "1",
                           "--workers", str(request.param))
    yield server
    server.close()


async def streams_opened(port: int) -> float:
    """Engine streams opened so far, every protocol (and every worker) together."""
    status, body = await http_get(port, "/metrics")
    assert status == 200
    return sum(float(v) for v in re.findall(rb"^parakeet_streams_total\{[^}]*\} (\S+)$", body, re.M))


async def active_streams(port: int) -> float:
    status, body = await http_get(port, "/metrics")
    assert status == 200
    return metric(body, "parakeet_active_streams") + metric(body, "parakeet_queued_streams")


async def test_cli_config_ready_line_and_health(server_process):
    assert any(line.strip().startswith("model = ") for line in server_process.config_lines)
    assert "api_key = none" in "".join(server_process.config_lines)
    status, body = await http_get(server_process.ports["http"], "/health")
    health = orjson.loads(body)
    assert status == 200 and health["status"] == "ok" and health["ports"] == server_process.ports
    start = health["start"]  # where start-up time goes, phase by phase, through the engine process's hello
    assert list(start["phases"]) == ["load", "precision", "memory", "pools", "capture"]
    assert 0 < sum(start["phases"].values()) <= start["seconds"] + 0.05 and start["cuda_graphs"] == 0


async def test_metrics_count_the_engines_steps_chunks_and_seconds_per_stage(engine, sentence):
    async with running_server(engine) as ctx:
        _, before = await http_get(ctx.config.ports["http"], "/metrics")
        results = await transcribe_raw(url(ctx, "tcp"), sentence)
        _, after = await http_get(ctx.config.ports["http"], "/metrics")

    def grew(name: str) -> float:
        return metric(after, name) - metric(before, name)

    steps, chunks = grew("parakeet_steps_total"), grew("parakeet_step_chunks_total")
    assert 1 <= steps <= chunks and chunks >= len(results) - 1  # a result per chunk at most, and the final
    assert all(grew(f'parakeet_stage_seconds_total{{stage="{stage}"}}') > 0 for stage in ("pre-encode", "encode", "decode"))


async def test_each_connection_logs_one_line_when_it_opens_and_one_when_it_closes(engine, sentence, caplog):
    caplog.set_level(logging.INFO, logger="parakeet_stream.connections")
    async with running_server(engine) as ctx:
        results = await transcribe_raw(url(ctx, "tcp"), sentence)
        async with Raw.open(url(ctx, "ws", "/v1/listen?encoding=linear16&sample_rate=16000")) as conn:
            await conn.send({"type": "CloseStream"})
            await conn.rest()
    lines = [r.getMessage() for r in caplog.records if r.name == "parakeet_stream.connections"]
    peer = r"peer=127\.0\.0\.1:\d+"
    assert re.fullmatch(rf"connection open {peer} door=tcp protocol=native", lines[0])
    seconds = f"{len(sentence) / 16000:.1f}"
    assert re.fullmatch(
        rf"connection closed {peer} door=tcp protocol=native reason=completed audio_s={seconds} results={len(results)}",
        lines[1],
    )
    assert lines[0].split()[2] == lines[1].split()[2]  # the same peer
    assert re.fullmatch(rf"connection open {peer} door=ws protocol=deepgram", lines[2])
    assert re.fullmatch(rf"connection closed {peer} door=ws protocol=deepgram reason=completed audio_s=0.0 results=0", lines[3])
    assert len(lines) == 4


async def test_every_door_logs_its_connections_and_says_honestly_how_each_ended(engine, sentence, caplog):
    """A client that closes once its transcript is done: completed; one that drops in the middle of
    a stream: vanished; a gRPC call and an HTTP upload get their two lines like any connection."""
    caplog.set_level(logging.INFO, logger="parakeet_stream.connections")
    pcm = encode_audio(sentence, "pcm16")
    async with running_server(engine) as ctx:
        async with Raw.open(url(ctx, "ws", "/v1/listen?encoding=linear16&sample_rate=16000")) as conn:
            await conn.send(pcm)
            await conn.send({"type": "Finalize"})
            await conn.until("Results", from_finalize=True)  # then the client closes
        ws = await BareWebSocket.connect(ctx.config.ports["ws"], "/")
        await ws.stream.send_all(ws.frames(*audio_messages(sentence)[:5]))
        await ws.drop()
        config = riva_client.StreamingRecognitionConfig(
            config=riva_client.RecognitionConfig(encoding=riva_client.AudioEncoding.LINEAR_PCM, sample_rate_hertz=16000,
                                                 language_code="en-US"), interim_results=True)
        asr = riva_client.ASRService(riva_client.Auth(uri=f"127.0.0.1:{ctx.config.ports['grpc']}", use_ssl=False))
        await trio.to_thread.run_sync(
            lambda: list(asr.streaming_response_generator([pcm[i:i + 3200] for i in range(0, len(pcm), 3200)], config)))
        answer = await post(ctx.config.ports["http"], "/v1/audio/transcriptions",
                            multipart({"model": "whisper-1"}, audio_file(sentence)), "multipart/form-data; boundary=b0undary")
        assert answer.status == 200
        await wait_until(lambda: len(closes(caplog)) == 4)
    seconds = f"{len(sentence) / 16000:.1f}"
    done = closes(caplog)
    assert re.fullmatch(r"door=ws protocol=deepgram reason=completed audio_s=\S+ results=[1-9]\d*", done[0])
    assert re.fullmatch(r"door=ws protocol=native reason=vanished audio_s=\S+ results=\d+", done[1])
    assert re.fullmatch(rf"door=grpc protocol=riva reason=completed audio_s={seconds} results=[1-9]\d*", done[2])
    assert re.fullmatch(rf"door=http protocol=openai_files reason=completed audio_s={seconds} results=[1-9]\d*", done[3])
    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith("connection open")]
    assert [line.split()[3:] for line in opened][2:] == [["door=grpc", "protocol=riva"], ["door=http", "protocol=openai_files"]]


def closes(caplog) -> list[str]:
    """The close lines so far, without the words before the door (the peer)."""
    lines = [r.getMessage() for r in caplog.records if r.name == "parakeet_stream.connections"]
    return [line.split(" ", 3)[3] for line in lines if line.startswith("connection closed")]


async def test_vanishing_clients_free_their_slots_within_a_second(server_process, sentence):
    http = server_process.ports["http"]
    for i in range(12):
        audio = audio_messages(sentence[: 16000 * (1 + i % 2)])[:-1]
        if i % 3 == 0:
            async with Raw.open(server_process.url("tcp")) as conn:
                for message in audio:
                    await conn.send(message)
        else:  # WebSocket clients that drop without a close frame
            path = "/" if i % 3 == 1 else "/v1/realtime"
            if path != "/":
                audio = [{"type": "input_audio_buffer.append", "audio": m["data"]} for m in audio]
            ws = await BareWebSocket.connect(server_process.ports["ws"], path)
            await ws.stream.send_all(ws.frames(*audio))
            await ws.drop()
        with trio.fail_after(1.0):  # its stream was opened (a check before that would pass for nothing), then freed
            while await streams_opened(http) < i + 1 or await active_streams(http):
                await trio.sleep(0.02)
    status, body = await http_get(http, "/metrics")
    assert metric(body, "parakeet_active_streams") == 0 and metric(body, "parakeet_free_slots") == 3
    assert metric(body, 'parakeet_connections{protocol="tcp"}') == 0


async def test_sigterm_drains_active_streams_and_exits_0(server_process, sentence):
    """Streams that never end are finalized when the drain timeout (1 s here) passes."""
    async with trio.open_nursery() as nursery:
        outcomes: dict[str, list] = {}

        async def client(name: str, address: str, realtime: bool = False, task_status=trio.TASK_STATUS_IGNORED):
            async with Raw.open(address) as conn:
                first = await conn.recv()
                for message in audio_messages(sentence)[:-1]:  # never sends its final
                    if realtime:
                        message = {"type": "input_audio_buffer.append", "audio": message["data"]}
                    await conn.send(message)
                await conn.send({"type": "ping"} if not realtime else {"type": "input_audio_buffer.commit"})
                task_status.started()
                outcomes[name] = [first, *await conn.rest()]
                outcomes[name + ".close"] = conn.close_code

        await nursery.start(client, "tcp", server_process.url("tcp"))
        await nursery.start(client, "ws", server_process.url("ws"))
        await nursery.start(client, "realtime", server_process.url("ws", "/v1/realtime"), True)
        await nursery.start(client, "queued", server_process.url("tcp"))
        await trio.sleep(0.3)
        code = await trio.to_thread.run_sync(server_process.terminate)
    assert code == 0
    for name in ("tcp", "ws"):
        seen = outcomes[name]
        finals = [m for m in seen if m["type"] == "result" and m["is_final"]]
        assert len(finals) == 1 and finals[0]["audio_seconds"] > 0, seen[-3:]
        assert seen[-1] == {"type": "closed", "reason": "server_shutdown"}
    assert outcomes["ws.close"] == 1001
    assert outcomes["realtime"][-1]["type"] == "transcription.done" and outcomes["realtime.close"] == 1001
    assert outcomes["queued"][0]["type"] == "queued"
    assert outcomes["queued"][-1] == {"type": "closed", "reason": "server_shutdown"}
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", server_process.ports["tcp"])


async def test_half_closed_tcp_client_still_gets_its_final(engine, sentence, solo_tokens):
    async with running_server(engine) as ctx:
        stream = await trio.open_tcp_stream("127.0.0.1", ctx.config.ports["tcp"])
        async with stream:
            lines = b"".join(orjson.dumps(m) + b"\n" for m in audio_messages(sentence))
            await stream.send_all(lines)
            await stream.send_eof()
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    results = [orjson.loads(line) for line in data.splitlines()][1:]
    assert results[-1]["is_final"] and [t for r in results for t in r["token_ids"]] == solo_tokens


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_client_that_never_reads_is_dropped(engine, sentence, solo_tokens, kind):
    async with running_server(engine, send_timeout=0.3) as ctx, trio.open_nursery() as nursery:
        good = {}

        async def good_stream() -> None:
            good["results"] = await transcribe_raw(url(ctx, "ws"), sentence, paced=0.01)

        nursery.start_soon(good_stream)
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        if kind == "ws":
            ws = await BareWebSocket.connect(ctx.config.ports["ws"], sock=sock)
            stream, flood = ws.stream, ws.frames(*[{"type": "ping"}] * 2000)
        else:
            await sock.connect(("127.0.0.1", ctx.config.ports["tcp"]))
            stream, flood = trio.SocketStream(sock), b'{"type":"ping"}\n' * 2000
        with trio.move_on_after(10):
            try:
                while True:  # pings, each answered with a pong nobody reads
                    await stream.send_all(flood)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await trio.aclose_forcefully(stream)
        await wait_until(lambda: ctx.metrics.errors.labels("slow_consumer")._value.get() == 1, timeout=5)
    assert result_tokens(good["results"]) == solo_tokens
    await wait_until(lambda: ctx.engine.stats()["active"] == 0, timeout=1)


async def test_idle_timeout(engine):
    async with running_server(engine, idle_timeout=0.3) as ctx:
        for kind in ("tcp", "ws"):
            async with Raw.open(url(ctx, kind)) as conn:
                seen = await conn.rest()
                assert seen[0]["type"] == "hello" and seen[-1]["code"] == "idle_timeout"
                assert conn.ws is None or conn.close_code == 1000
        await wait_until(lambda: ctx.engine.stats()["active"] == 0)


async def test_max_stream_seconds_ends_with_final_and_reason(engine, sentence):
    async with running_server(engine, max_stream_seconds=1.0) as ctx, Raw.open(url(ctx, "ws")) as conn:
        for message in audio_messages(sentence)[:-1]:
            await conn.send(message)
        seen = await conn.rest()
        finals = [m for m in seen if m["type"] == "result" and m["is_final"]]
        assert len(finals) == 1 and 0.9 <= finals[0]["audio_seconds"] <= 1.1 + engine.chunk_seconds()
        assert seen[-1] == {"type": "closed", "reason": "max_stream_seconds"}
        assert conn.close_code == 1000


async def test_api_key(engine):
    async with running_server(engine, api_key="sekret") as ctx:
        async with Raw.open(url(ctx, "tcp")) as conn:  # TCP: the first message must carry it
            await conn.send({"type": "ping"})
            assert [m["code"] for m in await conn.rest()] == ["unauthorized"]
        for first in ({"type": "start", "api_key": "sekret"}, {"type": "ping", "api_key": "sekret"}):
            async with Raw.open(url(ctx, "tcp")) as conn:
                await conn.send(first)
                await conn.send({"type": "ping"})
                seen = await conn.until("pong")
                if not any(m["type"] == "hello" for m in seen):
                    seen += await conn.until("hello")
                assert not [m for m in seen if m["type"] == "error"]
        for path in ("/", "/v1/realtime"):
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(url(ctx, "ws", path)):
                    pass
            assert rejected.value.status_code == 401 and orjson.loads(rejected.value.body)["code"] == "unauthorized"
            async with Raw.open(url(ctx, "ws", path), headers=[(b"Authorization", b"Bearer sekret")]) as conn:
                assert (await conn.recv())["type"] in ("hello", "session.created")
            async with Raw.open(url(ctx, "ws", path + "?api_key=sekret")) as conn:
                assert (await conn.recv())["type"] in ("hello", "session.created")


async def test_origin_allow_list(engine):
    async with running_server(engine, allowed_origins=("https://good.example",)) as ctx:
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(url(ctx, "ws"), extra_headers=[(b"Origin", b"https://evil.example")]):
                pass
        assert rejected.value.status_code == 403
        async with Raw.open(url(ctx, "ws"), headers=[(b"Origin", b"https://good.example")]) as conn:
            assert (await conn.recv())["type"] == "hello"
        async with Raw.open(url(ctx, "ws")) as conn:  # no Origin header: not a browser
            assert (await conn.recv())["type"] == "hello"


async def test_http_endpoints(engine):
    async with running_server(engine) as ctx:
        port = ctx.config.ports["http"]
        status, body = await http_get(port, "/health")
        assert status == 200 and orjson.loads(body)["ports"] == ctx.config.ports
        assert (await http_get(port, "/ready"))[0] == 200
        async with trio.open_nursery() as nursery:
            for _ in range(engine.stats()["max_num_streams"]):
                await nursery.start(_slot_holder, url(ctx, "tcp"))
            status, body = await http_get(port, "/ready")  # slots full, but the queue has room
            assert status == 200 and orjson.loads(body)["free_slots"] == 0
            assert orjson.loads(body)["reason"] == "queue_room"
            status, body = await http_get(port, "/metrics")
            assert metric(body, "parakeet_active_streams") == engine.stats()["max_num_streams"]
            nursery.cancel_scope.cancel()
        for name in ("chunk_latency_seconds_bucket", "time_to_final_seconds", "audio_seconds_total"):
            assert f"parakeet_{name}".encode() in body
        assert (await http_get(port, "/nope"))[0] == 404
        assert (await http_get(port, "/../../etc/passwd"))[0] == 404


async def _slot_holder(address: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with Raw.open(address) as conn:
        await conn.recv()
        task_status.started(conn)
        await trio.sleep_forever()


def test_static_file_hook(tmp_path):
    (tmp_path / "index.html").write_text("<h1>hi</h1>")
    (tmp_path / "app.js").write_text("1")
    assert static_file("/", tmp_path) == (b"<h1>hi</h1>", "text/html")
    assert static_file("/app.js", tmp_path)[1] in ("text/javascript", "application/javascript")
    assert static_file("/../secret", tmp_path) is None and static_file("/missing", tmp_path) is None
