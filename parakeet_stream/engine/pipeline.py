"""The stage threads: one thread per `Stage`, joined by FIFO queues, a step in flight per stage thread.

A `Stage` runs one or more of the engine's stages in turn (on a CPU whose every core is in the
encoder's team, one thread runs them all, one step at a time). The first thread takes each step
from `schedule`; every thread runs its stages on the step, timing each under its name in
`step.seconds`, and hands it to the next; after the last, `deliver` runs on the last thread. A
stage that raises hands its step to `fail` instead, so only that step's streams fail. FIFO
queues keep a stream's steps in order.

A stage that never returns (a GPU kernel that never ends: the host waits on the device forever)
fails no step and raises nothing, so a watchdog thread looks at every stage's run in progress:
past `stall_seconds` on one step it logs the stage, the step's batches and, on CUDA, the first
operation the device has not passed (the step's marks, runner/cuda_streams.py), once per stall; `stalled()`
says so to the engine's health.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from ..host import stage_threads, stages_beside
from .runner.cuda_streams import device_at
from .step import Step

log = logging.getLogger(__name__)

# Steps in flight (the Scheduler starts no more): one per stage thread, so that every stage works
# on a step of its own (pre-encode prepares the next while one encodes and another decodes). With
# two, the pre-encode thread sat idle until the oldest step's decode was done: at 2,048 streams
# (benchmarks.host --service) steps alternated large and small and latency grew to seconds with
# the host's threads half idle (docs/performance.md).
DEPTH = 3
_STOP = object()
# A stage's run on one step longer than this (or than STALL_FACTOR times the longest run that ended)
# is a stall: a GPU step takes milliseconds and a CPU step of `large` at its largest batch about 2 s,
# and an orchestrator should restart a replica whose device no longer answers rather than let its
# streams wait; a machine whose steps are slow by nature raises its own limit.
STALL_SECONDS = 15.0
STALL_FACTOR = 10.0
WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Stage:
    name: str  # its thread's
    runs: tuple[tuple[str, Callable[[Step], None]], ...]  # in order on each step, each timed under its name
    threads: int | None = None  # intra-op threads of its thread (None: torch's default)
    setup: Callable[[], None] | None = None  # first thing in its thread (CUDA: the device and the stage's stream)


@dataclass(frozen=True)
class Stall:
    """A stage's run on one step, going on for longer than the pipeline's `stall_seconds`."""

    thread: str
    stage: str
    seconds: float
    streams: int
    batches: tuple[str, ...]  # "mode x rows", round by round
    device_at: str | None  # CUDA: the first marked operation the device has not finished

    def describe(self) -> str:
        where = f"; the device has not finished: {self.device_at}" if self.device_at else ""
        return (f"stage {self.stage} (thread {self.thread}) on one step for {self.seconds:.0f} s: {self.streams} "
                f"stream(s), batches {', '.join(self.batches) or 'none yet'}{where}")

    def as_dict(self) -> dict:
        return {"stage": self.stage, "thread": self.thread, "seconds": round(self.seconds, 1), "streams": self.streams,
                "batches": list(self.batches), "device_at": self.device_at}


class Pipeline:
    def __init__(self, schedule: Callable[[], Step | None], stages: list[Stage],
                 deliver: Callable[[Step], None], fail: Callable[[Step], None],
                 device_at: Callable[[Step], str | None] = lambda step: None, stall_seconds: float = STALL_SECONDS):
        self._deliver, self._fail, self._device_at = deliver, fail, device_at
        self.stall_seconds = stall_seconds
        self._busy: dict[str, tuple[str, Step, float]] = {}  # thread -> its run in progress (stage, step, since)
        self._longest = 0.0  # seconds: the longest run of a stage on one step that ended
        queues = [queue.Queue() for _ in stages[1:]]
        takes = [schedule] + [q.get for q in queues]
        self._threads = [
            threading.Thread(target=self._loop, args=(stage, take, out), name=stage.name, daemon=True)
            for stage, take, out in zip(stages, takes, queues + [None])
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def join(self, timeout: float) -> None:
        """After `schedule` returned None: each thread passes the stop on and ends."""
        for t in self._threads:
            t.join(timeout=timeout)

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def stalled(self) -> Stall | None:
        """The longest run in progress past the stall limit (`stall_seconds`, or STALL_FACTOR times the
        longest run that ended), or None."""
        now, busy = time.perf_counter(), list(self._busy.items())
        if not busy:
            return None
        thread, (stage, step, since) = min(busy, key=lambda run: run[1][2])
        if now - since < max(self.stall_seconds, STALL_FACTOR * self._longest):
            return None
        batches = tuple(f"{tuple(b.mode)} x {len(b.items)}" for b in step.batches)
        return Stall(thread, stage, now - since, len(step), batches, self._device_at(step))

    def _watch(self) -> None:
        """Logs each stall once, and its end."""
        reported: Stall | None = None
        while any(t.is_alive() for t in self._threads):
            time.sleep(WATCH_INTERVAL_S)
            stall = self.stalled()
            if stall is not None and (reported is None or (stall.thread, stall.stage) != (reported.thread, reported.stage)):
                log.error("stalled: %s", stall.describe())
            elif stall is None and reported is not None:
                log.warning("stage %s went on after a stall of more than %.0f s", reported.stage, reported.seconds)
            reported = stall

    def _loop(self, stage: Stage, take: Callable, out: queue.Queue | None) -> None:
        if stage.threads is not None:  # per thread: on CPU each thread has its own OpenMP team
            # a thread's first get initialises its team from the process-wide count that the other
            # stages set last (1): done first here, so the count set next is the one that stays
            torch.get_num_threads()
            torch.set_num_threads(stage.threads)
        if stage.setup is not None:
            stage.setup()
        while True:
            step = take()
            if step is None or step is _STOP:
                if out is not None:
                    out.put(_STOP)
                return
            if not self.run(stage, step):
                continue
            if out is not None:
                out.put(step)
            else:
                self._deliver(step)

    def run(self, stage: Stage, step: Step) -> bool:
        """`stage`'s runs on `step` in order, each timed under its name and watched; False where one
        raised (the step went to `fail`: only its streams fail)."""
        try:
            with torch.inference_mode():
                for name, run in stage.runs:
                    start = time.perf_counter()
                    self._busy[stage.name] = (name, step, start)
                    run(step)
                    step.seconds[name] = time.perf_counter() - start
                    self._longest = max(self._longest, step.seconds[name])
        except Exception as exc:  # noqa: BLE001 - a model fault must not kill the thread
            log.error("inference failed for %d stream(s): %r", len(step), exc)
            self._fail(step)
            return False
        finally:
            self._busy.pop(stage.name, None)
        return True


def route(device: torch.device, threads: int | None, runs: list[tuple[str, Callable[[Step], None]]],
          enter: Callable[[str], None], schedule: Callable[[], Step | None], deliver: Callable[[Step], None],
          fail: Callable[[Step], None]) -> Pipeline:
    """A step's stages (`runs`: pre-encode, encode, then decode and the rest) spread over threads:
    pre-encode, encode, and decode with the rest, each on its own thread, `enter` first on each (CUDA:
    its stream); where the encoder's team takes every core (host.stages_beside), all of them on one
    thread, one step at a time."""
    team = stage_threads(device, encoder=True, threads=threads)
    alone = stage_threads(device, encoder=False, threads=threads)
    pre_encode, encode, *decode = runs
    if stages_beside(device, team):
        stages = [Stage("pre-encode", (pre_encode,), alone, partial(enter, "pre-encode")),
                  Stage("encode", (encode,), team, partial(enter, "encode")),
                  Stage("decode", tuple(decode), alone, partial(enter, "decode"))]
    else:  # on a CPU whose every core is in the encoder's team: step() on one thread, in a loop
        stages = [Stage("step", (pre_encode, encode, *decode), team)]
    return Pipeline(schedule=schedule, stages=stages, deliver=deliver, fail=fail, device_at=device_at)
