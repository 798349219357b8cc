"""The pre-encode stage's model work: every stream's new mel frames, each lookahead mode's chunks cut
and subsampled at once, split into the step's batches (one per round and mode, step.py).

Its state is every slot's timeline (chunker.FrontEnds, on the device) and a table per mode of the
encoder frames a window gives; the framing arithmetic itself is chunker.py's.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial

import numpy as np
import torch

from ...model.config import Lookahead
from ...model.device import device_index
from ...model.parakeet import ParakeetModel
from .. import chunker
from ..step import Batch, Step, StepItem
from .cuda_graphs import StaticBatches
from .cuda_streams import StageStreams


class PreEncoder:
    def __init__(self, model: ParakeetModel, slots: int, max_batch: int, cuda_streams: StageStreams,
                 static: dict[Lookahead, StaticBatches]):
        """static: the subsampling's static batches by mode (filled by the ModelRunner; empty: eager)."""
        self.model, self.max_batch, self.cuda_streams, self.static = model, max_batch, cuda_streams, static
        self.device = model.features.fb.device
        self.fronts = chunker.FrontEnds(model.features, slots)
        self._frames_by_end: dict[Lookahead, np.ndarray] = {}

    def batches(self, step: Step, live: list[StepItem], samples: list[np.ndarray]) -> list[Batch]:
        """The step's batches: every stream's new frames at once, then each mode's chunks cut and
        pre-encoded at once, split into rounds; each stream's timeline kept for its next step."""
        fronts, slots, last = [i.seq.front for i in live], [i.slot for i in live], [i.last for i in live]
        self.fronts.start([item.slot for item in live if item.first])
        rows = self.fronts.lay_out(fronts, slots, *self.fronts.new_frames(fronts, samples, last))
        by_mode: dict = defaultdict(list)
        for k, item in enumerate(live):
            by_mode[item.seq.lookahead].append(k)
        batches = []
        for mode, members in by_mode.items():
            windows = self.fronts.cut(fronts, rows, members, [live[k].chunks for k in members], [last[k] for k in members])
            if windows is None:
                continue
            x = self._subsample(mode, windows)
            self.cuda_streams.mark(step, "pre-encode", len(windows.owner), mode)
            items = [live[k] for k in windows.owner.tolist()]
            bounds = [0, *(np.flatnonzero(np.diff(windows.round)) + 1).tolist(), len(items)]
            slots_at = rows.slots[windows.owner]
            batches += [self._batch(mode, items[a:b], windows, slots_at, a, b, x[a:b]) for a, b in zip(bounds, bounds[1:])]
        self.fronts.keep(fronts, slots, rows)
        return batches

    def _subsample(self, mode: Lookahead, windows: chunker.Windows) -> torch.Tensor:
        """Pre-encode of every window of one mode, at most max_batch windows per call (memory)."""
        feats = windows.frames.to(self.model.encoder_dtype)
        lengths, start = device_index(windows.length, self.device), device_index(windows.start, self.device)
        run = self.static.get(mode) or partial(self.run_model, mode=mode)
        parts = [run(feats[i : i + self.max_batch], lengths[i : i + self.max_batch], start[i : i + self.max_batch])
                 for i in range(0, feats.size(0), self.max_batch)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _batch(self, mode: Lookahead, items: list[StepItem], windows: chunker.Windows, slots: np.ndarray, a: int,
               b: int, x: torch.Tensor) -> Batch:
        """Rows a..b of a mode's windows (one round; `slots`: each window's): a batch for the encoder
        and the decoder."""
        frames = self._valid_frames(mode)[windows.start[a:b] + windows.length[a:b]]
        for item, n in zip(items, frames.tolist()):
            item.frames.append(n)
        return Batch(mode, items, x, device_index(frames, self.device), device_index(slots[a:b], self.device),
                     round=int(windows.round[a]))

    def _valid_frames(self, mode: Lookahead) -> np.ndarray:
        """The encoder frames a window gives by where its valid mel frames end (0 to the window)."""
        table = self._frames_by_end.get(mode)
        if table is None:
            stream_frames, window = self.model.encoder.stream_frames, self.model.encoder.chunk_spec(mode).window
            table = self._frames_by_end[mode] = np.array([stream_frames(0, end, mode) for end in range(window + 1)])
        return table

    def run_model(self, feats, lengths, start, mode: Lookahead, fixed: bool = False) -> torch.Tensor:
        """The subsampling of windows of one mode (what its static batches capture)."""
        return self.model.encoder.stream_pre_encode(feats, lengths, start, mode)[0]
