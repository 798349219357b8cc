"""The pre-encode stage's framing: log-mel features of new samples, cut into NeMo's streaming
chunks, and FrontEnd, the per-stream state it keeps between steps.

Chunks are cut exactly as NeMo's CacheAwareStreamingAudioBuffer cuts them, at the frame counts
of ChunkSpec.frames_through; every window has the same size so that chunks of different
streams (first chunks included) batch together.

Per stream, only host arithmetic, in numpy: its framing state, its features not cut yet, which
rows make its windows. The tensor work is a few operations per step, whatever the number of
streams: the features of every stream at once (one copy of the samples to the device, one copy
of the features back), then every window of one lookahead mode as one copy to the device.

Why no tensor per stream: every torch call hands the GIL back and takes it again, and while
another thread runs Python (the server's protocol work, the other stages) taking it back waits
up to the interpreter's switch interval. A step of 256 streams with a torch call per stream took
4 ms per chunk beside one busy Python thread, against 0.1 ms alone; numpy calls on small arrays
keep the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..model.device import to_device
from ..model.conformer import ChunkSpec
from ..model.features import FeatureStream, LogMelFeatures


class FrontEnd:
    """One stream's front-end state, written by the pre-encode stage only: its STFT framing,
    log-mel frames not cut yet, the pre-encode cache (`history`) and the count of chunks cut."""

    def __init__(self, features: LogMelFeatures, spec: ChunkSpec):
        self.spec = spec
        self.framing = FeatureStream(features)
        self.n_mels = features.cfg.n_mels
        self.mel: np.ndarray | None = None  # features not yet cut into chunks [frames, n_mels]
        self.history: np.ndarray | None = None  # last `pre_cache` frames: the pre-encode cache
        self.chunks_cut = 0


@dataclass
class Window:
    """Mel frames of one encoder step of one stream: [spec.window, n_mels], valid in [start, start + length)."""

    frames: np.ndarray
    start: int
    length: int


def add_features(features: LogMelFeatures, fronts: list[FrontEnd], samples: list[np.ndarray],
                 last: list[bool]) -> None:
    """Frame every stream's new samples (all that is left of them where `last`) and compute all
    their log-mel frames in one batch."""
    segments, counts = [], []
    for front, new, is_last in zip(fronts, samples, last):
        segment = front.framing.push(np.asarray(new, np.float32))
        segments.append(segment)
        count = segment[1]
        if is_last:
            segments.append(end := front.framing.flush())
            count += end[1]
        counts.append(count)
    fb = features.fb
    total = sum(counts)
    mel = features.mel(features.frames(segments)) if total else fb.new_zeros(0, fb.size(0))
    mel = mel.float().cpu().numpy()  # one copy back: the per-stream work below is numpy's
    at = 0
    for front, count, is_last in zip(fronts, counts, last):
        m = mel[at : at + count]
        at += count
        if is_last:  # NeMo zero-masks the frames past samples // hop
            done = front.framing.frames_done - count
            m[max(0, front.framing.valid_frames - done) :] = 0.0
        if front.mel is None:
            front.mel = np.zeros((0, front.n_mels), np.float32)
            front.history = np.zeros((front.spec.pre_cache, front.n_mels), np.float32)
        front.mel = np.concatenate((front.mel, m)) if front.mel.shape[0] else m


def cut(front: FrontEnd, count: int, last: bool) -> list[Window]:
    """The next `count` chunks of one stream; in its last step, every chunk left, the partial last one too."""
    return cut_all([front], [count], [last])[1][0]


def cut_all(fronts: list[FrontEnd], counts: list[int], last: list[bool],
            device: torch.device | None = None) -> tuple[torch.Tensor | None, list[list[Window]]]:
    """The next chunks of streams of one lookahead mode at once: every window as one tensor
    [windows, spec.window, n_mels] on `device` (default: the CPU), round by round (each stream's
    first window, then each one's second, ...), or None without any; and each stream's windows."""
    plans = [_plan(front, count, is_last) for front, count, is_last in zip(fronts, counts, last)]
    rounds = max(map(len, plans), default=0)
    if rounds == 0:
        return None, [[] for _ in fronts]
    # one source for every row: a zero row, then each stream's history and features not cut yet
    n_mels, window = fronts[0].n_mels, fronts[0].spec.window
    sources, base, rows_so_far = [np.zeros((1, n_mels), np.float32)], [], 1
    for front, plan in zip(fronts, plans):
        base.append(rows_so_far)
        if plan:
            sources += [front.history, front.mel]
            rows_so_far += front.history.shape[0] + front.mel.shape[0]
    source = np.concatenate(sources)
    owners = [(s, plan[r]) for r in range(rounds) for s, plan in enumerate(plans) if r < len(plan)]
    # window row j of a cut reads source row base + shift + j where lo <= j < hi, the zero row elsewhere
    shift, lo, hi = np.array([(base[s] + cut.shift, cut.lo, cut.hi) for s, cut in owners]).T
    j = np.arange(window)
    inside = (j >= lo[:, None]) & (j < hi[:, None])
    frames = source[np.where(inside, shift[:, None] + j, 0)]
    windows: list[list[Window]] = [[] for _ in fronts]
    for row, (s, cut) in enumerate(owners):
        windows[s].append(Window(frames[row], cut.lo, cut.hi - cut.lo))
    _advance(fronts, plans, source, base)
    return to_device(frames, device or torch.device("cpu")), windows


class Cut(NamedTuple):
    """One chunk to cut: window row j is timeline row shift + j for lo <= j < hi (the timeline: the
    stream's history, then its features not cut yet), a zero row elsewhere; `new`: its new frames."""

    shift: int
    lo: int
    hi: int
    new: int


def _plan(front: FrontEnd, count: int, last: bool) -> list[Cut]:
    """The chunks to cut: the next `count`; in its last step, every chunk left, the partial last one too."""
    out: list[Cut] = []
    if front.mel is None:
        return out
    spec, have, offset = front.spec, front.mel.shape[0], 0
    pre = spec.pre_cache
    while last or len(out) < count:
        chunk = front.chunks_cut + len(out)
        size = spec.size(chunk)
        # NeMo's streaming buffer counts every frame it holds as valid (the zero-masked tail too)
        if have - offset < size and not (last and have - offset >= spec.shortest_last(chunk)):
            break
        new = min(size, have - offset)
        if chunk == 0:  # left-padded to the window: its frames after `first_pad` zero rows
            out.append(Cut(pre - spec.first_pad, spec.first_pad, spec.first_pad + new, new))
        else:  # the previous `pre_cache` frames of the timeline, then its own
            out.append(Cut(offset, 0, pre + new, new))
        offset += new
    return out


def _advance(fronts: list[FrontEnd], plans: list, source: np.ndarray, base: list[int]) -> None:
    """After cutting: each stream's history is the `pre_cache` frames before what is left, the rest its features."""
    pre = fronts[0].spec.pre_cache
    for s, plan in enumerate(plans):
        if plan:
            front, taken = fronts[s], sum(cut.new for cut in plan)
            front.history = source[base[s] + taken : base[s] + taken + pre].copy()  # not a view: source is the step's
            front.mel = front.mel[taken:]
            front.chunks_cut += len(plan)
