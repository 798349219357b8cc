"""docs/protocol.md's error codes: every malformed input gets its documented code and connection policy,
while a concurrent well-behaved stream transcribes exactly as it does alone."""
from __future__ import annotations

import base64
import re

import numpy as np
import orjson
import pytest
import trio
from helpers import (
    BareWebSocket,
    PoisonedEngine,
    Raw,
    audio_messages,
    result_tokens,
    running_server,
    transcribe_raw,
    url,
)

from parakeet_stream.engine import ASREngine

MAX_MESSAGE = 65536
F32_NAN = base64.b64encode(np.array([0.0, np.nan], "<f4").tobytes()).decode()

# (code, lines sent after the hello) -> the error comes back and the connection stays usable
KEEP_OPEN = [
    ("invalid_json", "{not json"),
    ("invalid_message", "[1, 2]"),
    ("missing_field", '{"no_type": 1}'),
    ("unknown_type", '{"type": "dance"}'),
    ("invalid_field", '{"type": "audio", "data": "", "final": "yes"}'),
    ("invalid_field", '{"type": "audio", "samples": "loud"}'),
    ("invalid_field", '{"type": "audio", "samples": [[0.1], [0.2]]}'),
    ("invalid_field", '{"type": "audio", "data": 5}'),
    ("invalid_field", '{"type": "audio", "data": "AAAA", "encoding": "mp3"}'),
    ("missing_field", '{"type": "audio"}'),
    ("invalid_base64", '{"type": "audio", "data": "@@@="}'),
    ("invalid_base64", '{"type": "audio", "data": "AAA"}'),
    ("invalid_audio_length", '{"type": "audio", "data": "AA==", "encoding": "pcm16"}'),
    ("invalid_audio_length", '{"type": "audio", "data": "AAAA", "encoding": "f32"}'),
    ("invalid_samples", '{"type": "audio", "samples": [0.1, NaN]}'),
    ("invalid_samples", '{"type": "audio", "samples": [1e999]}'),
    ("invalid_samples", f'{{"type": "audio", "data": "{F32_NAN}", "encoding": "f32"}}'),
    ("bad_state", '{"type": "start", "sample_rate": 16000}'),  # not the first message
]

# (transport, code, first messages) -> error, then the server closes (WebSocket close code)
CLOSING = [
    ("tcp", "invalid_utf8", [b"\xff\xfe\x00\x01binary\x00\n"]),
    ("tcp", "message_too_large", [b"x" * (MAX_MESSAGE + 10) + b"\n"]),
    ("tcp", "message_too_large", [b"y" * (MAX_MESSAGE + 10)]),  # no newline at all
    ("tcp", "bad_lookahead", ['{"type": "start", "lookahead": "3,3"}']),
    ("ws", "bad_lookahead", ['{"type": "config", "lookahead": [3, 3]}']),
    ("tcp", "invalid_config", ['{"type": "start", "sample_rate": 1}']),
    ("ws", "invalid_config", ['{"type": "start", "encoding": "mp3"}']),
]
WS_CLOSE = {"bad_lookahead": 1008, "invalid_config": 1008}


def assert_safe(message: dict) -> None:
    """Client-facing text never leaks internals."""
    text = message.get("message") or message.get("error") or ""
    assert "Traceback" not in text and ".py" not in text and not re.search(r"(/[\w.-]+){2,}", text), text


async def check_keep_open(address: str, code: str, line: str) -> None:
    async with Raw.open(address) as conn:
        if code == "bad_state":
            await conn.send({"type": "ping"})
            await conn.until("pong")
        await conn.send(line)
        await conn.send({"type": "ping"})
        seen = await conn.until("pong")
        errors = [m for m in seen if m["type"] == "error"]
        assert [e["code"] for e in errors] == [code], (line, seen)
        assert_safe(errors[0])


async def check_closing(address: str, code: str, lines: list) -> None:
    async with Raw.open(address) as conn:
        for line in lines:
            await conn.send(line)
        seen = await conn.rest()
        errors = [m for m in seen if m["type"] == "error"]
        assert [e["code"] for e in errors] == [code], (lines, seen)
        assert_safe(errors[0])
        if conn.ws is not None:
            assert conn.close_code == WS_CLOSE[code]


async def bad_inputs(ctx) -> None:
    for kind in ("tcp", "ws"):
        for code, line in KEEP_OPEN:
            await check_keep_open(url(ctx, kind), code, line)
    for kind, code, lines in CLOSING:
        await check_closing(url(ctx, kind), code, lines)
    await check_closing(url(ctx, "ws", "/?sample_rate=abc"), "invalid_config", [])
    await oversized_ws_message(ctx)
    await ws_text_not_utf8(ctx)
    await audio_after_close(ctx)
    await realtime_bad_events(ctx)


async def oversized_ws_message(ctx) -> None:
    async with Raw.open(url(ctx, "ws")) as conn:
        await conn.send("x" * (MAX_MESSAGE + 1))
        await conn.rest()
        assert conn.close_code == 1009


