"""The step cost measured at start-up, before any client: what admission extrapolates from.

Admission lets a live stream in only while the step cost line (policy.StepCost: a round's fixed
part and its part per stream) predicts a round of every live stream within the chunk period. Its
line needs steps of two batch sizes; a fresh replica without them admits by slots and pace alone,
so a burst of clients on a machine that serves one got twenty slots in its first two seconds, and
every one of them fell seconds behind. Here, before the stage threads start, the engine runs whole
steps (`ASREngine.step`) of one stream and of `STREAMS` streams of low-level noise in the server's
lookahead: each stream's first chunk (its window is wider and its state starts over: dearer than
the chunks a running server steps through, so not kept), then `STEADY` steady chunks, the cheapest
of which is kept for each size. A first chunk's cost made the line say 10-16 streams where the
same machine holds 24; steady chunks are what a running server's steps are made of.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .admission import HEADROOM

log = logging.getLogger(__name__)

STREAMS = 16  # the larger batch measured (at most the Scheduler's PROVEN: every one of them is admitted at once)
STEADY = 2  # steady steps per size, the cheapest kept (the first after a first chunk may still pay for allocations)
TIMEOUT_S = 60.0  # no more sizes measured past this: admission learns from live steps instead


def calibrate(engine, streams: int = STREAMS, timeout: float = TIMEOUT_S) -> dict[int, float] | None:
    """Measure a steady round at one and at `streams` streams (fewer where the slots or the batch
    limit are fewer) on an ASREngine whose stage threads have not started and that has no client;
    seed its Scheduler's step cost with them and return {batch: seconds}, or None where a step failed
    or the time ran out (admission then learns from the first live steps)."""
    scheduler = engine.scheduler
    n = min(streams, scheduler.max_num_streams, scheduler.max_batch)
    started, measured = time.monotonic(), {}
    try:
        for size in dict.fromkeys((1, n)):
            if time.monotonic() - started > timeout:
                raise CalibrationFailed(f"more than {timeout:.0f} s")
            scheduler.forget_steps()  # (a slow step's lateness must not hold the next size's admission)
            measured[size] = _steady_round(engine, size)
    except CalibrationFailed as exc:
        log.warning("step cost not measured at start-up (%s): admission learns it from the first streams", exc)
        measured = {}
    finally:
        scheduler.forget_steps()
        engine.forget_streams()
    if len(measured) < 2 and n > 1:
        return None
    for size, seconds in measured.items():
        scheduler.cost.record(size, seconds)
    period = engine.chunk_seconds()
    capacity = scheduler.cost.most_streams(HEADROOM * period, scheduler.max_num_streams)
    log.info("step cost measured at start-up in %.1f s: %s; admission serves %d live stream(s) of %.0f ms chunks",
             time.monotonic() - started, ", ".join(f"{b} stream(s) {s * 1000:.1f} ms" for b, s in measured.items()),
             max(1, capacity), period * 1000)
    return measured


class CalibrationFailed(Exception):
    pass


def _steady_round(engine, n: int) -> float:
    """Seconds of the cheapest of STEADY steps of `n` new streams' steady chunks (after their first
    chunks' step); the streams are cancelled after."""
    first, more = engine.info.ready_samples[engine.default_lookahead]
    rng = np.random.default_rng(n)
    sids = [engine.create_stream() for _ in range(n)]
    try:
        if engine.queue_position(sids[-1]):
            raise CalibrationFailed(f"{n} stream(s) were not all admitted")
        seconds = []
        for size in (first, *[more] * STEADY):
            for sid in sids:
                engine.push_audio(sid, (rng.standard_normal(size) * 1e-3).astype(np.float32))
            start = time.perf_counter()
            step = engine.step()
            seconds.append(time.perf_counter() - start)
            if step is None or len(step) != n or any(r.error for sid in sids for r in engine.collect(sid)):
                raise CalibrationFailed(f"a step of {n} stream(s) failed")
        return min(seconds[1:])
    finally:
        for sid in sids:
            engine.cancel(sid)
