"""Deepgram Flux's turn-taking API on /v2/listen, driven by the official deepgram-sdk (its v2
sync client, in a worker thread) against the in-process server on loopback, on the demo model
(trained with <EOU>) and espeak-ng speech.

Every message is re-validated by the SDK's own types; turns must follow Flux's order of events
and their words must be the native protocol's for the same audio."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio
from helpers import Raw, demo_pins, refused_handshake, running_server, transcribe_raw, url

from demo_model.speech import synth
from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine
from parakeet_stream.server.protocols.flux_turns import FIRMING

pytest.importorskip("deepgram")
from deepgram import DeepgramClient  # noqa: E402
from deepgram.environment import DeepgramClientEnvironment  # noqa: E402
from deepgram.listen.v2.types import (  # noqa: E402
    ListenV2ConfigureFailure,
    ListenV2ConfigureSuccess,
    ListenV2Connected,
    ListenV2FatalError,
    ListenV2TurnInfo,
)

SDK_TYPES = {
    "Connected": ListenV2Connected,
    "TurnInfo": ListenV2TurnInfo,
    "ConfigureSuccess": ListenV2ConfigureSuccess,
    "ConfigureFailure": ListenV2ConfigureFailure,
    "Error": ListenV2FatalError,
}
ROOT = Path(__file__).resolve().parents[1]
RATE = 16000
PACKET = 1600  # 100 ms
TAIL = 1.5  # seconds of silence after the speech


@pytest.fixture(scope="module")
def engine():
    with ASREngine("demo", max_num_streams=4) as e:
        yield e


def spoken(wavs, name: str) -> np.ndarray:
    return np.concatenate([wavs[name], np.zeros(int(TAIL * RATE), np.float32)])


def strict(message) -> dict:
    data = message.model_dump(exclude_unset=True)
    SDK_TYPES[data["type"]].model_validate(data)
    return data


def run_sdk(ctx, script, key: str = "unused", **params):
    port = ctx.config.ports["ws"]
    env = DeepgramClientEnvironment(base=f"http://127.0.0.1:{port}", production=f"ws://127.0.0.1:{port}",
                                    agent="", agent_rest="")

    def worker() -> list[dict]:
        with DeepgramClient(api_key=key, environment=env).listen.v2.connect(
                model="flux-general-en", encoding="linear16", sample_rate=str(RATE), **params) as socket:
            script(socket)
            return [strict(m) for m in socket]

    return worker


async def in_thread(worker) -> list[dict]:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(worker)


def send(samples: np.ndarray, *then):
    """The audio in 100 ms packets, then each of `then` (a message, or a (method, args) pair)."""
    pcm = encode_audio(samples, "pcm16")

    def script(socket) -> None:
        for i in range(0, len(pcm), 2 * PACKET):
            socket.send_media(pcm[i : i + 2 * PACKET])
        for action in then:
            action(socket)
        socket.send_close_stream()

    return script


async def native_words(ctx, samples: np.ndarray, path: str = "/") -> str:
    return " ".join((await transcribe_raw(url(ctx, "ws", path), samples))[-1]["text"].split())


def turns(messages: list[dict]) -> list[list[dict]]:
    """The TurnInfo messages grouped by turn_index, in order."""
    grouped: dict[int, list[dict]] = {}
    for m in messages:
        if m["type"] == "TurnInfo":
            grouped.setdefault(m["turn_index"], []).append(m)
    assert list(grouped) == list(range(len(grouped)))
    return list(grouped.values())


def check_order(turn: list[dict], closed: bool = False) -> None:
    """Flux's events in order: StartOfTurn, then updates, eager ends and resumptions, one EndOfTurn
    last (`closed`: the stream closed on the turn, so its last Update stands instead)."""
    events = [m["event"] for m in turn]
    assert events[0] == "StartOfTurn" and events.count("EndOfTurn") == (not closed), events
    assert events[-1] == ("Update" if closed else "EndOfTurn"), events
    assert "StartOfTurn" not in events[1:]
    for before, after in zip(events, events[1:]):
        assert before != "EagerEndOfTurn" or after in ("TurnResumed", "EndOfTurn"), events
        assert after != "TurnResumed" or before == "EagerEndOfTurn" or "EagerEndOfTurn" in events[: events.index(after)]
    for m in turn:
        assert m["transcript"] == " ".join(w["word"] for w in m["words"])
        assert 0 <= m["end_of_turn_confidence"] <= 1
        assert m["audio_window_start"] <= m["audio_window_end"]
        assert ("trigger" in m) == (m["event"] == "EndOfTurn")


async def test_turns_end_at_the_models_end_of_utterance_with_the_native_words(engine, wavs):
    audio = spoken(wavs, "pause")  # two sentences, 1.5 s apart
    async with running_server(engine) as ctx:
        expected = await native_words(ctx, audio)
        messages = await in_thread(run_sdk(ctx, send(audio), eager_eot_threshold=str(eager_threshold())))
    assert messages[0]["type"] == "Connected" and messages[0]["request_id"]
    assert [m["sequence_id"] for m in messages] == list(range(len(messages)))
    assert all(m["type"] in ("Connected", "TurnInfo") for m in messages)
    found = turns(messages)
    assert len(found) == 2
    for turn in found:
        check_order(turn)
        end = turn[-1]
        assert end["trigger"] == "model" and end["end_of_turn_confidence"] >= 0.7
    assert " ".join(turn[-1]["transcript"] for turn in found) == expected
    assert found[1][0]["audio_window_start"] == found[0][-1]["audio_window_end"]
    # with eager ends asked for, one before each end the model decides, with the final words
    for turn in found:
        eager = [m for m in turn if m["event"] == "EagerEndOfTurn"]
        assert len(eager) == 1 and eager[0]["transcript"] == turn[-1]["transcript"], turn
    # the model's <EOU> probability rises before it writes it: on the first turn, a chunk earlier
    first = next(m for m in found[0] if m["event"] == "EagerEndOfTurn")
    assert eager_threshold() <= first["end_of_turn_confidence"] < 0.7
    assert first["audio_window_end"] < found[0][-1]["audio_window_end"]


def eager_threshold() -> float:
    """Under the highest <EOU> probability the bundled model gives after the first sentence of pause.wav
    before the chunk where it writes <EOU> (tests/fixtures/demo_pins.json), in Flux's steps of 0.05."""
    return math.floor(demo_pins()["eou"]["pause_rise"] * 20) / 20


