"""The stage threads (engine/pipeline.py): a step in flight for each, and the watchdog that says when
one stage's run on one step is a stall."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from parakeet_stream.engine.inbox import Inbox
from parakeet_stream.engine.pipeline import DEPTH, STALL_FACTOR, Pipeline, Stage
from parakeet_stream.engine.runner.cuda_streams import device_at
from parakeet_stream.engine.scheduler import Scheduler
from parakeet_stream.engine.sequence import Sequence
from parakeet_stream.engine.step import Step
from parakeet_stream.model.conformer import chunk_spec


def test_each_stage_thread_works_on_a_step_of_its_own():
    """While one step decodes and the next encodes, a third is planned and pre-encoded (with fewer
    steps in flight than stage threads, the pre-encode thread would wait for the oldest one)."""
    sch = Scheduler(2, 2, target=0.32, sample_rate=16000, max_in_flight=DEPTH)
    inbox = Inbox(chunk_spec((70, 1), 8), 160, 512)
    sch.add(Sequence(1, (70, 1), inbox, front=None, decoding=None))
    pre_encoded, held, release = queue.Queue(), {"encode": threading.Event(), "decode": threading.Event()}, threading.Event()

    def hold(stage: str, after: str | None = None):  # holds its steps (from the one after `after` held one)
        def run(step: Step) -> None:
            if after is None or held[after].is_set():
                held[stage].set()
                release.wait(10)
        return run

    stages = [Stage("pre-encode", (("pre-encode", pre_encoded.put),)), Stage("encode", (("encode", hold("encode", after="decode")),)),
              Stage("decode", (("decode", hold("decode")),))]
    pipeline = Pipeline(sch.schedule, stages, sch.postprocess, lambda step: sch.postprocess(step, failed=True))
    pipeline.start()
    try:
        for chunk in range(3):  # a chunk at a time, each one step
            inbox.add(np.zeros(inbox.samples_for(chunk) - inbox.samples_in, np.float32))
            sch.chunk_ready()
            pre_encoded.get(timeout=5)
            if chunk < 2:
                assert held[("decode", "encode")[chunk]].wait(5)  # the first holds decode, the second encode
        assert not release.is_set() and len(sch.planner.in_flight) == 3
    finally:
        release.set()
        sch.stop()
        pipeline.join(5)


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
