"""A step's way through the engine once the Scheduler picked it: the runner's stages, the results,
then its delivery (postprocess, publish), on the stage threads (pipeline.py) or, for a caller that
drives the engine itself, on its own thread (`step`). It also sums every delivered step's work.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

import torch

from .diarizer import Diarizer
from .pipeline import Stage, route
from .results import ResultBuilder, StreamResult
from .runner.model_runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence
from .step import Step, StepTotals

log = logging.getLogger(__name__)


class StepRoute:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, results: ResultBuilder, diarizer: Diarizer | None,
                 device: torch.device, threads: int | None, forget: Callable[[Iterable[int]], None]):
        """forget: drops streams whose final result went to their sink from the engine's streams."""
        self.scheduler, self.runner, self.results, self.diarizer, self._forget = scheduler, runner, results, diarizer, forget
        self.stages = self._stages()
        self.pipeline = route(device, threads, self.stages, runner.cuda_streams.enter,
                              schedule=scheduler.schedule, deliver=self.deliver, fail=self.fail)
        self._whole_step = Stage("step", tuple(self.stages))
        self._lock = threading.Lock()
        self.forget_totals()

    def _stages(self) -> list[tuple[str, Callable[[Step], None]]]:
        """What runs on a step once the Scheduler picked it (`Scheduler.schedule`), in order, each
        timed under its name; `deliver` then ends it: postprocess (slots released, waiters
        admitted), then publish. The runner's stages are looked up at each step, so replacing one
        (fault injection) works."""
        runner = self.runner
        stages = [
            ("pre-encode", lambda step: runner.pre_encode(step)),  # features, subsampling
            ("encode", lambda step: runner.encode(step)),  # the cache-aware layers
            ("decode", lambda step: runner.decode(step)),  # greedy RNN-T: tokens
            ("results", lambda step: step.build_results(self.results)),  # tokens -> text, times, end of utterance
        ]
        if self.diarizer is not None:  # speaker probabilities; diarized streams' results held until covered
            stages.append(("diarize", lambda step: self.diarizer.run(step)))
        return stages

    def step(self) -> Step | None:
        """One whole step on the calling thread (None once the engine stopped)."""
        step = self.scheduler.schedule()  # the streams to run and their chunks (blocks until there are)
        if step is not None and self.pipeline.run(self._whole_step, step):  # model stages, then results
            self.deliver(step)  # postprocess (slots freed, waiters admitted), then publish
        return step

    def forget_totals(self) -> None:
        with self._lock:
            # every stage in /metrics from the start
            self._totals = StepTotals(seconds=dict.fromkeys([name for name, _ in self.stages], 0.0))

    def totals(self) -> StepTotals:
        """The work of every step delivered so far (a copy): steps, chunks encoded, seconds per stage."""
        with self._lock:
            return StepTotals(self._totals.steps, self._totals.chunks, dict(self._totals.seconds))

    def deliver(self, step: Step) -> None:
        if log.isEnabledFor(logging.DEBUG):
            ms = {k: round(v * 1000, 1) for k, v in step.seconds.items()}
            wall = (time.monotonic() - step.started) * 1000
            log.debug("step: %d streams, %d results, %s ms, %.1f ms wall", len(step), len(step.results), ms, wall)
        _, changed = self.scheduler.postprocess(step)  # first, so a slot is free once its final result is out
        with self._lock:
            self._totals.add(step)
        for seq, result in step.results:
            seq.outbox.publish(result, notify=False)
        if step.rows:
            live = not all(item.seq.bulk for item in step)
            for sink, rows in step.rows:
                sink.put(rows, live)
            self._forget(sid for _, rows in step.rows for sid in rows.sids[rows.final].tolist())
        for seq in dict.fromkeys([*(seq for seq, _ in step.results), *changed]):  # listeners: news of the step
            seq.outbox.notify()

    def fail(self, step: Step) -> None:
        """A stage raised on `step`: its streams alone end with `inference_error`."""
        failed, changed = self.scheduler.postprocess(step, failed=True)
        for seq in failed:
            seq.outbox.publish(StreamResult(seq.stream_id, [], "", is_final=True, error="inference_error"))
        notify(changed)


def notify(seqs: list[Sequence]) -> None:
    """Tell the streams' listeners of news: results, or a slot or queue place that changed."""
    for seq in seqs:
        seq.outbox.notify()
