"""A step: the chunks of the streams the Scheduler chose to run together, and what each stage adds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..model.config import Lookahead
from .result_rows import ResultRows
from .results import ResultBuilder, StreamResult
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
    frames: list[int] = field(default_factory=list)  # pre-encode: valid encoder frames per chunk
    tokens: list[list[tuple[int, int, float]]] = field(default_factory=list)  # decode: (id, frame in chunk, probability) per chunk
    eou: list[float] = field(default_factory=list)  # decode: <EOU>'s probability since the last other token, per chunk
    final_tokens: list[tuple[int, int, float]] | tuple = ()  # decode: a beam's rest, at its end (no list per item)

    @property
    def live(self) -> bool:
        return self.seq.status not in DEAD


@dataclass
class Batch:
    """The chunks of one round of a step in one lookahead mode, a row per stream: what the
    encoder and the decoder each run at once. Pre-encode makes it; encode adds `encoded`."""

    mode: Lookahead
    items: list[StepItem]
    x: torch.Tensor  # pre-encoded chunks [rows, T, D]
    lengths: torch.Tensor  # [rows] valid frames, on the device (the host's are the items' `frames`)
    slots: torch.Tensor  # [rows] on the device
    encoded: torch.Tensor | None = None  # [rows, T, D]
    round: int = 0  # a stream's chunks in a step: round 0, 1, ... (a stream has one chunk per round)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.x, self.lengths, self.slots, self.encoded) if t is not None]


@dataclass
class Step:
    items: list[StepItem]
    started: float
    predicted_end: float | None = None  # a step with live chunks: when the Scheduler expected it done
    predicted_seconds: float = 0.0  # what the Scheduler's timeline counted for it
    seconds: dict[str, float] = field(default_factory=dict)  # time spent in each stage
    batches: list[Batch] = field(default_factory=list)  # pre-encode: round by round, each round's modes
    results: list[tuple[Sequence, StreamResult]] = field(default_factory=list)  # built after decode
    rows: list[tuple[Any, ResultRows]] = field(default_factory=list)  # after decode: each sink's (Sequence.sink)
    diarized: list[tuple[StepItem, Any]] = field(default_factory=list)  # pre-encode: diarized streams' new samples
    done: Any = None  # CUDA: the event after the last stage's work on it (runner/cuda_streams.py)
    marks: list[tuple[tuple, Any]] = field(default_factory=list)  # CUDA: ((operation, rows, mode), event after it), runner/cuda_streams.py

    def build_results(self, builder: ResultBuilder) -> None:
        """Each chunk's result from its new tokens; a stream's last step adds its final result. A
        stream with a sink gets them as rows, its sink's streams' in one ResultRows."""
        now, sunk, build = time.monotonic(), {}, builder.build
        for item in self.items:
            if not item.live:
                continue
            seq = item.seq
            if seq.sink is not None:
                sunk.setdefault(seq.sink, []).extend(_rows(item, now))
                continue
            for r, tokens in enumerate(item.tokens):
                self.results.append((seq, build(seq.stream_id, seq.decoding, tokens, item.frames[r], False,
                                                now - _ready_at(item, r), item.eou[r])))
            if item.last:
                self.results.append((seq, build(seq.stream_id, seq.decoding, item.final_tokens, 0, True, None)))
        self.rows = [(sink, ResultRows.of(rows)) for sink, rows in sunk.items()]

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class StepTotals:
    """The work of every step delivered, summed: steps, chunks encoded, seconds in each stage."""

    steps: int = 0
    chunks: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, step: Step) -> None:
        self.steps += 1
        self.chunks += sum(len(batch.items) for batch in step.batches)
        for stage, seconds in step.seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


def _ready_at(item: StepItem, r: int) -> float:
    """When the item's chunk `r` was ready: its last sample's arrival, or the final for one cut at the end."""
    return item.ready_times[r] if r < len(item.ready_times) else item.final_at


def _rows(item: StepItem, now: float) -> list:
    """The item's results as ResultRows rows: a row per chunk, then its final in its last step."""
    sid = item.seq.stream_id
    rows = [(sid, tokens, item.frames[r], False, now - _ready_at(item, r), item.eou[r])
            for r, tokens in enumerate(item.tokens)]
    if item.last:
        rows.append((sid, item.final_tokens, 0, True, None, 0.0))
    return rows
