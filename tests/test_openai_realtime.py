"""OpenAI Realtime transcription sessions on /v1/realtime, driven by the official `openai` SDK
(its asyncio client, in a worker thread with its own event loop) against the in-process server
on loopback. Every server event is validated strictly against the SDK's own types."""
from __future__ import annotations

import asyncio
import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soxr
import trio
from test_deepgram import g711_table_encode
from helpers import (
    PoisonedEngine,
    Raw,
    hold_every_slot,
    pcm16_exact,
    running_server,
    url,
)

from demo_model.speech import synth
from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine
from parakeet_stream.server.streams.wire import ALAW, MULAW

openai = pytest.importorskip("openai")
import pydantic
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from websockets.exceptions import InvalidStatus

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
RATE = 24000
CHUNK_SECONDS = 0.1
TIMEOUT = 30
TRANSCRIPTION = "conversation.item.input_audio_transcription"
MANUAL = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
DEMO = Path(__file__).resolve().parent.parent / "weights" / "demo"


@pytest.fixture(scope="module")
def demo_engine():
    """The trained demo model: unlike the tiny fixture model, it ends each sentence of the
    pause fixture with exactly one <EOU>."""
    if not (DEMO / "model.safetensors").is_file():
        pytest.skip("weights/demo is absent")
    with ASREngine(DEMO, max_num_streams=2) as eng:
        yield eng


def strict(raw: bytes, pcm_rate_extension: bool = False) -> dict:
    """One raw server event -> dict, after validating it strictly against the SDK's union:
    required fields present, types exact, and no field anywhere that the SDK's types lack."""
    data = json.loads(raw)
    checked = json.loads(raw)
    if pcm_rate_extension and checked["type"].startswith("session."):
        checked["session"]["audio"]["input"]["format"]["rate"] = RATE  # the SDK's type pins 24 kHz
    event = SERVER_EVENT.validate_python(checked, strict=True)
    assert event.type == data["type"]
    assert not extras(event), (data, extras(event))
    assert data["event_id"].startswith("event_")
    return data


def extras(model) -> list:
    """Every field, in the parsed tree, that no SDK type declares (pydantic's model_extra)."""
    found = []
    if isinstance(model, pydantic.BaseModel):
        found += list((model.model_extra or {}).keys())
        for name in type(model).model_fields:
            found += extras(getattr(model, name))
    elif isinstance(model, list):
        for value in model:
            found += extras(value)
    return found


class Session:
    """An SDK connection that records every event it receives, validated."""

    def __init__(self, connection, pcm_rate_extension: bool = False) -> None:
        self.connection = connection
        self.events: list[dict] = []
        self._extension = pcm_rate_extension

    async def next(self) -> dict:
        raw = await asyncio.wait_for(self.connection.recv_bytes(), TIMEOUT)
        event = strict(raw, self._extension)
        self.connection.parse_event(raw)  # and the SDK itself takes it
        self.events.append(event)
        return event

    async def until(self, kind: str, count: int = 1) -> dict:
        """Read until the `count`-th event of `kind` (counting those already read)."""
        while sum(e["type"] == kind for e in self.events) < count:
            await self.next()
        return [e for e in self.events if e["type"] == kind][count - 1]

    async def update(self, session: dict) -> dict:
        await self.connection.session.update(session=session)
        return await self.until("session.updated", self.count("session.updated") + 1)

    def count(self, kind: str) -> int:
        return sum(e["type"] == kind for e in self.events)

    async def append(self, data: bytes, rate: int, width: int) -> None:
        step = int(rate * CHUNK_SECONDS) * width
        for i in range(0, len(data), step):
            await self.connection.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())

    async def transcribe(self, data: bytes, rate: int = RATE, width: int = 2) -> dict:
        """Append `data`, commit, and wait for the item's completed transcript."""
        await self.append(data, rate, width)
        await self.connection.input_audio_buffer.commit()
        return await self.until(f"{TRANSCRIPTION}.completed", self.count(f"{TRANSCRIPTION}.completed") + 1)


def run_sdk(ctx, script, key: str = "unused", pcm_rate_extension: bool = False, **connect):
    """`script(session)` on a new SDK connection (after session.created); returns the events."""
    port = ctx.config.ports["ws"]
    connect.setdefault("model", "gpt-4o-transcribe")

    async def main() -> list[dict]:
        client = AsyncOpenAI(api_key=key, websocket_base_url=f"ws://127.0.0.1:{port}/v1")
        async with client.realtime.connect(**connect) as connection:
            session = Session(connection, pcm_rate_extension)
            await session.until("session.created")
            await script(session)
            return session.events

    return lambda: asyncio.run(main())


