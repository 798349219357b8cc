"""OpenAI's file transcription API, POST /v1/audio/transcriptions on the HTTP port: the official
openai SDK (sync client, in a worker thread) against the in-process server, and bare HTTP for the
uploads no SDK would send."""
from __future__ import annotations

import base64
import http.client
import logging

import numpy as np
import pytest
import soxr
import srt
import trio
import webvtt
from helpers import (
    PACKET,
    Answer,
    audio_file,
    head,
    hold_every_slot,
    multipart,
    openai_error,
    post,
    Raw,
    read_answer,
    running_server,
    url,
    wait_until,
)
from parakeet_stream.client import encode_audio

openai = pytest.importorskip("openai")

PATH = "/v1/audio/transcriptions"
FORM = "multipart/form-data; boundary=b0undary"


def client_for(ctx, key: str = "unused"):
    """The SDK pointed at our HTTP port by its base URL only."""
    return openai.OpenAI(base_url=f"http://127.0.0.1:{ctx.config.ports['http']}/v1", api_key=key, max_retries=0)


async def create(ctx, data: bytes, key: str = "unused", **params):
    """client.audio.transcriptions.create(file=..., model=..., **params), in a worker thread."""

    def call():
        result = client_for(ctx, key).audio.transcriptions.create(file=("audio.wav", data), model="whisper-1", **params)
        return list(result) if params.get("stream") else result

    with trio.fail_after(60):
        return await trio.to_thread.run_sync(call)


async def native_text(ctx, samples: np.ndarray, rate: int = 16000) -> str:
    """What the streaming path (native protocol over WebSocket, float32 packets) transcribes."""
    async with Raw.open(url(ctx, "ws", f"/?sample_rate={rate}&encoding=f32")) as conn:
        await conn.until("hello")
        for i in range(0, len(samples), PACKET):
            data = base64.b64encode(encode_audio(samples[i : i + PACKET], "f32")).decode()
            await conn.send({"type": "audio", "data": data, "final": False})
        await conn.send({"type": "audio", "data": "", "final": True})
        return (await conn.until("result", is_final=True))[-1]["text"].strip()


def spelled_in_order(words: list, text: str, duration: float) -> None:
    """Word times that spell the text, in order, inside the audio."""
    assert " ".join(w.word for w in words) == text
    assert all(0 <= w.start <= w.end <= duration + 1e-6 for w in words)
    assert all(a.end <= b.start + 1e-6 for a, b in zip(words, words[1:]))


async def test_sdk_json_verbose_json_and_text_match_the_streaming_path(engine, sentence):
    wav = audio_file(sentence)
    duration = len(sentence) / 16000
    async with running_server(engine) as ctx:
        native = await native_text(ctx, sentence)
        plain = await create(ctx, wav)
        verbose = await create(ctx, wav, response_format="verbose_json", timestamp_granularities=["word", "segment"])
        segments_only = await create(ctx, wav, response_format="verbose_json", language="en", prompt="hello")
        text = await create(ctx, wav, response_format="text")
    assert native and plain.text == native
    assert plain.usage.type == "duration" and plain.usage.seconds == pytest.approx(duration, abs=0.01)
    assert verbose.text == native and verbose.duration == pytest.approx(duration, abs=0.01)
    spelled_in_order(verbose.words, native, duration)
    assert " ".join(s.text for s in verbose.segments) == native
    assert verbose.segments[0].start == verbose.words[0].start and verbose.segments[-1].end == verbose.words[-1].end
    assert segments_only.segments and segments_only.words is None  # the default granularity
    assert text == native + "\n"


async def test_sdk_stream_sends_deltas_then_done(engine, sentence):
    async with running_server(engine) as ctx:
        native = await native_text(ctx, sentence)
        events = await create(ctx, audio_file(sentence), stream=True)
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) > 1 and events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in deltas).strip() == events[-1].text == native


async def test_a_file_longer_than_the_backlog_budget_is_fed_in_turns(engine, sentence):
    """A 2 s budget and 10.5 s of audio: the feeder waits for the engine again and again, and the
    text is still the streaming path's."""
    audio = np.tile(sentence, 3)
    async with running_server(engine, max_backlog_seconds=2.0) as ctx:
        native = await native_text(ctx, audio)
        verbose = await create(ctx, audio_file(audio), response_format="verbose_json", timestamp_granularities=["word"])
    assert verbose.text == native and verbose.duration == pytest.approx(len(audio) / 16000, abs=0.01)
    assert verbose.words[-1].end > 7.0


