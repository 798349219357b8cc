"""Admission queue: positions and estimates while waiting, everyone served, refusal when full."""
from __future__ import annotations

import pytest
import trio
from helpers import (
    MOVING,
    audio_messages,
    engine_reached,
    pcm16_exact,
    Raw,
    result_tokens,
    run_stream,
    running_server,
    tokens_of,
    url,
)


@pytest.fixture(params=["in-process", "engine-process"])
def two_slots(tiny_model_dir, request):
    """Two slots, three queue places; in this process, and behind the engine client API."""
    with engine_reached(request.param, tiny_model_dir, max_num_streams=2, max_queue=3) as e:
        yield e


async def test_waiting_clients_see_positions_fall_and_are_all_served(two_slots, wavs):
    clip = pcm16_exact(wavs["sentence"][: 16000])
    expected = tokens_of(run_stream(two_slots, clip))
    async with running_server(two_slots) as ctx, trio.open_nursery() as nursery:
        transports = ["tcp", "ws", "tcp", "ws", "tcp"]
        conns, firsts = [], []
        for kind in transports:  # connect one by one so the queue order is known
            conn = await nursery.start(_hold_open, url(ctx, kind))
            conns.append(conn)
            firsts.append(await conn.recv())
        assert [m["type"] for m in firsts] == ["hello", "hello", "queued", "queued", "queued"]
        assert [m["position"] for m in firsts[2:]] == [1, 2, 3]
        assert all(m["estimated_wait_s"] >= 0 for m in firsts[2:])
        for conn in conns[2:]:  # queued clients may send their audio while they wait
            for message in audio_messages(clip):
                await conn.send(message)
        outcomes = {}
        for i, conn in enumerate(conns[:2]):
            for message in audio_messages(clip):
                await conn.send(message)
            outcomes[i] = await conn.until("result", is_final=True)
        for i, conn in enumerate(conns[2:], start=2):
            outcomes[i] = firsts[i : i + 1] + await conn.until("result", is_final=True)
        nursery.cancel_scope.cancel()
    for i, seen in outcomes.items():
        results = [m for m in seen if m["type"] == "result"]
        assert result_tokens(results) == expected, f"client {i}"
        positions = [m["position"] for m in seen if m["type"] == "queued"]
        assert positions == sorted(positions, reverse=True), f"client {i}: {positions}"
        if i >= 2:
            hello = next(j for j, m in enumerate(seen) if m["type"] == "hello")
            assert positions[-1] >= 1 and hello > 0
    assert ctx.engine.stats()["active"] == 0


async def _hold_open(address: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with Raw.open(address) as conn:
        task_status.started(conn)
        await trio.sleep_forever()


async def test_full_queue_refused_with_1013_and_queue_full(two_slots, wavs):
    async with running_server(two_slots) as ctx, trio.open_nursery() as nursery:
        held = [await nursery.start(_hold_open, url(ctx, "tcp")) for _ in range(5)]
        for conn in held:
            await conn.recv()
        async with Raw.open(url(ctx, "ws")) as ws:
            assert await ws.rest() == [
                {"type": "error", "code": "queue_full", "message": "every slot is busy and the waiting queue is full"}
            ]
            assert ws.close_code == 1013
        async with Raw.open(url(ctx, "ws", "/v1/realtime")) as rt:
            refused = await rt.rest()
            assert refused[0]["code"] == "queue_full" and rt.close_code == 1013
        async with Raw.open(url(ctx, "tcp")) as tcp:
            assert [m["code"] for m in await tcp.rest()] == ["queue_full"]
        assert ctx.engine.stats() | MOVING == {
            "active": 2, "queued": 3, "free_slots": 0, "capacity": 2, "max_num_streams": 2, "max_queue": 3,
            "audio_seconds": 0, "stalled": None, **MOVING,
        }
        nursery.cancel_scope.cancel()
    assert ctx.metrics.errors.labels("queue_full")._value.get() == 3


async def test_queued_client_leaving_moves_the_others_up(two_slots):
    async with running_server(two_slots) as ctx, trio.open_nursery() as nursery:
        for _ in range(2):
            await (await nursery.start(_hold_open, url(ctx, "tcp"))).recv()
        async with Raw.open(url(ctx, "tcp")) as leaving:
            assert (await leaving.recv())["position"] == 1
            waiting = await nursery.start(_hold_open, url(ctx, "ws"))
            assert (await waiting.recv())["position"] == 2
        # default estimate before any stream finished: 10 s per slot hold, 2 slots
        assert await waiting.recv() == {"type": "queued", "position": 1, "estimated_wait_s": 5.0}
        nursery.cancel_scope.cancel()
