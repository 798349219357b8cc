"""A step: the chunks of the streams the Scheduler chose to run together, and what each stage adds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .results import StreamResult
from .sequence import DEAD, Sequence


@dataclass
class StepItem:
    """One stream's share of a step: the Scheduler fills the first fields, each stage adds its output."""

    seq: Sequence
    slot: int
    chunks: int  # ready chunks to cut; with `last`, everything left
    last: bool  # the stream's last step: its partial last chunk too, then its final result
    first: bool  # the stream's first chunk is in it: its slot's state starts over
    ready_times: list[float]  # arrival of the last sample each ready chunk needed
    final_at: float | None  # the client's final: the deadline's start for chunks cut at the end
    samples_upto: int | None  # samples of the stream its chunks need (None: all, in its last step)
    pre: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # pre-encode: (x, valid frames) per chunk
    encoded: list[torch.Tensor] = field(default_factory=list)  # encode: encoder frames per chunk
    tokens: list[list[tuple[int, int]]] = field(default_factory=list)  # decode: (id, frame in chunk) per chunk

    @property
    def live(self) -> bool:
        return self.seq.status not in DEAD


@dataclass
class Step:
    items: list[StepItem]
    started: float
    seconds: dict[str, float] = field(default_factory=dict)  # time spent in each stage
    results: list[tuple[Sequence, StreamResult]] = field(default_factory=list)  # built after decode

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