async def in_thread(worker) -> list[dict]:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(worker)


async def native_text(ctx, data: bytes, rate: int) -> str:
    """The native protocol's transcript of the same PCM16 bytes."""
    async with Raw.open(url(ctx, "ws", f"/?encoding=pcm16&sample_rate={rate}")) as conn:
        step = int(rate * CHUNK_SECONDS) * 2
        for i in range(0, len(data), step):
            await conn.send(data[i : i + step])
        await conn.send({"type": "close"})
        return (await conn.until("result", is_final=True))[-1]["text"]


def at_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    return pcm16_exact(soxr.resample(samples, 16000, rate).astype(np.float32))


def items(events: list[dict]) -> list[str]:
    """Item ids in the order their transcripts completed."""
    return [e["item_id"] for e in events if e["type"] == f"{TRANSCRIPTION}.completed"]


def of_item(events: list[dict], item: str) -> list[dict]:
    return [e for e in events if e.get("item_id") == item]


def check_item(events: list[dict], item: str, vad: bool) -> str:
    """The item's events in order, its deltas adding up to its transcript; returns it."""
    mine = of_item(events, item)
    kinds = [e["type"] for e in mine if not e["type"].endswith(".delta")]
    expected = ["input_audio_buffer.committed", f"{TRANSCRIPTION}.completed"]
    if vad:
        expected = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", *expected]
    assert kinds == expected, kinds
    completed = mine[-1]
    deltas = [e for e in mine if e["type"] == f"{TRANSCRIPTION}.delta"]
    assert all(e["content_index"] == 0 for e in deltas) and completed["content_index"] == 0
    assert "".join(e["delta"] for e in deltas) == completed["transcript"]
    assert completed["usage"]["type"] == "duration" and completed["usage"]["seconds"] > 0
    return completed["transcript"]


def words(text: str) -> str:
    return " ".join(text.split())


async def test_manual_commits_give_the_native_transcript(engine, sentence):
    pcm = encode_audio(at_rate(sentence, RATE), "pcm16")

    async def script(session: Session) -> None:
        updated = await session.update(MANUAL)
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": RATE}
        await session.transcribe(pcm)
        await session.transcribe(pcm)  # a second item on the same connection

    async with running_server(engine) as ctx:
        text = await native_text(ctx, pcm, RATE)
        events = await in_thread(run_sdk(ctx, script))
    assert text.strip()
    first, second = items(events)
    assert first.startswith("item_") and first != second
    assert [check_item(events, item, vad=False) for item in (first, second)] == [text.strip()] * 2
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert [e["previous_item_id"] for e in committed] == [None, first]
    assert not any(e["type"].startswith("input_audio_buffer.speech") for e in events)
    usage = [e["usage"]["seconds"] for e in events if e["type"] == f"{TRANSCRIPTION}.completed"]
    assert usage == [pytest.approx(len(pcm) / 2 / RATE, abs=0.01)] * 2
    assert len({e["event_id"] for e in events}) == len(events)


