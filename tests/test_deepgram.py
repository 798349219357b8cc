"""Deepgram live streaming on /v1/listen, driven by the official deepgram-sdk (sync client,
in a worker thread) against the in-process server on loopback."""
from __future__ import annotations

import asyncio
import json
import logging
import warnings
from urllib.parse import parse_qs

import numpy as np
import pytest
import soxr
import trio
from helpers import (
    Raw,
    hold_every_slot,
    refused_handshake,
    result_tokens,
    run_stream,
    running_server,
    transcribe_raw,
    url,
)

from parakeet_stream.client import encode_audio
from parakeet_stream.engine.phrases import check_phrases
from parakeet_stream.server.streams.wire import ALAW, MULAW

deepgram = pytest.importorskip("deepgram")
from deepgram import AsyncDeepgramClient, DeepgramClient  # noqa: E402
from deepgram.core.api_error import ApiError  # noqa: E402
from deepgram.environment import DeepgramClientEnvironment  # noqa: E402
from deepgram.listen.v1.types import (  # noqa: E402
    ListenV1Error,
    ListenV1Metadata,
    ListenV1Results,
    ListenV1SpeechStarted,
    ListenV1UtteranceEnd,
)

SDK_TYPES = {
    "Results": ListenV1Results,
    "Metadata": ListenV1Metadata,
    "UtteranceEnd": ListenV1UtteranceEnd,
    "SpeechStarted": ListenV1SpeechStarted,
    "Error": ListenV1Error,
}
CHUNK_SECONDS = 0.1


def client_for(ctx, key: str = "unused") -> DeepgramClient:
    """The SDK pointed at our WebSocket port by its environment only."""
    port = ctx.config.ports["ws"]
    env = DeepgramClientEnvironment(
        base=f"http://127.0.0.1:{port}",
        production=f"ws://127.0.0.1:{port}",
        agent=f"ws://127.0.0.1:{port}",
        agent_rest=f"http://127.0.0.1:{port}",
    )
    return DeepgramClient(api_key=key, environment=env)


def strict(message) -> dict:
    """Re-validate what the SDK parsed against its own type, strictly (required fields)."""
    kind = message.type
    assert type(message) is SDK_TYPES[kind], (kind, type(message))
    data = message.model_dump(exclude_unset=True)
    SDK_TYPES[kind].model_validate(data, strict=False)
    return data


def chunks(data: bytes, rate: int, width: int) -> list[bytes]:
    step = int(rate * CHUNK_SECONDS) * width
    return [data[i : i + step] for i in range(0, len(data), step)]


def run_sdk(ctx, script, key: str = "unused", **params) -> list[dict]:
    """Open a live connection with `params`, run `script(socket)`, then read every message
    until the server closes; returns them, each validated by the SDK's types."""
    params.setdefault("model", "nova-3")

    def worker() -> list[dict]:
        with client_for(ctx, key).listen.v1.connect(**params) as socket:
            script(socket)
            return [strict(m) for m in socket]

    return worker


async def in_thread(worker) -> list[dict]:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(worker)


def send_all_then_close(data: bytes, rate: int, width: int):
    def script(socket) -> None:
        for piece in chunks(data, rate, width):
            socket.send_media(piece)
        socket.send_close_stream()

    return script


async def async_connect(ctx, key: str) -> None:
    port = ctx.config.ports["ws"]
    env = DeepgramClientEnvironment(
        base=f"http://127.0.0.1:{port}", production=f"ws://127.0.0.1:{port}", agent="", agent_rest=""
    )
    client = AsyncDeepgramClient(api_key=key, environment=env)
    async with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000) as socket:
        await socket.send_close_stream()


def finals(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["type"] == "Results" and m["is_final"]]


def transcript(messages: list[dict]) -> str:
    return " ".join(t for m in finals(messages) if (t := m["channel"]["alternatives"][0]["transcript"]))


async def native_text(ctx, samples: np.ndarray) -> tuple[str, list[int]]:
    results = await transcribe_raw(url(ctx, "ws"), samples)
    return results[-1]["text"], result_tokens(results)


