"""The pre-encode stage's framing: log-mel features of new samples, cut into NeMo's streaming chunks.

Chunks are cut exactly as NeMo's CacheAwareStreamingAudioBuffer cuts them; every window has
the same size so that chunks of different streams (first chunks included) batch together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.features import LogMelFeatures
from .sequence import Sequence


@dataclass
class Window:
    """Mel frames of one encoder step of one stream: [spec.window, n_mels], valid in [start, start + length)."""

    frames: torch.Tensor
    start: int
    length: int


def add_features(features: LogMelFeatures, seqs: list[Sequence], ending: list[bool],
                 upto: list[int | None] | None = None) -> None:
    """Frame every stream's new samples (up to its `upto`-th sample; all when None) and compute
    all their log-mel frames in one batch."""
    raw = []
    for seq, end, limit in zip(seqs, ending, upto or [None] * len(seqs)):
        frames = seq.frames.push(seq.take_samples(limit))
        raw.append(torch.cat((frames, seq.frames.flush())) if end else frames)
    sizes = [r.size(0) for r in raw]
    fb = features.fb
    if sum(sizes):
        host = torch.cat(raw)
        if fb.device.type == "cuda":  # pinned: the copy runs asynchronously
            host = host.pin_memory()
        mel = features.mel(host.to(fb.device, fb.dtype, non_blocking=True))
    else:
        mel = fb.new_zeros(0, fb.size(0))
    for seq, m, end in zip(seqs, mel.split(sizes), ending):
        if end:  # NeMo zero-masks the frames past samples // hop
            done = seq.frames.frames_done - m.size(0)
            m[max(0, seq.frames.valid_frames - done) :] = 0.0
        if seq.mel is None:
            seq.mel = m.new_zeros(0, seq.n_mels)
            seq.history = m.new_zeros(seq.spec.pre_cache, seq.n_mels)
        seq.mel = torch.cat((seq.mel, m))


def cut(seq: Sequence, count: int, ending: bool) -> list[Window]:
    """The next `count` chunks; when the stream ends, every chunk left, the partial last one too."""
    out: list[Window] = []
    while seq.mel is not None and (ending or len(out) < count):
        window = _next(seq, ending)
        if window is None:
            break
        out.append(window)
    return out


def _next(seq: Sequence, ending: bool) -> Window | None:
    spec, first = seq.spec, seq.chunks_cut == 0
    size = spec.first_frames if first else spec.chunk_frames
    have = seq.mel.size(0)
    # NeMo's streaming buffer counts every frame it holds as valid (the zero-masked tail
    # too) and drops a last piece shorter than one subsampling step.
    if have < size and not (ending and have >= (1 if first else spec.factor)):
        return None
    new = seq.mel[:size]
    frames = new.new_zeros(spec.window, seq.n_mels)
    if first:
        frames[spec.first_pad : spec.first_pad + new.size(0)] = new
        start, length = spec.first_pad, new.size(0)
    else:
        frames[: spec.pre_cache] = seq.history
        frames[spec.pre_cache : spec.pre_cache + new.size(0)] = new
        start, length = 0, spec.pre_cache + new.size(0)
    seq.history = torch.cat((seq.history, new))[-spec.pre_cache :]
    seq.mel = seq.mel[size:]
    seq.chunks_cut += 1
    return Window(frames, start, length)