async def ws_text_not_utf8(ctx) -> None:
    """The WebSocket layer rejects a text frame that is not UTF-8 by dropping the connection."""
    ws = await BareWebSocket.connect(ctx.config.ports["ws"])
    await ws.stream.send_all(ws.raw_text_frame(b"\xff\xfe{}"))
    with trio.fail_after(5):
        while await ws.stream.receive_some(65536):
            pass
    await ws.drop()


async def audio_after_close(ctx) -> None:
    async with Raw.open(url(ctx, "tcp")) as conn:
        # in one write: sent apart, the final result may have ended the connection before the audio comes
        # (nothing left to refuse then), which a loaded machine showed once
        audio = audio_messages(np.zeros(1600, np.float32))[0]
        await conn.send(orjson.dumps({"type": "close"}).decode() + "\n" + orjson.dumps(audio).decode())
        seen = await conn.rest()
        assert [m["code"] for m in seen if m["type"] == "error"] == ["stream_closed"]
        assert seen[-1]["type"] == "result" and seen[-1]["is_final"]


async def realtime_bad_events(ctx) -> None:
    async with Raw.open(url(ctx, "ws", "/v1/realtime")) as conn:
        assert (await conn.recv())["type"] == "session.created"
        for event, code in [
            ('{"type": "response.dance"}', "unknown_event"),
            ('{"type": "input_audio_buffer.append", "audio": "@@"}', "invalid_audio"),
            ('{"type": "input_audio_buffer.append", "audio": "AA=="}', "invalid_audio"),
            ('{"type": "input_audio_buffer.append"}', "missing_field"),
            ('{"type": "input_audio_buffer.commit", "final": 1}', "invalid_field"),
            ("nope", "invalid_json"),
            (b"\x00\x01", "invalid_message"),
        ]:
            await conn.send(event)
            error = await conn.recv()
            assert error["type"] == "error" and error["code"] == code, (event, error)
            assert_safe(error)
        await conn.send('{"type": "input_audio_buffer.commit", "final": true}')
        await conn.until("transcription.done")  # the session is still usable


async def test_bad_inputs_documented_codes_while_a_good_stream_is_unaffected(engine, sentence, solo_tokens):
    async with running_server(engine, max_message_bytes=MAX_MESSAGE) as ctx:
        async with trio.open_nursery() as nursery:
            good = {}

            async def good_stream() -> None:
                good["results"] = await transcribe_raw(url(ctx, "tcp"), sentence, paced=0.03)

            nursery.start_soon(good_stream)
            await bad_inputs(ctx)
        assert result_tokens(good["results"]) == solo_tokens
        await trio.sleep(0.2)
        assert ctx.engine.stats()["active"] == ctx.engine.stats()["queued"] == 0


@pytest.mark.parametrize("path", ["/", "/v1/realtime"])
async def test_inference_error_ends_only_that_stream(engine, sentence, solo_tokens, path):
    poisoned = PoisonedEngine(engine)
    async with running_server(poisoned) as ctx, trio.open_nursery() as nursery:
        good = {}

        async def good_stream() -> None:
            good["results"] = await transcribe_raw(url(ctx, "tcp"), sentence, paced=0.01)

        poisoned.poison_next = True
        async with Raw.open(url(ctx, "ws", path)) as conn:
            await conn.recv()
            nursery.start_soon(good_stream)
            for message in audio_messages(sentence[:8000]):
                if path == "/v1/realtime":
                    message = {"type": "input_audio_buffer.append", "audio": message["data"]}
                await conn.send(message)
            seen = await conn.rest()
            assert [m.get("code") for m in seen if m["type"] == "error"] == ["inference_error"]
            assert conn.close_code == 1011
            if path == "/":
                assert seen[-1]["type"] == "result" and seen[-1]["is_final"] and seen[-1]["error"] == "inference_error"
    assert result_tokens(good["results"]) == solo_tokens


async def test_real_model_thread_exception_reaches_the_client(tiny_model_dir, sentence, monkeypatch):
    with ASREngine(tiny_model_dir, max_num_streams=2, max_queue=2) as fresh:
        calls = {"n": 0}
        decode = fresh.runner.decode

        def failing_once(chunks):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("simulated CUDA failure at /secret/path")
            return decode(chunks)

        monkeypatch.setattr(fresh.runner, "decode", failing_once)
        async with running_server(fresh) as ctx:
            async with Raw.open(url(ctx, "tcp")) as conn:
                for message in audio_messages(sentence):
                    await conn.send(message)
                seen = await conn.rest()
            errors = [m for m in seen if m["type"] == "error"]
            assert [e["code"] for e in errors] == ["inference_error"] and "secret" not in errors[0]["message"]
            assert seen[-1]["is_final"]
            after = await transcribe_raw(url(ctx, "tcp"), sentence)  # the server keeps serving
            assert after[-1]["is_final"] and result_tokens(after)