async def test_an_unsure_end_firms_up_in_the_silence_after_it(engine, wavs):
    audio = spoken(wavs, "sentence")  # the model writes <EOU> here under 0.9 (demo_pins.json)
    async with running_server(engine) as ctx:
        expected = await native_words(ctx, audio)
        strict_turns = await in_thread(run_sdk(ctx, send(audio), eot_threshold="0.9"))
        default = await in_thread(run_sdk(ctx, send(audio)))
    (strict_turn,), (default_turn,) = turns(strict_turns), turns(default)
    for turn in strict_turn, default_turn:
        check_order(turn)
        assert turn[-1]["trigger"] == "model" and turn[-1]["transcript"] == expected
    assert 0.7 <= default_turn[-1]["end_of_turn_confidence"] < 0.9 <= strict_turn[-1]["end_of_turn_confidence"]
    # each ends once the written probability p has firmed up to its threshold: (threshold - p) / (1 - p)
    # of FIRMING after the <EOU>, at the first chunk past it (so the default's end comes up to a chunk late)
    p = demo_pins()["eou"]["sentence_written"]
    firmed = lambda threshold: max(0.0, threshold - p) / (1 - p) * FIRMING  # noqa: E731
    late = engine.chunk_seconds() if p < 0.7 else 0.0
    assert strict_turn[-1]["audio_window_end"] - default_turn[-1]["audio_window_end"] >= firmed(0.9) - firmed(0.7) - late


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (scripts/test.sh installs it)")
async def test_a_hesitation_where_the_sentence_cannot_end_keeps_the_turn(engine):
    """The demo model writes <EOU> in the pause after "please send it to the" as after any pause; the
    words so far cannot end a sentence, so the turn goes on, and ends after "office today"."""
    said = {"text": '<speak>please send it to the <break time="800ms"/> office today</speak>', "voice": "en-us",
            "variant": "default", "speed": 160, "pitch": 50}
    audio = np.concatenate([synth(said, seed=1), np.zeros(int(TAIL * RATE), np.float32)])
    async with running_server(engine) as ctx:
        messages = await in_thread(run_sdk(ctx, send(audio), eager_eot_threshold="0.5"))
    (turn,) = turns(messages)
    check_order(turn)
    assert turn[-1]["trigger"] == "model" and turn[-1]["transcript"] == "please send it to the office today"
    assert [m["event"] for m in turn].count("EagerEndOfTurn") == 1  # none in the pause
    assert turn[-1]["audio_window_end"] < len(audio) / RATE - 0.5  # when the model said so, not at the close


async def test_configure_changes_thresholds_mid_stream_and_refuses_what_it_cannot(engine, wavs):
    audio = spoken(wavs, "sentence")

    def configure(socket) -> None:
        socket.send_configure({"type": "Configure", "thresholds": {"eot_threshold": 0.9, "eot_timeout_ms": 1000}})
        socket.send_configure({"type": "Configure", "thresholds": {"eot_threshold": 2}})
        socket.send_configure({"type": "Configure", "thresholds": {"eager_eot_threshold": 0.95}})
        socket.send_configure({"type": "Configure", "keyterms": ["Zanzibar"]})

    def script(socket) -> None:
        configure(socket)
        send(audio)(socket)

    async with running_server(engine) as ctx:
        messages = await in_thread(run_sdk(ctx, script))
    replies = [m for m in messages if m["type"].startswith("Configure")]
    assert [m["type"] for m in replies] == ["ConfigureSuccess"] + ["ConfigureFailure"] * 3
    assert replies[0]["thresholds"] == {"eot_threshold": 0.9, "eot_timeout_ms": 1000, "eager_eot_threshold": None}
    assert "eot_threshold" in replies[1]["description"] and "eager_eot_threshold" in replies[2]["description"]
    assert "keyterms" in replies[3]["description"]
    (turn,) = turns(messages)
    assert turn[-1]["end_of_turn_confidence"] >= 0.9  # the first Configure held, the refused ones changed nothing


