"""The stage threads: one thread per `Stage`, joined by FIFO queues, two steps in flight.

A `Stage` runs one or more of the engine's stages in turn (on a CPU whose every core is in the
encoder's team, one thread runs them all, one step at a time). The first thread takes each step
from `schedule`; every thread runs its stages on the step, timing each under its name in
`step.seconds`, and hands it to the next; after the last, `deliver` runs on the last thread. A
stage that raises hands its step to `fail` instead, so only that step's streams fail. FIFO
queues keep a stream's steps in order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .step import Step

log = logging.getLogger(__name__)

# Steps in flight (the Scheduler starts no more): with a thread per stage, one step's decode
# overlaps the next one's encode, and on CUDA the host prepares a step while the device runs the other.
DEPTH = 2
_STOP = object()


@dataclass(frozen=True)
class Stage:
    name: str  # its thread's
    runs: tuple[tuple[str, Callable[[Step], None]], ...]  # in order on each step, each timed under its name
    threads: int | None = None  # intra-op threads of its thread (None: torch's default)
    setup: Callable[[], None] | None = None  # first thing in its thread (CUDA: the device and the stage's stream)


class Pipeline:
    def __init__(self, schedule: Callable[[], Step | None], stages: list[Stage],
                 deliver: Callable[[Step], None], fail: Callable[[Step], None]):
        self._deliver, self._fail = deliver, fail
        queues = [queue.Queue() for _ in stages[1:]]
        takes = [schedule] + [q.get for q in queues]
        self._threads = [
            threading.Thread(target=self._loop, args=(stage, take, out), name=stage.name, daemon=True)
            for stage, take, out in zip(stages, takes, queues + [None])
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        """After `schedule` returned None: each thread passes the stop on and ends."""
        for t in self._threads:
            t.join(timeout=timeout)

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

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
            try:
                with torch.inference_mode():
                    for name, run in stage.runs:
                        start = time.perf_counter()
                        run(step)
                        step.seconds[name] = time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001 - a model fault must not kill the thread
                log.error("inference failed for %d stream(s): %r", len(step), exc)
                self._fail(step)
                continue
            if out is not None:
                out.put(step)
            else:
                self._deliver(step)
