"""Original-protocol clients, the native extensions, the client library, and /v1/realtime."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
import soundfile as sf
import soxr
import trio
from helpers import (
    Raw,
    audio_messages,
    pcm16_b64,
    result_tokens,
    running_server,
    transcribe_raw,
    url,
)

from parakeet_stream.client import (
    connect,
    receive_transcript,
    send_paced,
    transcribe_async,
)


@pytest.fixture(scope="module")
def engine(either_engine):
    """Every test here in-process and across the engine client API."""
    return either_engine


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_original_protocol_matches_engine(engine, sentence, solo_tokens, kind):
    async with running_server(engine) as ctx:
        results = await transcribe_raw(url(ctx, kind), sentence)
    assert result_tokens(results) == solo_tokens
    assert results[-1]["is_final"] and all(not r["is_final"] for r in results[:-1])
    for r in results:  # original fields keep their meaning: text is the transcript so far
        assert set(r) >= {"type", "stream_id", "text", "token_ids", "is_final"}
    assert results[-1]["text"] == "".join(r["delta"] for r in results)


async def test_original_ws_quirks_json_in_binary_frames_and_several_per_frame(engine, sentence, solo_tokens):
    """The original server decoded binary frames as JSON and split frames on newlines."""
    messages = audio_messages(sentence)
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws")) as conn:
        await conn.send(b'{"type": "ping"}')
        assert (await conn.until("pong"))[-1] == {"type": "pong"}
        for i in range(0, len(messages), 3):
            await conn.send("\n".join(orjson.dumps(m).decode() for m in messages[i : i + 3]))
        results = [m for m in await conn.until("result", is_final=True) if m["type"] == "result"]
    assert result_tokens(results) == solo_tokens


async def test_ping_pong_and_close_message_finalizes(engine, sentence, solo_tokens):
    async with running_server(engine) as ctx, Raw.open(url(ctx, "tcp")) as conn:
        await conn.send({"type": "ping"})
        for message in audio_messages(sentence)[:-1]:
            await conn.send(message)
        await conn.send({"type": "close"})
        seen = await conn.until("result", is_final=True)
        assert {"type": "pong"} in seen
        assert result_tokens([m for m in seen if m["type"] == "result"]) == solo_tokens
        assert await conn.rest() == []  # then the server closes


async def test_results_carry_delta_timing_and_latency(engine, sentence):
    async with running_server(engine) as ctx:
        results = await transcribe_raw(url(ctx, "tcp"), sentence)
    timed = [r for r in results if r["token_ids"]]
    assert timed
    for r in timed:
        assert 0 <= r["start"] <= r["end"] <= r["audio_seconds"] + 1e-6
    assert all(r["latency"] is None or r["latency"] >= 0 for r in results)
    seconds = [r["audio_seconds"] for r in results]
    assert seconds == sorted(seconds) and seconds[-1] >= len(sentence) / 16000 - 0.2


async def test_results_carry_each_word_once_with_times(engine, sentence):
    """`words` lists the words a result completes: over a stream they spell the transcript,
    in order, with times inside the audio and each word inside its tokens' frames."""
    async with running_server(engine) as ctx:
        results = await transcribe_raw(url(ctx, "ws"), sentence)
    words = [w for r in results for w in r["words"]]
    assert [w["word"] for w in words] == results[-1]["text"].split() and words
    assert all(0 < w["confidence"] <= 1 for w in words) and min(w["confidence"] for w in words) < 1
    ends = [0.0] + [w["end"] for w in words]
    for previous_end, word in zip(ends, words):
        assert previous_end <= word["start"] <= word["end"] <= results[-1]["audio_seconds"]
    token_times = [t for r in results for t in r["token_times"]]
    assert words[0]["start"] == round(token_times[0], 3)
    for r in results:  # a word is sent once complete, not before its audio was heard
        assert all(word["end"] <= r["audio_seconds"] for word in r["words"])
    assert len(words) < 2 or any(r["words"] for r in results[:-1])  # words arrive while audio flows


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_declared_rate_resampled_on_server(engine, sentence, kind):
    """48 kHz declared in a start message (or the WS URL): same as resampling client-side."""
    audio48 = soxr.resample(sentence, 16000, 48000).astype(np.float32)
    async with running_server(engine) as ctx:
        ours = await transcribe_async(url(ctx, kind), audio48, sample_rate=48000, encoding="f32")
        query = await transcribe_async(
            url(ctx, "ws", "/?sample_rate=48000&encoding=f32"), audio48, sample_rate=16000, encoding="f32"
        )
        reference = await transcribe_async(url(ctx, kind), soxr.resample(audio48, 48000, 16000), encoding="f32")
    assert ours.final and ours.token_ids == reference.token_ids == query.token_ids
    started = [e for e in ours.events if e["type"] == "started"]
    assert started and started[0]["sample_rate"] == 48000