async def test_force_end_turn_ends_the_turn_and_the_stream_goes_on(engine, wavs):
    whole = spoken(wavs, "sentence")
    first, second = whole[: len(wavs["sentence"]) // 2], whole[len(wavs["sentence"]) // 2 :]  # cut mid-sentence
    pcm = encode_audio(first, "pcm16")

    def script(socket) -> None:
        for i in range(0, len(pcm), 2 * PACKET):
            socket.send_media(pcm[i : i + 2 * PACKET])
        socket.send_force_end_turn()
        send(second)(socket)

    async with running_server(engine) as ctx:
        expected = [await native_words(ctx, first), await native_words(ctx, second)]
        messages = await in_thread(run_sdk(ctx, script))
    found = turns(messages)
    assert found[0][-1]["trigger"] == "manual" and len(found) == 2
    assert [turn[-1]["transcript"] for turn in found] == expected
    assert found[1][-1]["audio_window_end"] > found[0][-1]["audio_window_end"] >= len(first) / RATE - 0.01


async def test_close_stream_transcribes_the_rest_and_ends_no_turn(engine, wavs):
    """As Deepgram's: the audio left is transcribed, the open turn's last Update stands, then the close."""
    audio = wavs["sentence"][: len(wavs["sentence"]) * 3 // 4]  # closed mid-sentence
    async with running_server(engine) as ctx:
        expected = await native_words(ctx, audio)
        messages = await in_thread(run_sdk(ctx, send(audio)))
    (turn,) = turns(messages)
    check_order(turn, closed=True)
    assert turn[-1]["transcript"] == expected
    assert turn[-1]["audio_window_end"] == pytest.approx(len(audio) / RATE, abs=0.1)


@pytest.mark.parametrize("query, named", [
    ("eot_threshold=1.5", "eot_threshold"), ("eager_eot_threshold=0.8&eot_threshold=0.6", "eager_eot_threshold"),
    ("eot_timeout_ms=20", "eot_timeout_ms"), ("eot_threshold=high", "eot_threshold"), ("encoding=opus", "encoding"),
    ("redact=pii", "redact"), ("sample_rate=7", "sample_rate"), ("keyterm=" + "x" * 101, "keyterm"),
])
async def test_a_query_it_cannot_honour_is_refused_like_deepgram(engine, query, named):
    async with running_server(engine) as ctx:
        response = await refused_handshake(f"ws://127.0.0.1:{ctx.config.ports['ws']}/v2/listen?{query}")
    assert response.status_code == 400
    body = json.loads(response.body)
    assert body["err_code"] == "INVALID_QUERY_PARAMETER" and named in body["err_msg"]


async def test_bad_messages_get_a_numbered_error_and_the_stream_goes_on(engine, wavs):
    audio = spoken(wavs, "sentence")
    async with running_server(engine, api_key="secret") as ctx:
        expected = await native_words(ctx, audio, "/?api_key=secret")
        address = url(ctx, "ws", "/v2/listen?encoding=linear16&sample_rate=16000")
        async with Raw.open(address, headers=[("Authorization", "Token secret")]) as conn:
            assert (await conn.recv())["type"] == "Connected"
            await conn.send('{"type": "Sing"}')
            await conn.send(b"\x00\x01\x02")  # half a sample
            await conn.send("not json")
            pcm = encode_audio(audio, "pcm16")
            for i in range(0, len(pcm), 2 * PACKET):
                await conn.send(pcm[i : i + 2 * PACKET])
            await conn.send({"type": "CloseStream"})
            messages = [await conn.recv() for _ in range(3)] + await conn.rest()
    errors = messages[:3]
    assert [m["type"] for m in errors] == ["Error"] * 3 and [m["sequence_id"] for m in errors] == [1, 2, 3]
    assert [m["code"] for m in errors] == ["unknown_type", "invalid_audio_length", "invalid_json"]
    for m in errors:
        ListenV2FatalError.model_validate(m)
    (turn,) = turns(messages)
    assert turn[-1]["transcript"] == expected


async def test_the_example_prints_each_turn_as_it_ends(engine):
    async with running_server(engine) as ctx:
        cmd = [sys.executable, str(ROOT / "examples" / "flux_client.py"), str(ROOT / "examples" / "journey.wav"),
               f"ws://127.0.0.1:{ctx.config.ports['ws']}"]
        done = await trio.to_thread.run_sync(lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=60))
    assert done.returncode == 0, done.stderr[-2000:]
    ends = [line for line in done.stdout.splitlines() if line.startswith("turn ") and "(model" in line]
    assert ends and all(line.split(": ", 1)[1].strip() for line in ends), done.stdout
