"""Admission after steps held up for a while (the CPU taken by other work, a paused machine), with
Flux clients (`/v2/listen`) on loopback, the demo model and espeak-ng speech.

Each batch size's measured cost moves only while steps of that size run. Steps of 2-4 streams held
up for seconds left those sizes seconds dear; the step cost line through them fell and was held flat
at their mean, so admission said one live stream, and from then on only steps of one stream ran:
nothing measured 2-4 streams again, and every later stream waited for the one before it to end
(seconds of audio, EndOfTurns seconds late, and Flux has no message to say so). Now a stream that
waits for a slot on an API without a `queued` message is logged and counted, and the machine, once
it recovered, admits what it admitted before: what the last live step's round serves at its cost
shared among its streams counts too (admission.py)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import trio
from helpers import Raw, hold_every_slot, http_get, running_server, url

from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine

RATE = 16000
PACKET = 1600  # 100 ms
FLUX = "/v2/listen?encoding=linear16&sample_rate=16000"
HELD_UP = 2.0  # seconds a step is held up


@pytest.fixture(scope="module")
def engine():
    # 8 slots: the start-up measure steps 1 and 8 streams, so 2-4 streams are sizes between
    with ASREngine("demo", "cpu", max_num_streams=8, max_queue=8) as e:
        yield e


def as_measured_idle(engine: ASREngine) -> None:
    """The step cost as the start-up measure finds it on this machine idle (1 stream 7 ms, 8 streams
    12 ms), whatever else runs on it now: how many streams a fresh engine lets in at once does not
    depend on how busy the machine was when the test started."""
    scheduler = engine.scheduler
    scheduler.forget_steps()
    for batch, seconds in ((1, 0.007), (8, 0.012)):
        scheduler.cost.record(batch, seconds)


def live_counts(engine: ASREngine) -> list[int]:
    """The live streams admitted, counted after each admission from now on."""
    admission, counts = engine.scheduler.admission, []
    admitted = admission.admitted

    def spied(seq):
        admitted(seq)
        counts.append(len(admission.live))

    admission.admitted = spied
    return counts


def held_up_as_streams_end(engine: ASREngine) -> tuple[list[int], list[bool]]:
    """Once armed (set the flag in the second list), every step of two or more streams that ends one
    of them is held up HELD_UP seconds before its decode, at most three: the CPU taken away while
    the streams end. Returns (the batch sizes held up, [armed])."""
    decode, held, armed = engine.runner.decode, [], [False]

    def decode_held_up(step):
        if armed[0] and len(step) >= 2 and any(item.last for item in step) and len(held) < 3:
            held.append(len(step))
            time.sleep(HELD_UP)
        decode(step)

    engine.runner.decode = decode_held_up
    return held, armed


async def speak(ctx, audio: np.ndarray, sent: trio.Event | None = None, close: trio.Event | None = None) -> list[dict]:
    """One Flux client: the audio in 100 ms packets (not paced), CloseStream (after `close`, where
    given), every message until the server closes."""
    pcm = encode_audio(audio, "pcm16")
    async with Raw.open(url(ctx, "ws", FLUX)) as conn:
        for i in range(0, len(pcm), 2 * PACKET):
            await conn.send(pcm[i : i + 2 * PACKET])
        if sent is not None:
            sent.set()
        if close is not None:
            await close.wait()
        await conn.send({"type": "CloseStream"})
        return await conn.rest()


async def four_at_once(ctx, audio: np.ndarray, before_close=None) -> list[list[dict]]:
    got: list[list[dict]] = [[] for _ in range(4)]
    sent = [trio.Event() for _ in range(4)]
    close = trio.Event() if before_close else None

    async def one(i: int) -> None:
        got[i] = await speak(ctx, audio, sent[i], close)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(one, i)
        if before_close:
            for event in sent:
                await event.wait()
            await before_close()
            close.set()
    return got


async def test_after_steps_held_up_as_streams_ended_the_next_streams_are_admitted_together(engine, wavs):
    audio = np.concatenate([wavs["sentence"], np.zeros(RATE // 2, np.float32)])
    as_measured_idle(engine)
    held, armed = held_up_as_streams_end(engine)
    live = live_counts(engine)
    async with running_server(engine) as ctx:

        async def arm() -> None:
            with trio.fail_after(30):  # the audio sent is transcribed, then the ends are held up
                while any(s.inbox.chunks_taken < s.inbox.chunks_ready or s.in_flight
                          for s in list(engine.scheduler.active.values())):
                    await trio.sleep(0.05)
            armed[0] = True

        first = await four_at_once(ctx, audio, before_close=arm)
        assert max(live) == 4, f"four streams on a fresh engine: live {live}"
        assert held, "no step of two or more streams ended a stream: nothing was held up"
        armed[0] = False
        before = len(live)

        async def all_live() -> None:  # (streams stay live until they close: their admission alone counts)
            with trio.move_on_after(10):
                while len(engine.scheduler.admission.live) < 4:
                    await trio.sleep(0.02)

        second = await four_at_once(ctx, audio, before_close=all_live)
    # before: the line through the held-up sizes said one stream, and only one was ever let in again
    assert max(live[before:]) == 4, f"after steps of {held} streams were held up {HELD_UP:g} s: live {live[before:]}"
    for messages in first + second:
        assert any(m.get("event") == "EndOfTurn" for m in messages), messages[-3:]


async def test_a_flux_stream_that_waits_for_a_slot_is_logged_and_counted(engine, wavs, caplog):
    caplog.set_level(logging.INFO, logger="parakeet_stream.server.streams.session")
    audio = np.concatenate([wavs["sentence"], np.zeros(RATE // 2, np.float32)])
    as_measured_idle(engine)
    async with running_server(engine) as ctx:
        release = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_every_slot, ctx, release)
            got: list[dict] = []

            async def flux() -> None:
                got.extend(await speak(ctx, audio))

            nursery.start_soon(flux)
            with trio.fail_after(10):
                while not any("waits for a slot" in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.02)
            release.set()
        status, body = await http_get(ctx.config.ports["http"], "/metrics")
    said = [r.getMessage() for r in caplog.records]
    waits = [m for m in said if "waits for a slot" in m]
    assert len(waits) == 1 and "protocol=flux" in waits[0] and "queue position 1" in waits[0], said
    assert "has no message to tell the client" in waits[0]
    assert [m for m in said if "got a slot after" in m and "protocol=flux" in m], said
    assert status == 200 and b'parakeet_queue_wait_seconds_count{protocol="flux"} 1.0' in body
    assert any(m.get("event") == "EndOfTurn" for m in got)
