"""Inputs that once reached a traceback, a wrong close or a duplicated event (issue 23 and the
fuzzer), each kept as a plain test against the in-process server: the documented answer comes
back, the connection stays open where the docs say so, and nothing is logged as an error."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import trio
from helpers import Raw, audio_file, head, multipart, pcm16_b64, running_server, url, wait_until

from parakeet_stream.client import encode_audio

from .clients import reset

DEEP = "[" * 1000 + "]" * 1000
OPENAI = "/v1/realtime?intent=transcription"
MANUAL = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}}}


@pytest.fixture(autouse=True)
def no_error_logged(caplog):
    yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def append(samples: np.ndarray) -> dict:
    return {"type": "input_audio_buffer.append", "audio": pcm16_b64(samples)}


async def answers(conn: Raw, kind: str) -> list[dict]:
    """What comes back up to `kind` (the probe's answer)."""
    return await conn.until(kind)


async def test_deep_values_where_a_string_is_expected(engine):
    """1,000-deep arrays in `type` or in an unknown field: invalid_json, the session goes on;
    a shallow one in `type` is no type at all."""
    async with running_server(engine) as ctx:
        async with Raw.open(url(ctx, "ws", OPENAI)) as conn:
            await conn.until("session.created")
            await conn.send('{"type": ' + DEEP + "}")
            await conn.send('{"type": "input_audio_buffer.clear", "x": ' + DEEP + "}")
            await conn.send('{"type": [[[["x"]]]]}')
            await conn.send({"type": "input_audio_buffer.clear"})
            seen = await answers(conn, "input_audio_buffer.cleared")
            errors = [m["error"] for m in seen if m["type"] == "error"]
            assert [e["code"] for e in errors] == ["invalid_json", "invalid_json", "missing_field"]
            assert errors[0]["message"] == "JSON nested too deeply"
        async with Raw.open(url(ctx, "ws", "/v1/listen?encoding=linear16&sample_rate=16000")) as conn:
            await conn.send('{"type": ' + DEEP + "}")
            await conn.send({"type": "Unknown"})
            first, second = await conn.recv(), await conn.recv()
            assert (first["variant"], second["variant"]) == ("invalid_json", "unknown_type")


async def test_unhashable_and_oversized_values_in_session_update(engine):
    """Lists or objects where a string is expected, an integer beyond 64 bits, a 300-deep array:
    refused as invalid_field (the session goes on); nothing unvalidated is echoed."""
    deep = "[" * 300 + "]" * 300
    audio_input = [
        '{"format": {"type": ["audio/pcm"]}}',
        '{"turn_detection": {"type": {"a": 1}}}',
        '{"turn_detection": {"type": "server_vad", "silence_duration_ms": %d}}' % 2**70,
        '{"transcription": {"model": "m", "prompt": %s}}' % deep,
        '{"transcription": %s}' % deep,
    ]
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws", OPENAI)) as conn:
        await conn.until("session.created")
        for fields in audio_input:
            await conn.send('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": %s}}}'
                            % fields)
        await conn.send(MANUAL)
        seen = await answers(conn, "session.updated")
        errors = [m["error"] for m in seen if m["type"] == "error"]
        assert [e["code"] for e in errors] == ["invalid_field"] * 5, seen
        assert errors[2]["param"] == "session.audio.input.turn_detection.silence_duration_ms"
        assert "<=" in errors[2]["message"] and "$.session" in errors[2]["message"]
        assert seen[-1]["session"]["audio"]["input"]["turn_detection"] is None


async def test_clear_racing_commits_waiting_behind_a_draining_item(engine, sentence):
    """Commits of audio appended while an item drains, and clears in between: every commit is
    committed once, what a clear drops never gets an item, nothing fails."""
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws", OPENAI)) as conn:
        await conn.until("session.created")
        await conn.send(MANUAL)
        piece = sentence[:4800]
        for _ in range(20):
            for message in (append(piece), {"type": "input_audio_buffer.commit"}, append(piece),
                            {"type": "input_audio_buffer.clear"}):
                await conn.send(message)
        await conn.send({"type": "input_audio_buffer.commit"})  # nothing left to commit
        seen = await answers(conn, "error")
        await conn.send(MANUAL)
        seen += await answers(conn, "session.updated")
        assert seen[-2]["error"]["code"] == "input_audio_buffer_commit_empty"
        assert not [m for m in seen[:-2] if m["type"] == "error"], seen
        committed = [m["item_id"] for m in seen if m["type"] == "input_audio_buffer.committed"]
        assert len(committed) == len(set(committed)) == 20


async def test_empty_append_after_a_commit_is_nothing_to_commit(engine, sentence):
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws", OPENAI)) as conn:
        await conn.until("session.created")
        await conn.send(MANUAL)
        await conn.send(append(sentence[:8000]))
        await conn.send({"type": "input_audio_buffer.commit"})
        await conn.send({"type": "input_audio_buffer.append", "audio": ""})
        await conn.send({"type": "input_audio_buffer.commit"})
        seen = await answers(conn, "error")
        assert seen[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
        await conn.send(append(sentence[:8000]))
        await conn.send({"type": "input_audio_buffer.commit"})  # the session is open and works
        seen += await answers(conn, "conversation.item.input_audio_transcription.completed")
        seen += await answers(conn, "conversation.item.input_audio_transcription.completed")
        assert [m["type"] for m in seen].count("input_audio_buffer.committed") == 2


async def test_many_short_items_are_each_committed_once(engine, sentence):
    """200 x (append 20 ms, commit), sent without waiting: one committed per item, each item
    completed once, in commit order."""
    audio = np.resize(sentence, 200 * 320)
    async with running_server(engine, max_messages_per_second=1e6) as ctx:
        async with Raw.open(url(ctx, "ws", OPENAI)) as conn:
            await conn.until("session.created")
            await conn.send(MANUAL)
            for i in range(200):
                await conn.send(append(audio[i * 320 : (i + 1) * 320]))
                await conn.send({"type": "input_audio_buffer.commit"})
            seen = []
            with trio.fail_after(60):
                while sum(m["type"].endswith(".completed") for m in seen) < 200:
                    seen.append(await conn.recv())
    committed = [m["item_id"] for m in seen if m["type"] == "input_audio_buffer.committed"]
    completed = [m["item_id"] for m in seen if m["type"].endswith(".completed")]
    assert len(committed) == len(set(committed)) == 200 and completed == committed
    previous = [m["previous_item_id"] for m in seen if m["type"] == "input_audio_buffer.committed"]
    assert previous == [None, *committed[:-1]]


async def test_deepgram_finalize_close_and_audio_interleaved(engine, sentence):
    """Finalize, audio and CloseStream sent without waiting: one final per segment with audio,
    Metadata last, close 1000."""
    pcm = encode_audio(sentence[:16000], "pcm16")
    async with running_server(engine) as ctx:
        async with Raw.open(url(ctx, "ws", "/v1/listen?encoding=linear16&sample_rate=16000")) as conn:
            for _ in range(5):
                await conn.send(pcm)
                await conn.send({"type": "Finalize"})
                await conn.send({"type": "Finalize"})
            await conn.send({"type": "CloseStream"})
            await conn.send(pcm)  # after CloseStream: stream_closed
            seen = await conn.rest()
        assert conn.close_code == 1000
    assert [m["type"] for m in seen][-1] == "Metadata"
    assert [m["variant"] for m in seen if m["type"] == "Error"] == ["stream_closed"]
    assert sum(m["type"] == "Results" and m.get("from_finalize") for m in seen) == 5


async def test_http_head_and_unknown_transfer_codings(engine):
    """A HEAD request made h11 refuse the body we sent (a traceback); a transfer coding h11 does
    not implement was answered 501 with the reason phrase of a 400."""
    async with running_server(engine) as ctx:
        port = ctx.config.ports["http"]
        head = await raw_http(port, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and head.endswith(b"\r\n\r\n")
        gzip = await raw_http(port, b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n")
        assert gzip.startswith(b"HTTP/1.1 501 Not Implemented\r\n")


async def raw_http(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    async with stream:
        await stream.send_all(request)
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                data += chunk
    return data


UPLOAD = "/v1/audio/transcriptions"
FORM = "multipart/form-data; boundary=b0undary"


async def test_an_upload_whose_client_half_closes_or_resets(engine, sentence):
    """The whole body, then the client's end of stream (taken for a client that left), or a
    reset in the middle of the body: the upload ends without an answer and frees its stream.
    Both reached the upload's catch-all: a traceback, and a 500 for the half-closed client."""
    body = multipart({}, audio_file(sentence))
    request = head(UPLOAD, {"Content-Type": FORM, "Content-Length": str(len(body))}) + body
    async with running_server(engine) as ctx:
        port = ctx.config.ports["http"]
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(request)
            await stream.send_eof()
            assert await read_all(stream) == b""
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(request[: len(request) // 2])
        await wait_until(lambda: ctx.open_uploads == 1)
        reset(stream)
        await wait_until(lambda: ctx.open_uploads == 0 and engine.stats()["active"] == 0)


async def read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_an_upload_whose_head_comes_in_two_pieces(engine, sentence):
    """The first bytes of the head alone, then the rest of it with the body: the body's first
    16 KiB were counted as head bytes, and a 3 KB head was refused 431 (too large)."""
    body = multipart({}, audio_file(sentence[:16000]))
    request = head(UPLOAD + "?x=" + "1" * 3000, {"Content-Type": FORM, "Content-Length": str(len(body))}) + body
    async with running_server(engine) as ctx:
        async with await trio.open_tcp_stream("127.0.0.1", ctx.config.ports["http"]) as stream:
            await stream.send_all(request[:15])
            await trio.sleep(0.1)
            await stream.send_all(request[15:])
            answer = await read_all(stream)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"text"' in answer, answer[:300]