async def test_sdk_transcript_matches_native(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    async with running_server(engine) as ctx:
        text, _ = await native_text(ctx, sentence)
        worker = run_sdk(
            ctx, send_all_then_close(pcm, 16000, 2), encoding="linear16", sample_rate=16000, interim_results="true"
        )
        messages = await in_thread(worker)
    assert text.strip()
    assert transcript(messages) == " ".join(text.split())
    assert messages[-1]["type"] == "Metadata"
    metadata = messages[-1]
    assert metadata["channels"] == 1 and metadata["request_id"] and metadata["created"]
    assert metadata["duration"] == pytest.approx(len(sentence) / 16000, abs=0.01)
    results = [m for m in messages if m["type"] == "Results"]
    assert any(not m["is_final"] for m in results)  # interim results were asked for
    assert all(m["metadata"]["request_id"] == metadata["request_id"] for m in results)
    # words: in order, inside the audio, and spelling the transcript
    words = [w for m in finals(messages) for w in m["channel"]["alternatives"][0]["words"]]
    assert " ".join(w["word"] for w in words) == transcript(messages)
    times = [t for w in words for t in (w["start"], w["end"])]
    assert times == sorted(times)
    assert 0 <= times[0] and times[-1] <= len(sentence) / 16000 + 1e-3
    for m in finals(messages):
        m_words = m["channel"]["alternatives"][0]["words"]
        assert all(m["start"] <= w["start"] for w in m_words)
        assert all(w["end"] <= m["start"] + m["duration"] + 1e-3 for w in m_words)
    # confidence: the model's (server/streams/words.py), per word in (0, 1], an alternative's their mean
    assert all(0 < w["confidence"] <= 1 for w in words) and min(w["confidence"] for w in words) < 1
    for m in finals(messages):
        alternative = m["channel"]["alternatives"][0]
        mean = sum(w["confidence"] for w in alternative["words"]) / max(1, len(alternative["words"]))
        assert alternative["confidence"] == pytest.approx(mean, abs=1e-3)


# what the frameworks' Deepgram services put on every connection (their defaults): LiveKit
# Agents 1.8's deepgram.STT (with a keyterm) and Pipecat 1.14's DeepgramSTTService
FRAMEWORK_QUERIES = {
    "livekit": (
        "model=nova-3&punctuate=true&smart_format=false&no_delay=true&interim_results=true&encoding=linear16"
        "&vad_events=true&sample_rate=16000&channels=1&endpointing=25&filler_words=true&profanity_filter=false"
        "&numerals=false&mip_opt_out=false&language=en-US&keyterm=parakeet"
    ),
    "pipecat": (
        "channels=1&detect_entities=false&diarize=false&dictation=false&encoding=linear16&interim_results=true"
        "&language=en&model=nova-3-general&multichannel=false&numerals=false&punctuate=true&sample_rate=16000"
        "&smart_format=false"
    ),
    # labels and hints Deepgram has, features turned off, and names we do not know (a newer
    # framework's default, a custom add-on parameter): accepted, the unknown ones logged
    "tuning_and_unknown": (
        "encoding=linear16&sample_rate=16000&extra=team:a&tag=t&language_hint=en&diarize_version=2"
        "&callback_method=post&redact=false&search=false&sentiment=false&detect_entities=false"
        "&a_future_default=1&alternatives=2"
    ),
}


@pytest.mark.parametrize("query", FRAMEWORK_QUERIES.values(), ids=FRAMEWORK_QUERIES)
async def test_framework_plugin_defaults_are_accepted(engine, sentence, query, caplog):
    """A framework's full default query (formatting, billing, hints) is accepted and served: the
    transcript is the engine's own, with the query's key terms boosted where it has some."""
    from websockets.sync.client import connect

    pcm = encode_audio(sentence, "pcm16")
    keyterms = parse_qs(query).get("keyterm", [])
    async with running_server(engine) as ctx:
        if keyterms:
            text = "".join(r.text for r in run_stream(engine, sentence, phrases=check_phrases(keyterms)))
        else:
            text, _ = await native_text(ctx, sentence)
        address = f"ws://127.0.0.1:{ctx.config.ports['ws']}/v1/listen?{query}"

        def framework_like() -> list[dict]:
            with connect(address, additional_headers={"Authorization": "Token unused"}) as ws:
                for piece in chunks(pcm, 16000, 2):
                    ws.send(piece)
                ws.send('{"type": "CloseStream"}')
                return [json.loads(m) for m in ws]

        with caplog.at_level(logging.INFO, logger="parakeet_stream.server.protocols.deepgram"):
            messages = await in_thread(framework_like)
    assert messages[-1]["type"] == "Metadata"
    assert transcript(messages) == " ".join(text.split())
    unknown = [r.getMessage() for r in caplog.records if "unknown query parameter" in r.getMessage()]
    logged = "/v1/listen: unknown query parameter(s) accepted and ignored: ['a_future_default', 'alternatives']"
    assert unknown == ([logged] if "a_future_default" in query else [])


async def test_finalize_flushes(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    half = len(pcm) // 2 // 2 * 2

    def script(socket) -> None:
        for piece in chunks(pcm[:half], 16000, 2):
            socket.send_media(piece)
        socket.send_finalize()
        while True:  # the flushed final comes before we go on
            message = socket.recv()
            seen.append(strict(message))
            if message.type == "Results" and message.from_finalize:
                break
        for piece in chunks(pcm[half:], 16000, 2):
            socket.send_media(piece)
        socket.send_close_stream()

    seen: list[dict] = []
    async with running_server(engine) as ctx:
        messages = await in_thread(run_sdk(ctx, script, encoding="linear16", sample_rate=16000))
    messages = seen + messages
    flushed = [m for m in messages if m["type"] == "Results" and m.get("from_finalize")]
    assert len(flushed) == 1 and flushed[0]["is_final"]
    assert flushed[0]["start"] + flushed[0]["duration"] == pytest.approx(half / 2 / 16000, abs=0.01)
    later = finals(messages)[-1]
    assert later is not flushed[0] and later["start"] >= flushed[0]["start"]
    assert messages[-1]["type"] == "Metadata"
    assert messages[-1]["duration"] == pytest.approx(len(sentence) / 16000, abs=0.01)


async def test_finalize_is_answered_once_all_the_audio_before_it_is_transcribed(engine, sentence):
    """The sentence's utterance ends (speech_final) after the Finalize was read: that Results is
    not the answer; the answer comes at the end of the audio, and a client that closes on it
    has lost nothing."""
    pcm = encode_audio(sentence, "pcm16")
    async with running_server(engine) as ctx:
        async with Raw.open(url(ctx, "ws", "/v1/listen?encoding=linear16&sample_rate=16000")) as conn:
            await conn.send(pcm)
            await conn.send({"type": "Finalize"})
            seen = await conn.until("Results", from_finalize=True)
    answer = seen[-1]
    ended = [m for m in seen if m["type"] == "Results" and m["speech_final"]]
    assert ended and not any(m["from_finalize"] for m in ended)  # the utterance's end came first
    assert answer["is_final"] and audio_end(answer) == pytest.approx(len(sentence) / 16000, abs=0.01)


async def test_audio_and_finalize_sent_while_a_segment_drains_wait_for_the_next(engine, sentence):
    """Two Finalize-terminated pieces sent without waiting: the second piece's audio, and its
    Finalize, wait while the first segment drains; times count from the connection."""
    pcm = encode_audio(sentence, "pcm16")

    def script(socket) -> None:
        for _ in range(2):
            for piece in chunks(pcm, 16000, 2):
                socket.send_media(piece)
            socket.send_finalize()
        socket.send_close_stream()

    async with running_server(engine) as ctx:
        text, _ = await native_text(ctx, sentence)
        messages = await in_thread(run_sdk(ctx, script, encoding="linear16", sample_rate=16000))
    flushed = [m for m in messages if m["type"] == "Results" and m.get("from_finalize")]
    seconds = len(sentence) / 16000
    assert [audio_end(m) for m in flushed] == pytest.approx([seconds, 2 * seconds], abs=0.01)
    spoken = [m for m in finals(messages) if m["channel"]["alternatives"][0]["transcript"]]
    assert len(spoken) == 2 and audio_end(spoken[0]) <= round(seconds, 3) < spoken[1]["start"]
    assert transcript(messages) == f"{text.strip()} {text.strip()}"
    assert messages[-1]["type"] == "Metadata" and messages[-1]["duration"] == pytest.approx(2 * seconds, abs=0.01)


async def test_keepalive_holds_an_idle_connection(engine, sentence):
    pcm = encode_audio(sentence[:16000], "pcm16")

    def script(socket) -> None:
        import time

        for _ in range(8):  # 2.4 s of silence from the client, idle timeout 1 s
            socket.send_keep_alive()
            time.sleep(0.3)
        socket.send_media(pcm)
        socket.send_close_stream()

    async with running_server(engine, idle_timeout=1.0) as ctx:
        messages = await in_thread(run_sdk(ctx, script, encoding="linear16", sample_rate=16000))
        # without KeepAlive the same connection is closed by the idle timeout
        start = trio.current_time()
        idle = await in_thread(run_sdk(ctx, lambda socket: None, encoding="linear16", sample_rate=16000))
        assert trio.current_time() - start < 5
    assert messages[-1]["type"] == "Metadata" and messages[-1]["duration"] == pytest.approx(1.0, abs=0.01)
    assert [m["type"] for m in idle] == ["Error"] and idle[0]["variant"] == "idle_timeout"


def audio_end(message: dict) -> float:
    return message["start"] + message["duration"]


async def test_vad_and_utterance_end_events(engine, wavs):
    samples = wavs["pause"]
    pcm = encode_audio(samples, "pcm16")
    async with running_server(engine) as ctx:
        worker = run_sdk(
            ctx, send_all_then_close(pcm, 16000, 2), encoding="linear16", sample_rate=16000,
            vad_events="true", interim_results="true", utterance_end_ms="1000",
        )
        messages = await in_thread(worker)
    kinds = [m["type"] for m in messages]
    assert kinds[-1] == "Metadata"
    finals_at = [i for i, m in enumerate(messages) if m["type"] == "Results" and m["is_final"]]
    assert len(finals_at) >= 2  # the pause ends an utterance: several speech_final segments
    previous_end = 0.0
    for i in finals_at:  # SpeechStarted before each segment (interim results in between)
        words = messages[i]["channel"]["alternatives"][0]["words"]
        assert messages[i]["speech_final"] or i == finals_at[-1]
        started = [m for m in messages[:i] if m["type"] == "SpeechStarted"][-1]
        assert previous_end <= started["timestamp"] == words[0]["start"]
        previous_end = words[-1]["end"]
    # UtteranceEnd: after a gap of 1 s without words following a final (or at the end of the
    # audio), naming that final's last word; never while words are still coming
    ends = [i for i, kind in enumerate(kinds) if kind == "UtteranceEnd"]
    assert ends and ends[-1] == len(messages) - 2  # the last one closes the audio
    for i in ends:
        last_final = max(f for f in finals_at if f < i)
        last_word_end = messages[last_final]["channel"]["alternatives"][0]["words"][-1]["end"]
        assert messages[i]["last_word_end"] == last_word_end
        later = [m for m in messages[i:] if m["type"] == "Results"]
        assert all(audio_end(m) >= last_word_end + 1.0 - 1e-3 for m in later)
    for f, nxt in zip(finals_at, finals_at[1:]):  # a gap of >= 1 s between segments is announced
        gap_start = messages[f]["channel"]["alternatives"][0]["words"][-1]["end"]
        next_word = messages[nxt]["channel"]["alternatives"][0]["words"][0]["start"]
        assert (next_word - gap_start >= 1.0) == any(f < i < nxt for i in ends)


async def test_endpointing_false_never_speech_final(engine, wavs):
    """Segments end at the model's <EOU> whatever `endpointing` says; `endpointing=false` keeps
    them but never marks one speech_final."""
    pcm = encode_audio(wavs["pause"], "pcm16")
    runs = {}
    async with running_server(engine) as ctx:
        for value in ("300", "false", None):
            params = {} if value is None else {"endpointing": value}
            worker = run_sdk(ctx, send_all_then_close(pcm, 16000, 2), encoding="linear16", sample_rate=16000, **params)
            runs[value] = finals(await in_thread(worker))
    assert transcript(runs["300"]) == transcript(runs[None]) == transcript(runs["false"])
    assert [m["speech_final"] for m in runs["300"]] == [m["speech_final"] for m in runs[None]]
    assert any(m["speech_final"] for m in runs[None]) and not any(m["speech_final"] for m in runs["false"])


async def test_wrong_key_is_an_auth_error(engine, sentence):
    pcm = encode_audio(sentence[:8000], "pcm16")
    from websockets.exceptions import InvalidStatus

    async with running_server(engine, api_key="secret") as ctx:
        # the sync client lets websockets' own error through (the SDK maps only the legacy one)
        with pytest.raises(InvalidStatus) as info:
            await in_thread(run_sdk(ctx, lambda s: None, key="wrong", encoding="linear16", sample_rate=16000))
        assert info.value.response.status_code == 401
        # the asyncio client maps it to the SDK's ApiError
        with pytest.raises(ApiError) as api_info:
            await in_thread(lambda: asyncio.run(async_connect(ctx, "wrong")))
        assert api_info.value.status_code == 401
        good = await in_thread(
            run_sdk(ctx, send_all_then_close(pcm, 16000, 2), key="secret", encoding="linear16", sample_rate=16000)
        )
        assert good[-1]["type"] == "Metadata"
        # the browser form: Sec-WebSocket-Protocol "token, KEY"
        from websockets.sync.client import connect

        port = ctx.config.ports["ws"]

        def browser() -> str:
            address = f"ws://127.0.0.1:{port}/v1/listen?encoding=linear16&sample_rate=16000"
            with connect(address, subprotocols=["token", "secret"]) as ws:
                ws.send('{"type": "CloseStream"}')
                return ws.subprotocol, ws.recv()

        subprotocol, last = await in_thread(browser)
    assert subprotocol == "token" and '"Metadata"' in last


@pytest.mark.parametrize(
    "query",
    ["encoding=opus&sample_rate=16000", "encoding=linear16&sample_rate=16000&channels=2",
     "encoding=linear16&sample_rate=16000&diarize=true", "encoding=linear16",
     "encoding=linear16&sample_rate=16000&no_delay=true&summarize=v2",
     # features that, ignored, would silently give something else than asked for
     *(f"encoding=linear16&sample_rate=16000&{feature}" for feature in (
         "multichannel=true", "diarize_model=latest", "detect_entities=true", "redact=pci", "search=fox",
         "replace=fox:cat", "callback=https://example.com/cb", "detect_language=true"))],
)
async def test_unsupported_parameters_are_refused(engine, query):
    async with running_server(engine) as ctx:
        response = await refused_handshake(f"ws://127.0.0.1:{ctx.config.ports['ws']}/v1/listen?{query}")
    assert response.status_code == 400
    assert b"INVALID_QUERY_PARAMETER" in response.body and b"err_msg" in response.body
    body = json.loads(response.body)
    assert set(body) == {"err_code", "err_msg", "request_id"}
    last = query.rsplit("&", 1)[-1].split("=")[0]
    assert last == "sample_rate" or last in body["err_msg"]  # it names what it refuses


def g711_table_encode(samples: np.ndarray, table: np.ndarray) -> bytes:
    """Encode by the nearest code (what a G.711 encoder does, up to rounding at the edges)."""
    order = np.argsort(table)
    sorted_values = table[order]
    idx = np.clip(np.searchsorted(sorted_values, samples), 1, len(table) - 1)
    left, right = sorted_values[idx - 1], sorted_values[idx]
    nearest = np.where(samples - left < right - samples, idx - 1, idx)
    return order[nearest].astype(np.uint8).tobytes()


def test_g711_tables_match_the_standard():
    """The decoding tables equal the standard library's G.711 decoder (Python < 3.13)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    codes = bytes(range(256))
    assert np.array_equal(np.frombuffer(audioop.ulaw2lin(codes, 2), "<i2") / 32768.0, MULAW)
    assert np.array_equal(np.frombuffer(audioop.alaw2lin(codes, 2), "<i2") / 32768.0, ALAW)


@pytest.mark.parametrize("encoding,table", [("mulaw", MULAW), ("alaw", ALAW)])
async def test_telephony_audio_gives_the_tokens_of_its_pcm16(engine, sentence, encoding, table):
    phone = soxr.resample(sentence, 16000, 8000).astype(np.float32)
    coded = g711_table_encode(phone, table)
    linear = encode_audio(table[np.frombuffer(coded, np.uint8)], "pcm16")  # the same samples, as PCM16
    async with running_server(engine) as ctx:
        reference = await in_thread(
            run_sdk(ctx, send_all_then_close(linear, 8000, 2), encoding="linear16", sample_rate=8000)
        )
        telephony = await in_thread(
            run_sdk(ctx, send_all_then_close(coded, 8000, 1), encoding=encoding, sample_rate=8000)
        )
    assert transcript(reference).strip()
    assert transcript(telephony) == transcript(reference)
    words = lambda ms: [w for m in finals(ms) for w in m["channel"]["alternatives"][0]["words"]]  # noqa: E731
    assert words(telephony) == words(reference)


async def test_unknown_messages_get_a_deepgram_error_and_the_stream_goes_on(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")

    def script(socket) -> None:
        socket._send({"type": "Configure", "features": {}})  # a message we do not support
        socket._send("not json")
        for piece in chunks(pcm, 16000, 2):
            socket.send_media(piece)
        socket.send_close_stream()

    async with running_server(engine) as ctx:
        text, _ = await native_text(ctx, sentence)
        messages = await in_thread(run_sdk(ctx, script, encoding="linear16", sample_rate=16000))
    errors = [m for m in messages if m["type"] == "Error"]
    assert [e["variant"] for e in errors] == ["unknown_type", "invalid_json"]
    assert all(e["description"] for e in errors)
    assert transcript(messages) == " ".join(text.split()) and messages[-1]["type"] == "Metadata"


@pytest.mark.parametrize("encoding,table", [("mulaw", MULAW), ("alaw", ALAW)])
async def test_native_protocol_takes_telephony_audio(engine, sentence, encoding, table):
    """G.711 is not Deepgram's alone: the native protocol declares it like any encoding."""
    from helpers import Raw

    phone = soxr.resample(sentence, 16000, 8000).astype(np.float32)
    coded = g711_table_encode(phone, table)
    decoded = table[np.frombuffer(coded, np.uint8)]
    linear = encode_audio(decoded, "pcm16")  # the same samples as PCM16 (G.711 values are exact in it)

    async def tokens(address: str, data: bytes, step: int) -> list[int]:
        async with Raw.open(address) as conn:
            for i in range(0, len(data), step):
                await conn.send(data[i : i + step])
            await conn.send({"type": "close"})
            return result_tokens([m for m in await conn.until("result", is_final=True) if m["type"] == "result"])

    async with running_server(engine) as ctx:
        reference = await tokens(url(ctx, "ws", "/?encoding=pcm16&sample_rate=8000"), linear, 1600)
        telephony = await tokens(url(ctx, "ws", f"/?encoding={encoding}&sample_rate=8000"), coded, 800)
    assert reference and telephony == reference


async def test_queued_client_gets_only_deepgram_messages(engine, sentence):
    """While every slot is busy the native `queued` message is not sent on /v1/listen."""
    pcm = encode_audio(sentence, "pcm16")
    box: dict = {}
    release = trio.Event()

    async def deepgram_client(ctx) -> None:
        worker = run_sdk(ctx, send_all_then_close(pcm, 16000, 2), encoding="linear16", sample_rate=16000)
        box["messages"] = await in_thread(worker)

    async with running_server(engine) as ctx:
        text, _ = await native_text(ctx, sentence)
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_every_slot, ctx, release)
            nursery.start_soon(deepgram_client, ctx)
            await trio.sleep(0.5)
            assert "messages" not in box  # still waiting for a slot
            release.set()  # the slots free up
    assert [m["type"] for m in box["messages"]][-1] == "Metadata"  # every message was an SDK type
    assert transcript(box["messages"]) == " ".join(text.split())