async def test_server_vad_ends_items_at_the_end_of_utterance(demo_engine, wavs):
    silence = np.zeros(int(1.5 * 16000), np.float32)  # time for the model to end the second one
    pcm = encode_audio(at_rate(np.concatenate([wavs["pause"], silence]), RATE), "pcm16")

    async def script(session: Session) -> None:
        created = session.events[0]["session"]["audio"]["input"]
        assert created["turn_detection"]["type"] == "server_vad"  # the default
        await session.append(pcm, RATE, 2)
        await session.until(f"{TRANSCRIPTION}.completed", 2)

    async with running_server(demo_engine) as ctx:
        text = await native_text(ctx, pcm, RATE)
        events = await in_thread(run_sdk(ctx, script, extra_query={"intent": "transcription"}))
    first, second = items(events)
    transcripts = [check_item(events, item, vad=True) for item in (first, second)]
    assert all(transcripts) and words(" ".join(transcripts)) == words(text)
    started = [e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stopped = [e["audio_end_ms"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert started[0] < stopped[0] <= started[1] < stopped[1] <= len(pcm) / 2 / RATE * 1000
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert [e["previous_item_id"] for e in committed] == [None, first]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (scripts/test.sh installs it)")
@pytest.mark.parametrize("eagerness", ["low", None])  # high: an item ends after 0.7 s of silence
async def test_semantic_vad_waits_where_the_words_cannot_end_a_sentence(demo_engine, eagerness):
    """The demo model ends the utterance in the pause after "please send it to the" (server_vad: an
    item there); semantic_vad keeps the item open for the rest of the sentence."""
    said = {"text": '<speak>please send it to the <break time="800ms"/> office today</speak>', "voice": "en-us",
            "variant": "default", "speed": 160, "pitch": 50}
    pcm = encode_audio(at_rate(np.concatenate([synth(said, seed=1), np.zeros(24000, np.float32)]), RATE), "pcm16")
    found: dict[str, list[str]] = {}
    for vad in ("server_vad", "semantic_vad"):
        detection = {"type": vad} | ({"eagerness": eagerness} if vad == "semantic_vad" and eagerness else {})

        async def script(session: Session) -> None:
            await session.update({"type": "transcription", "audio": {"input": {"turn_detection": detection}}})
            await session.append(pcm, RATE, 2)
            await session.until(f"{TRANSCRIPTION}.completed", 1)
            await session.connection.input_audio_buffer.commit()  # whatever is left, as its own item
            await session.until("input_audio_buffer.committed", 2)

        async with running_server(demo_engine) as ctx:
            events = await in_thread(run_sdk(ctx, script, extra_query={"intent": "transcription"}))
        found[vad] = [e["transcript"] for e in events if e["type"] == f"{TRANSCRIPTION}.completed"]
    assert found["server_vad"][0] == "please send it to the"
    assert found["semantic_vad"][0] == "please send it to the office today"


@pytest.mark.parametrize("kind,table", [("audio/pcmu", MULAW), ("audio/pcma", ALAW)])
async def test_telephony_audio_gives_the_transcript_of_its_pcm16(engine, sentence, kind, table):
    coded = g711_table_encode(at_rate(sentence, 8000), table)
    linear = encode_audio(table[np.frombuffer(coded, np.uint8)], "pcm16")  # the same samples, as PCM16
    box: dict = {}

    def script_for(audio_format: dict, data: bytes, width: int):
        async def script(session: Session) -> None:
            audio_input = {"turn_detection": None, "format": audio_format}
            updated = await session.update({"type": "transcription", "audio": {"input": audio_input}})
            assert updated["session"]["audio"]["input"]["format"] == audio_format
            box[audio_format["type"]] = (await session.transcribe(data, 8000, width))["transcript"]

        return script

    async with running_server(engine) as ctx:
        text = await native_text(ctx, linear, 8000)
        pcm8k = {"type": "audio/pcm", "rate": 8000}  # our extension: any PCM rate
        await in_thread(run_sdk(ctx, script_for(pcm8k, linear, 2), pcm_rate_extension=True))
        await in_thread(run_sdk(ctx, script_for({"type": kind}, coded, 1)))
    assert text.strip() and box["audio/pcm"] == text.strip()
    assert box[kind] == box["audio/pcm"]


async def test_commits_without_waiting_for_transcripts(engine, sentence):
    """Audio appended while a committed item drains waits for the next engine stream; so does
    a commit of it, and a clear drops only it."""
    pcm = encode_audio(at_rate(sentence, RATE), "pcm16")

    async def script(session: Session) -> None:
        await session.update(MANUAL)
        await session.append(pcm, RATE, 2)
        await session.connection.input_audio_buffer.commit()
        await session.append(pcm[: len(pcm) // 2 // 2 * 2], RATE, 2)
        await session.connection.input_audio_buffer.clear()
        await session.append(pcm, RATE, 2)
        await session.connection.input_audio_buffer.commit()
        await session.until(f"{TRANSCRIPTION}.completed", 2)

    async with running_server(engine) as ctx:
        text = await native_text(ctx, pcm, RATE)
        events = await in_thread(run_sdk(ctx, script))
    first, second = items(events)
    assert [check_item(events, item, vad=False) for item in (first, second)] == [text.strip()] * 2
    assert [e["type"] for e in events].count("input_audio_buffer.cleared") == 1
    usage = [e["usage"]["seconds"] for e in events if e["type"] == f"{TRANSCRIPTION}.completed"]
    assert usage == [pytest.approx(len(pcm) / 2 / RATE, abs=0.01)] * 2


async def test_wrong_key_is_refused_at_once(engine, sentence):
    pcm = encode_audio(at_rate(sentence[:16000], RATE), "pcm16")

    async def script(session: Session) -> None:
        await session.transcribe(pcm)

    async with running_server(engine, api_key="secret") as ctx:
        with trio.fail_after(10):
            with pytest.raises(InvalidStatus) as info:
                await in_thread(run_sdk(ctx, script, key="wrong"))
        assert info.value.response.status_code == 401
        events = await in_thread(run_sdk(ctx, script, key="secret"))
    assert events[-1]["type"] == f"{TRANSCRIPTION}.completed"


async def test_bad_events_get_openai_errors_and_the_session_goes_on(engine, sentence):
    pcm = encode_audio(at_rate(sentence, RATE), "pcm16")
    errors: list[dict] = []

    async def expect_error(session: Session, raw: dict | None = None) -> None:
        if raw is not None:
            await session.connection.send_raw(json.dumps(raw))
        errors.append((await session.until("error", len(errors) + 1))["error"])

    async def script(session: Session) -> None:
        await session.update(MANUAL)
        await expect_error(session, {"type": "conversation.item.create", "event_id": "evt_1"})
        await expect_error(session, {"type": "input_audio_buffer.append", "audio": "not base64!"})
        await session.connection.input_audio_buffer.commit(event_id="evt_3")
        await expect_error(session)
        await session.append(pcm[:9600], RATE, 2)
        pcmu = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}
        await expect_error(session, {"type": "session.update", "session": pcmu})  # audio is buffered
        await session.connection.input_audio_buffer.clear()
        await session.until("input_audio_buffer.cleared")
        await session.connection.input_audio_buffer.commit()  # cleared: nothing to commit
        await expect_error(session)
        await session.transcribe(pcm)

    async with running_server(engine) as ctx:
        text = await native_text(ctx, pcm, RATE)
        events = await in_thread(run_sdk(ctx, script))
    codes = [e["code"] for e in errors]
    assert codes == ["unknown_type", "invalid_base64", "input_audio_buffer_commit_empty", "bad_state",
                     "input_audio_buffer_commit_empty"]
    assert all(e["type"] == "invalid_request_error" and e["message"] for e in errors)
    assert [e["event_id"] for e in errors[:3]] == ["evt_1", None, "evt_3"]
    assert [e["param"] for e in errors[:2]] == ["type", "audio"]
    (item,) = items(events)
    assert check_item(events, item, vad=False) == text.strip()


async def test_dialect_follows_the_url(engine):
    async with running_server(engine) as ctx:
        for query in ("?intent=transcription", "?model=whatever"):
            async with Raw.open(url(ctx, "ws", f"/v1/realtime{query}")) as conn:
                created = await conn.recv()
            assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        async with Raw.open(url(ctx, "ws", "/v1/realtime")) as conn:  # vLLM's dialect
            created = await conn.recv()
        assert created["type"] == "session.created" and created["id"].startswith("sess-")


async def test_queued_session_waits_silently(engine, sentence):
    """While every slot is busy the OpenAI client gets no `queued` event; its audio is held."""
    pcm = encode_audio(at_rate(sentence, RATE), "pcm16")
    box: dict = {}
    release = trio.Event()

    async def openai_client(ctx) -> None:
        async def script(session: Session) -> None:
            await session.update(MANUAL)
            await session.transcribe(pcm)

        box["events"] = await in_thread(run_sdk(ctx, script))

    async with running_server(engine) as ctx:
        text = await native_text(ctx, pcm, RATE)
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_every_slot, ctx, release)
            nursery.start_soon(openai_client, ctx)
            await trio.sleep(0.5)
            assert "events" not in box  # still waiting for a slot
            release.set()
    (item,) = items(box["events"])  # and every event was an SDK type
    assert check_item(box["events"], item, vad=False) == text.strip()


async def test_example_client(engine, sentence, tmp_path):
    import subprocess
    import sys

    import soundfile as sf

    wav = tmp_path / "speech.wav"
    sf.write(wav, sentence, 16000, subtype="PCM_16")
    example = Path(__file__).resolve().parent.parent / "examples" / "openai_realtime_client.py"
    async with running_server(engine) as ctx:
        text = await native_text(ctx, encode_audio(at_rate(sentence, RATE), "pcm16"), RATE)
        cmd = [sys.executable, str(example), str(wav), f"ws://127.0.0.1:{ctx.config.ports['ws']}/v1"]
        run = lambda: subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
        done = await trio.to_thread.run_sync(run)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == f"completed: {text.strip()}"


async def test_inference_error_is_a_server_error_event(engine, sentence):
    from websockets.exceptions import ConnectionClosedError

    poisoned = PoisonedEngine(engine)
    poisoned.poison_next = True
    pcm = encode_audio(at_rate(sentence[:8000], RATE), "pcm16")
    seen: list[dict] = []

    async def script(session: Session) -> None:
        await session.append(pcm, RATE, 2)
        with pytest.raises(ConnectionClosedError) as info:
            while True:
                await session.next()
        seen.extend(session.events)
        assert info.value.rcvd.code == 1011

    async with running_server(poisoned) as ctx:
        await in_thread(run_sdk(ctx, script))
    errors = [e["error"] for e in seen if e["type"] == "error"]
    assert errors == [{"type": "server_error", "code": "inference_error", "message": errors[0]["message"],
                       "param": None, "event_id": None}]