async def test_srt_and_vtt_load_in_subtitle_parsers_and_cover_the_words(engine, sentence):
    wav = audio_file(sentence)
    async with running_server(engine) as ctx:
        verbose = await create(ctx, wav, response_format="verbose_json", timestamp_granularities=["word"])
        srt_text = await create(ctx, wav, response_format="srt")
        vtt_text = await create(ctx, wav, response_format="vtt")
    cues = list(srt.parse(srt_text))
    assert " ".join(c.content.replace("\n", " ") for c in cues) == verbose.text
    assert all(c.start <= c.end for c in cues) and all(a.end <= b.start for a, b in zip(cues, cues[1:]))
    assert cues[0].start.total_seconds() == verbose.words[0].start
    assert cues[-1].end.total_seconds() == verbose.words[-1].end
    assert all(len(line) <= 42 for c in cues for line in c.content.split("\n"))
    captions = webvtt.WebVTT.from_string(vtt_text, strict=True).captions
    assert [c.text for c in captions] == [c.content for c in cues]
    assert [(c.start, c.end) for c in captions] == [(_vtt(c.start), _vtt(c.end)) for c in cues]


def _vtt(delta) -> str:
    ms = round(delta.total_seconds() * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


async def test_containers_rates_and_channels(engine, sentence):
    """FLAC and WAV in any rate or channel count give the streaming path's text for the same
    audio; lossy Ogg (Vorbis, Opus) and MP3 decode to the right length."""
    rate = 44100
    resampled = soxr.resample(sentence, 16000, rate).astype(np.float32)
    duration = len(sentence) / 16000
    async with running_server(engine) as ctx:
        native = await native_text(ctx, sentence)
        native_44k = await native_text(ctx, resampled, rate)
        flac = await create(ctx, audio_file(sentence, fmt="FLAC"))
        stereo = await create(ctx, audio_file(resampled, rate, subtype="FLOAT", channels=2))
        lossy = {  # (Opus has no 16 kHz mode: 48 kHz)
            subtype: await create(ctx, audio_file(soxr.resample(sentence, 16000, rate), rate, fmt, subtype),
                                  response_format="verbose_json")
            for fmt, subtype, rate in [("OGG", "VORBIS", 16000), ("OGG", "OPUS", 48000), ("MP3", "MPEG_LAYER_III", 16000)]
        }
    assert flac.text == native
    assert stereo.text == native_44k
    for subtype, result in lossy.items():
        assert result.duration == pytest.approx(duration, abs=0.1), subtype


async def test_m4a_and_webm_are_refused_by_name(engine):
    async with running_server(engine) as ctx:
        port = ctx.config.ports["http"]
        m4a = await post(port, PATH, multipart({"model": "x"}, b"\0\0\0\x20ftypM4A \0\0\0\0" + b"\0" * 400), FORM)
        webm = await post(port, PATH, multipart({"model": "x"}, b"\x1aE\xdf\xa3" + b"\0" * 400), FORM)
    assert "MP4/M4A (AAC) audio is not supported" in openai_error(m4a, 400, "invalid_audio")["message"]
    assert openai_error(webm, 400, "invalid_audio")["param"] == "file"


@pytest.mark.parametrize("fields, code, param", [
    ({"response_format": "diarized_json"}, "diarization_unavailable", "response_format"),  # no --diarizer here
    ({"timestamp_granularities[]": "sentence"}, "invalid_value", "timestamp_granularities[]"),
    ({"stream": "yes"}, "invalid_value", "stream"),
    ({"stream": "true", "response_format": "srt"}, "invalid_value", "response_format"),
    ({"best_of": "3"}, "unknown_parameter", "best_of"),
])
async def test_bad_parameters_name_the_field(engine, sentence, fields, code, param):
    async with running_server(engine) as ctx:
        answer = await post(ctx.config.ports["http"], PATH, multipart(fields, audio_file(sentence[:1600])), FORM)
    assert openai_error(answer, 400, code)["param"] == param


async def test_bad_uploads_get_clear_errors(engine, sentence):
    wav = audio_file(sentence)
    body = multipart({"model": "whisper-1"}, wav)
    async with running_server(engine) as ctx:
        port = ctx.config.ports["http"]
        not_audio = await post(port, PATH, multipart({}, b"this is not audio at all" * 40), FORM)
        empty = await post(port, PATH, multipart({}, b""), FORM)
        no_file = await post(port, PATH, multipart({"model": "x"}, None), FORM)
        wrong_boundary = await post(port, PATH, body, "multipart/form-data; boundary=other")
        not_a_form = await post(port, PATH, wav, "audio/wav")
        unclosed = await post(port, PATH, body[: len(body) - 20], FORM)
        truncated = await _truncated(port, body)
    assert "not an audio file" in openai_error(not_audio, 400, "invalid_audio")["message"]
    assert openai_error(empty, 400, "invalid_audio")["message"] == "the file is empty"
    assert openai_error(no_file, 400, "missing_required_parameter")["param"] == "file"
    assert "boundary" in openai_error(wrong_boundary, 400, "invalid_multipart")["message"]
    assert "multipart/form-data" in openai_error(not_a_form, 400, "invalid_request")["message"]
    assert "closing boundary" in openai_error(unclosed, 400, "invalid_multipart")["message"]
    assert "ended early" in openai_error(truncated, 400, "bad_request")["message"]


async def _truncated(port: int, body: bytes) -> Answer:
    """Content-Length promises the whole body; half of it comes, then the client's end of stream."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head(PATH, {"Content-Type": FORM, "Content-Length": str(len(body))}) + body[: len(body) // 2])
        await stream.send_eof()
        return await read_answer(stream)


async def test_size_limits_answer_413_before_reading_or_at_the_limit(engine, sentence):
    async with running_server(engine, max_upload_bytes=256 * 1024, max_upload_seconds=2.0) as ctx:
        port = ctx.config.ports["http"]
        with trio.fail_after(2):  # answered from the head alone: no byte of the 2 GB is sent
            huge = await _declared(port, 2 * 1024**3)
        endless = await _endless_chunked(port)
        too_long = await post(port, PATH, multipart({}, audio_file(sentence)), FORM)
        with pytest.raises(openai.APIStatusError) as sdk:
            await create(ctx, audio_file(np.tile(sentence, 10)))
    assert "larger than 0.25 MB" in openai_error(huge, 413, "file_too_large")["message"]
    openai_error(endless, 413, "file_too_large")
    assert "at most 2 s" in openai_error(too_long, 413, "audio_too_long")["message"]
    assert sdk.value.status_code == 413 and sdk.value.body["code"] == "file_too_large"


async def _declared(port: int, length: int) -> Answer:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head(PATH, {"Content-Type": FORM, "Content-Length": str(length), "Expect": "100-continue"}))
        return await read_answer(stream)


async def _endless_chunked(port: int) -> Answer:
    """A chunked body whose file part never ends: sent until the server answers."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    start = multipart({}, b"")[:-len("\r\n--b0undary--\r\n")]
    chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    async with stream:
        await stream.send_all(head(PATH, {"Content-Type": FORM, "Transfer-Encoding": "chunked"})
                              + b"%x\r\n%s\r\n" % (len(start), start))
        async with trio.open_nursery() as nursery:

            async def send_forever() -> None:
                try:
                    while True:
                        await stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            nursery.start_soon(send_forever)
            answer = await read_answer(stream)
            nursery.cancel_scope.cancel()
        return answer


async def test_api_key_is_required_when_configured(engine, sentence):
    wav = audio_file(sentence[:8000])
    async with running_server(engine, api_key="s3cret") as ctx:
        with pytest.raises(openai.AuthenticationError) as refused:
            await create(ctx, wav, key="wrong")
        accepted = await create(ctx, wav, key="s3cret")
    assert refused.value.status_code == 401 and refused.value.body["code"] == "unauthorized"
    assert isinstance(accepted.text, str)


async def test_uploads_beyond_the_limit_get_429_and_the_server_keeps_serving(engine, sentence):
    """Two uploads hold the two places (their bodies never finish); 60 more at once are refused
    at once with 429 and Retry-After; once the two go away, uploads work again."""
    wav = audio_file(sentence)
    body = multipart({}, wav)
    async with running_server(engine, max_uploads=2) as ctx:
        port = ctx.config.ports["http"]
        holders = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        for holder in holders:
            await holder.send_all(head(PATH, {"Content-Type": FORM, "Content-Length": str(len(body))}) + body[:1000])
        await wait_until(lambda: ctx.open_uploads == 2)
        answers = []

        async def one() -> None:
            answers.append(await post(port, PATH, body, FORM))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(60):
                    nursery.start_soon(one)
        for holder in holders:
            await holder.aclose()
        await wait_until(lambda: ctx.open_uploads == 0)
        after = await create(ctx, wav)
    assert len(answers) == 60
    for answer in answers:
        assert openai_error(answer, 429, "too_many_uploads")["type"] == "requests"
        assert answer.headers["retry-after"] == "1"
    assert after.text


async def test_a_full_engine_queue_gets_503_and_a_queued_upload_waits_its_turn(engine, sentence):
    """Every slot busy and every queue place taken: 503 queue_full. With a queue place free, the
    upload waits in the queue (pushing nothing) and is transcribed once a slot frees."""
    wav = audio_file(sentence)
    async with running_server(engine) as ctx, trio.open_nursery() as nursery:
        native = await native_text(ctx, sentence)
        release = trio.Event()
        await nursery.start(hold_every_slot, ctx, release)
        async with trio.open_nursery() as queue:
            for _ in range(engine.stats()["max_queue"]):
                await queue.start(_hold_open, url(ctx, "tcp"))
            await wait_until(lambda: engine.stats()["queued"] == engine.stats()["max_queue"])
            full = await post(ctx.config.ports["http"], PATH, multipart({}, wav), FORM)
            queue.cancel_scope.cancel()
        await wait_until(lambda: engine.stats()["queued"] == 0)
        box = {}

        async def upload() -> None:
            box["result"] = await create(ctx, wav)

        nursery.start_soon(upload)
        await wait_until(lambda: engine.stats()["queued"] == 1)
        await trio.sleep(0.2)
        assert "result" not in box
        release.set()
    assert openai_error(full, 503, "queue_full")["type"] == "server_error" and full.headers["retry-after"] == "1"
    assert box["result"].text == native


async def _hold_open(address: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with Raw.open(address):
        task_status.started()
        await trio.sleep_forever()


async def test_health_stays_fast_while_a_large_upload_is_received_and_parsed(engine):
    """A 60 MB multipart upload (31 minutes of audio) is received, parsed and its header decoded
    while another connection polls /health: every answer within 0.5 s."""
    noise = np.random.default_rng(0).uniform(-0.1, 0.1, 16000 * 1890).astype(np.float32)
    body = multipart({"model": "whisper-1"}, audio_file(noise))
    latencies = []
    async with running_server(engine, max_upload_seconds=60.0) as ctx:
        port = ctx.config.ports["http"]

        async def poll(done: trio.Event) -> None:
            while not done.is_set():
                start = trio.current_time()
                with trio.fail_after(5):
                    answer = await get_status(port, "/health")
                latencies.append(trio.current_time() - start)
                assert answer == 200
                await trio.sleep(0.01)

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll, done)
            answer = await post(port, PATH, body, FORM)
            done.set()
    openai_error(answer, 413, "audio_too_long")
    assert len(latencies) >= 3 and max(latencies) < 0.5, (len(latencies), max(latencies))


async def get_status(port: int, path: str) -> int:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return (await read_answer(stream)).status


async def test_a_client_that_leaves_frees_its_stream(engine, sentence):
    """The client closes its connection while its file is transcribed: the engine stream goes."""
    body = multipart({}, audio_file(np.tile(sentence, 20)))
    async with running_server(engine) as ctx:
        stream = await trio.open_tcp_stream("127.0.0.1", ctx.config.ports["http"])
        await stream.send_all(head(PATH, {"Content-Type": FORM, "Content-Length": str(len(body))}) + body)
        await wait_until(lambda: engine.stats()["active"] == 1)
        await stream.aclose()
        await wait_until(lambda: engine.stats()["active"] == 0 and ctx.open_uploads == 0)


async def test_a_client_that_closes_once_it_has_the_answer_is_logged_completed(engine, sentence, caplog):
    """Like curl: the client reads the whole answer (Content-Length) and closes at once, which can
    reach the server before it has finished with the answer it sent; every upload is completed."""
    caplog.set_level(logging.INFO, logger="parakeet_stream.connections")
    body = multipart({"model": "whisper-1"}, audio_file(sentence[:16000]))
    uploads = 25

    def upload(port: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", PATH, body, {"Content-Type": FORM})
            answer = conn.getresponse()
            answer.read()
            return answer.status
        finally:
            conn.close()

    async with running_server(engine) as ctx:
        statuses = [await trio.to_thread.run_sync(upload, ctx.config.ports["http"]) for _ in range(uploads)]
        await wait_until(lambda: ctx.open_uploads == 0)
    closes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("connection closed")]
    assert statuses == [200] * uploads and len(closes) == uploads
    assert all(" reason=completed " in line for line in closes), [line for line in closes if "completed" not in line]


def test_a_spool_keeps_at_most_one_mebibyte_in_memory():
    from parakeet_stream.server.protocols.files.spool import MEMORY_BYTES, Spool

    with Spool() as spool:
        spool.write(b"x" * MEMORY_BYTES)
        assert not spool.file._rolled
        spool.write(b"x")
        assert spool.file._rolled and spool.size == MEMORY_BYTES + 1