async def test_per_stream_lookahead(engine, sentence):
    modes = engine.info.lookahead_modes
    async with running_server(engine) as ctx:
        for mode in modes:
            spec = f"{mode[0]},{mode[1]}"
            t = await transcribe_async(url(ctx, "tcp"), sentence, lookahead=spec)
            declared = [e for e in t.events if e["type"] == "started"][-1]
            assert declared["lookahead"] == list(mode)
            assert declared["chunk_seconds"] == engine.info.chunk_seconds[mode]
            assert t.final


async def test_binary_frames_in_declared_encoding(engine, sentence, solo_tokens):
    async with running_server(engine) as ctx, connect(url(ctx, "ws"), encoding="f32") as stream:
        for i in range(0, len(sentence), 2000):
            await stream.send_binary(sentence[i : i + 2000])
        await stream.finalize()
        transcript = await receive_transcript(stream)
    assert transcript.token_ids == solo_tokens


async def test_realtime_paced_client_library(engine, sentence, solo_tokens):
    """Audio paced at real time while results stream back."""
    clip = sentence[: 16000 * 2]
    async with running_server(engine) as ctx, connect(url(ctx, "ws")) as stream, trio.open_nursery() as nursery:
        nursery.start_soon(send_paced, stream, clip, 16000, 0.04, True)
        transcript = await receive_transcript(stream)
    assert transcript.final and len(transcript.results) >= 5


def _librosa_stand_in(tmp_path: Path) -> Path:
    """The vLLM example imports librosa only for `load`; tests use soundfile + soxr."""
    (tmp_path / "librosa.py").write_text(
        "import soundfile as sf, soxr\n"
        "def load(path, sr=22050, mono=True):\n"
        "    a, r = sf.read(path, dtype='float32', always_2d=True)\n"
        "    a = a.mean(axis=1)\n"
        "    return (soxr.resample(a, r, sr) if sr != r else a), sr\n"
    )
    return tmp_path


async def test_vllm_realtime_example_unchanged(engine, sentence, tmp_path):
    pytest.importorskip("websockets")
    wav = tmp_path / "speech.wav"
    sf.write(wav, sentence, 16000)
    shim = _librosa_stand_in(tmp_path)
    as_example_sends = (sentence * 32767).astype(np.int16).astype(np.float32) / 32768  # its own conversion
    async with running_server(engine) as ctx:
        reference = await transcribe_async(url(ctx, "tcp"), as_example_sends)
        env = {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cmd = [sys.executable, str(ROOT / "examples/realtime_client.py"), str(wav), url(ctx, "ws", "/v1/realtime")]
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == reference.text


async def test_realtime_events(engine, sentence):
    """session.created, deltas, done with the full text; the session serves a second utterance."""
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws", "/v1/realtime")) as conn:
        created = await conn.recv()
        assert created["type"] == "session.created" and created["id"].startswith("sess-")
        texts = []
        for _ in range(2):
            await conn.send({"type": "session.update", "model": "anything"})
            await conn.send({"type": "input_audio_buffer.commit"})
            for i in range(0, len(sentence), 2048):
                await conn.send({"type": "input_audio_buffer.append", "audio": pcm16_b64(sentence[i : i + 2048])})
            await conn.send({"type": "input_audio_buffer.commit", "final": True})
            seen = await conn.until("transcription.done")
            deltas = "".join(m["delta"] for m in seen if m["type"] == "transcription.delta")
            assert seen[-1]["text"] == deltas and seen[-1]["usage"]["completion_tokens"] > 0
            texts.append(deltas)
        assert texts[0] == texts[1]


async def test_realtime_audio_sent_before_done_waits_for_the_next_utterance(engine, sentence):
    """The client need not wait for transcription.done: audio (and a final commit) sent while the
    previous utterance drains go to the next one."""
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws", "/v1/realtime")) as conn:
        assert (await conn.recv())["type"] == "session.created"
        for _ in range(2):
            for i in range(0, len(sentence), 2048):
                await conn.send({"type": "input_audio_buffer.append", "audio": pcm16_b64(sentence[i : i + 2048])})
            await conn.send({"type": "input_audio_buffer.commit", "final": True})
        seen = await conn.until("transcription.done")
        seen += await conn.until("transcription.done")
    assert not [m for m in seen if m["type"] == "error"]
    done = [m["text"] for m in seen if m["type"] == "transcription.done"]
    assert done[0] and done[0] == done[1]
