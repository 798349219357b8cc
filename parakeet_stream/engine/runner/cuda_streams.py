"""The stage threads' CUDA streams: each stage queues its kernels on its own stream, and a step's
stages follow each other through an event the previous stage recorded on it. So the device runs
one step's decode beside the next one's encode, and no stage waits on the host for another.

Each stage also marks its operations on a step (an event after each): where a stage waits on the
device forever, the first mark the device has not passed names the operation that never ended.

On CPU there is nothing to order or mark: every method does nothing.
"""

from __future__ import annotations

import torch

from ..step import Step


class StageStreams:
    def __init__(self, device: torch.device, stages: list[str]):
        self.device = device
        self.cuda = device.type == "cuda"
        self._streams = {name: torch.cuda.Stream(device) for name in stages} if self.cuda else {}

    def stream(self, stage: str) -> torch.cuda.Stream:
        """The stage's stream (CUDA only): where its graphs are captured and replayed."""
        return self._streams[stage]

    def enter(self, stage: str) -> None:
        """First thing in a stage's thread: the engine's device (not device 0) and the stage's stream."""
        if self.cuda:
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self._streams[stage])

    def follow(self, step: Step) -> None:
        """Before a stage's work on `step`: its kernels queue behind the previous stage's."""
        if self.cuda and step.done is not None:
            torch.cuda.current_stream(self.device).wait_event(step.done)

    def hand_on(self, step: Step, to: str) -> None:
        """After a stage's work on `step`: the next stage (`to`) may follow. The step's tensors are
        marked as used on its stream, so the allocator does not reuse them under its kernels."""
        if self.cuda:
            for batch in step.batches:
                for t in batch.tensors():
                    t.record_stream(self._streams[to])
            step.done = torch.cuda.Event()
            step.done.record(torch.cuda.current_stream(self.device))

    def mark(self, step: Step, operation: str, rows: int, mode=None) -> None:
        """After `operation`'s work on `rows` (of lookahead `mode`) was queued on this stage's stream: an
        event the device passes when done. Named only when read (`device_at`): nothing per step on CPU."""
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
            step.marks.append(((operation, rows, mode), event))


def device_at(step: Step) -> str | None:
    """The first of the step's marked operations the device has not finished (None: all, or no marks)."""
    for (operation, rows, mode), event in list(step.marks):
        if not event.query():
            return f"{operation} {tuple(mode)} x {rows}" if mode is not None else f"{operation} x {rows}"
    return None
