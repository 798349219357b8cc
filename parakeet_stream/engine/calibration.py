"""The step cost measured at start-up, before any client: what admission extrapolates from.

Admission lets a live stream in only while the step cost line (policy.StepCost: a round's fixed
part and its part per stream) predicts a round of every live stream within the chunk period. Its
line needs steps of two batch sizes; a fresh replica without them admitted by slots and pace
alone, so a burst of clients on a machine that serves one got twenty slots in its first two
seconds, and every one of them fell seconds behind. Here the engine runs, through its own
stages and threads, one cold step (first-call allocations, kernel plans), then a step of one
stream and a step of `STREAMS` streams of the server's lookahead, each a first chunk of
low-level noise, and keeps those two measurements: the first client already meets the capacity
the machine has.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .scheduler import HEADROOM

log = logging.getLogger(__name__)

# the larger step measured (at most the Scheduler's PROVEN: every one of them is admitted at once)
STREAMS = 16
TIMEOUT_S = 120.0  # a step that takes longer is not waited for: admission learns from live steps instead


def calibrate(engine, streams: int = STREAMS, timeout: float = TIMEOUT_S) -> dict[int, float] | None:
    """Measure the step at one and at `streams` streams (fewer where the slots or the batch limit
    are fewer) on a started ASREngine (asr_engine.py, which calls this) with no client yet; returns
    {batch: seconds}, or None where a step failed or took longer than `timeout` (admission then
    learns from the first live steps)."""
    scheduler = engine.scheduler
    n = min(streams, scheduler.max_num_streams, scheduler.max_batch)
    started = time.monotonic()
    try:
        _one_step(engine, 1, started + timeout)  # cold: what a first call costs is not a step's cost
        scheduler.forget_steps()
        for size in dict.fromkeys((1, n)):
            _one_step(engine, size, started + timeout)
    except CalibrationFailed as exc:
        scheduler.forget_steps()
        log.warning("step cost not measured at start-up (%s): admission learns it from the first streams", exc)
        return None
    finally:
        engine.forget_streams()
    measured = scheduler.cost.measured_steps()
    period = engine.chunk_seconds()
    capacity = scheduler.cost.most_streams(HEADROOM * period, scheduler.max_num_streams)
    log.info("step cost measured at start-up in %.1f s: %s; admission serves %d live stream(s) of %.0f ms chunks",
             time.monotonic() - started, ", ".join(f"{b} stream(s) {s * 1000:.1f} ms" for b, s in measured.items()),
             max(1, capacity), period * 1000)
    return measured


class CalibrationFailed(Exception):
    pass


def _one_step(engine, n: int, deadline: float) -> None:
    """One step of `n` new streams' first chunks, waited for; the streams are cancelled after."""
    first, _ = engine.info.ready_samples[engine.default_lookahead]
    noise = (np.random.default_rng(n).standard_normal(first) * 1e-3).astype(np.float32)
    sids = [engine.create_stream() for _ in range(n)]
    try:
        if engine.queue_position(sids[-1]):
            raise CalibrationFailed(f"{n} stream(s) were not all admitted")
        with engine.scheduler.held():  # one step for all of them
            for sid in sids:
                engine.push_audio(sid, noise)
        for sid in sids:
            _wait_for_chunk(engine, sid, deadline)
    finally:
        for sid in sids:
            engine.cancel(sid)


def _wait_for_chunk(engine, sid: int, deadline: float) -> None:
    while True:
        results = engine.collect(sid)
        if any(r.error for r in results):
            raise CalibrationFailed(f"the step failed: {next(r.error for r in results if r.error)}")
        if any(r.latency is not None for r in results):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise CalibrationFailed("no result in time")
        engine.wait_for_update(sid, left)
