"""The step cost measured when the engine starts (engine/calibration.py): a burst of clients on a
fresh engine is admitted within what its steps serve, before any step of theirs ran."""

from __future__ import annotations

import time

import numpy as np

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.scheduler import HEADROOM, PROVEN

FIXED, PER_STREAM = 0.02, 0.01  # seconds the slowed encode stage adds to a step


def slowed(engine: ASREngine, fail_first: bool = False) -> list[int]:
    """The engine's encode stage made FIXED + PER_STREAM a stream slower (a slower machine); with
    `fail_first`, its first step raises. Returns the batch size of every step it ran."""
    encode, batches = engine.runner.encode, []

    def slow(step):
        batches.append(len(step))
        if fail_first and len(batches) == 1:
            raise RuntimeError("a broken first step")
        time.sleep(FIXED + PER_STREAM * len(step))
        encode(step)

    engine.runner.encode = slow
    return batches


def test_a_fresh_engine_admits_a_burst_within_the_step_cost_it_measured_before_any_client():
    engine = ASREngine("demo", "cpu", max_num_streams=32, max_queue=32)
    batches = slowed(engine)
    with engine:
        assert batches == [1, 1, 16]  # cold, then the two sizes kept
        serves = int((HEADROOM * engine.chunk_seconds() - FIXED) / PER_STREAM)  # the model's own time comes on top
        sids = [engine.create_stream() for _ in range(24)]
        admitted = [engine.queue_position(sid) == 0 for sid in sids]
        n = sum(admitted)
        assert admitted == [True] * n + [False] * (24 - n)
        assert 1 <= n <= serves < PROVEN  # without the measurement: PROVEN and more, by slots and pace alone
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
