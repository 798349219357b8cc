"""The step cost measured when the engine starts (engine/calibration.py): a burst of clients on a
fresh engine is admitted within what its steady steps serve, before any step of theirs ran."""

from __future__ import annotations

import time

import numpy as np

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.admission import HEADROOM, PROVEN

FIXED, PER_STREAM = 0.02, 0.01  # seconds the slowed encode stage adds to a step
FIRST = 0.02  # and to each stream's first chunk on top (a first chunk costs more than a steady one)


def slowed(engine: ASREngine, fail_first: bool = False) -> list[tuple[int, bool]]:
    """The engine's encode stage made FIXED + PER_STREAM a stream slower (a slower machine), FIRST more
    a first chunk; with `fail_first`, its first step raises. Returns (batch size, of first chunks)
    of every step it ran."""
    encode, steps = engine.runner.encode, []

    def slow(step):
        first = all(item.first for item in step)
        steps.append((len(step), first))
        if fail_first and len(steps) == 1:
            raise RuntimeError("a broken first step")
        time.sleep(FIXED + (PER_STREAM + FIRST * first) * len(step))
        encode(step)

    engine.runner.encode = slow
    return steps


def test_a_fresh_engine_admits_a_burst_within_the_steady_step_cost_it_measured_before_any_client():
    engine = ASREngine("demo", "cpu", max_num_streams=32, max_queue=32)
    steps = slowed(engine)
    with engine:
        assert steps == [(1, True), (1, False), (1, False), (16, True), (16, False), (16, False)]
        serves = int((HEADROOM * engine.chunk_seconds() - FIXED) / PER_STREAM)  # the model's own time comes on top
        with_first = int((HEADROOM * engine.chunk_seconds() - FIXED) / (PER_STREAM + FIRST))
        sids = [engine.create_stream() for _ in range(24)]
        admitted = [engine.queue_position(sid) == 0 for sid in sids]
        n = sum(admitted)
        assert admitted == [True] * n + [False] * (24 - n)
        assert with_first < n <= serves < PROVEN  # steady steps' cost; without it: PROVEN and more
        assert engine.stats()["capacity"] == n
        assert sids[0] == 1 and engine.step_totals().steps == 0  # the measurement left no trace
        engine.push_audio(sids[0], np.zeros(engine.sample_rate, np.float32))  # and the engine serves
        engine.finalize(sids[0])
        deadline = time.monotonic() + 30
        while not any(r.is_final for r in engine.collect(sids[0])) and time.monotonic() < deadline:
            engine.wait_for_update(sids[0], 1.0)
        assert engine.step_totals().steps >= 1


def test_a_failed_measurement_is_logged_and_admission_learns_from_the_first_streams(caplog):
    caplog.set_level("WARNING", logger="parakeet_stream.engine.calibration")
    engine = ASREngine("demo", "cpu", max_num_streams=8, max_queue=8)
    slowed(engine, fail_first=True)
    with engine:
        assert any("step cost not measured at start-up" in r.getMessage() for r in caplog.records)
        assert not engine.scheduler.cost.measured
        assert all(engine.queue_position(engine.create_stream()) == 0 for _ in range(8))  # slots and pace decide
