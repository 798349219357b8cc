"""The pre-encode stage's framing: log-mel features of new samples, cut into NeMo's streaming
chunks, and FrontEnd, the per-stream state it keeps between steps.

Chunks are cut exactly as NeMo's CacheAwareStreamingAudioBuffer cuts them, at the frame counts
of ChunkSpec.frames_through; every window has the same size so that chunks of different
streams (first chunks included) batch together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.conformer import ChunkSpec
from ..model.features import FeatureStream, LogMelFeatures


class FrontEnd:
    """One stream's front-end state, written by the pre-encode stage only: its STFT framing,
    log-mel frames not cut yet, the pre-encode cache (`history`) and the count of chunks cut."""

    def __init__(self, features: LogMelFeatures, spec: ChunkSpec):
        self.spec = spec
        self.framing = FeatureStream(features)
        self.n_mels = features.cfg.n_mels
        self.mel: torch.Tensor | None = None  # features not yet cut into chunks
        self.history: torch.Tensor | None = None  # last `pre_cache` frames: the pre-encode cache
        self.chunks_cut = 0


@dataclass
class Window:
    """Mel frames of one encoder step of one stream: [spec.window, n_mels], valid in [start, start + length)."""

    frames: torch.Tensor
    start: int
    length: int


def add_features(features: LogMelFeatures, fronts: list[FrontEnd], samples: list[torch.Tensor],
                 last: list[bool]) -> None:
    """Frame every stream's new samples (all that is left of them where `last`) and compute all
    their log-mel frames in one batch."""
    raw = []
    for front, new, is_last in zip(fronts, samples, last):
        frames = front.framing.push(new)
        raw.append(torch.cat((frames, front.framing.flush())) if is_last else frames)
    sizes = [r.size(0) for r in raw]
    fb = features.fb
    if sum(sizes):
        host = torch.cat(raw)
        if fb.device.type == "cuda":  # pinned: the copy runs asynchronously
            host = host.pin_memory()
        mel = features.mel(host.to(fb.device, fb.dtype, non_blocking=True))
    else:
        mel = fb.new_zeros(0, fb.size(0))
    for front, m, is_last in zip(fronts, mel.split(sizes), last):
        if is_last:  # NeMo zero-masks the frames past samples // hop
            done = front.framing.frames_done - m.size(0)
            m[max(0, front.framing.valid_frames - done) :] = 0.0
        if front.mel is None:
            front.mel = m.new_zeros(0, front.n_mels)
            front.history = m.new_zeros(front.spec.pre_cache, front.n_mels)
        front.mel = torch.cat((front.mel, m))


def cut(front: FrontEnd, count: int, last: bool) -> list[Window]:
    """The next `count` chunks; in the stream's last step, every chunk left, the partial last one too."""
    out: list[Window] = []
    while front.mel is not None and (last or len(out) < count):
        window = _next(front, last)
        if window is None:
            break
        out.append(window)
    return out


def _next(front: FrontEnd, last: bool) -> Window | None:
    spec, chunk = front.spec, front.chunks_cut
    size, have = spec.size(chunk), front.mel.size(0)
    # NeMo's streaming buffer counts every frame it holds as valid (the zero-masked tail too)
    if have < size and not (last and have >= spec.shortest_last(chunk)):
        return None
    new = front.mel[:size]
    frames = new.new_zeros(spec.window, front.n_mels)
    if chunk == 0:
        frames[spec.first_pad : spec.first_pad + new.size(0)] = new
        start, length = spec.first_pad, new.size(0)
    else:
        frames[: spec.pre_cache] = front.history
        frames[spec.pre_cache : spec.pre_cache + new.size(0)] = new
        start, length = 0, spec.pre_cache + new.size(0)
    front.history = torch.cat((front.history, new))[-spec.pre_cache :]
    front.mel = front.mel[size:]
    front.chunks_cut += 1
    return Window(frames, start, length)
