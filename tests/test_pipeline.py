"""The stage threads' watchdog (engine/pipeline.py): when one stage's run on one step is a stall."""

from __future__ import annotations

import queue
import threading
import time

from parakeet_stream.engine.pipeline import STALL_FACTOR, Pipeline, Stage
from parakeet_stream.engine.step import Step
from parakeet_stream.engine.runner.cuda_streams import device_at


def test_a_stage_whose_steps_are_slow_by_nature_raises_its_own_stall_limit():
    steps, release, delivered = queue.Queue(), threading.Event(), []

    def work(step: Step) -> None:  # the first step takes 0.2 s, the second waits for the test
        time.sleep(0.2) if not delivered else release.wait(10)

    pipeline = Pipeline(steps.get, [Stage("only", (("work", work),))], delivered.append, lambda step: None,
                        stall_seconds=0.1)
    pipeline.start()
    try:
        steps.put(Step([], time.monotonic()))
        while not delivered:
            time.sleep(0.01)
        steps.put(Step([], time.monotonic()))
        time.sleep(0.5)  # past stall_seconds, within STALL_FACTOR x the 0.2 s step
        assert pipeline.stalled() is None
        time.sleep(STALL_FACTOR * 0.2 + 1.0)  # past it, with room for a first step slower than asked
        stall = pipeline.stalled()
        assert stall is not None and stall.stage == "work" and stall.thread == "only" and stall.seconds >= 2.0
    finally:
        release.set()
        steps.put(None)
        pipeline.join(5)
    assert len(delivered) == 2 and pipeline.stalled() is None


class _Event:  # what device_at asks of a CUDA event
    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


def test_a_stall_names_the_first_marked_operation_the_device_has_not_finished():
    step = Step([], 0.0)
    assert device_at(step) is None  # no marks: CPU
    step.marks = [(("encoder cache reset", 3, None), _Event(True)), (("encode", 40, (70, 1)), _Event(False)),
                  (("encode", 12, (70, 13)), _Event(False))]
    assert device_at(step) == "encode (70, 1) x 40"
    step.marks[0] = (("encoder cache reset", 3, None), _Event(False))
    assert device_at(step) == "encoder cache reset x 3"
