"""CUDA graphs of the encoder step at bucketed batch sizes.

A batch-of-N step on a GPU is dominated by kernel launches (17-24 layers x ~40 kernels), so
each batch size bucket (1, 2, 4, ... up to the slot count) is captured once as a graph and
replayed with the step's inputs copied into its static tensors. Padding rows point at a
scratch slot past the real ones with zero valid frames, so they touch no stream's cache.
Any capture failure falls back to the eager step for that bucket (logged once).
"""

from __future__ import annotations

import logging

import torch

from ..model.conformer import ConformerEncoder, EncoderCache

log = logging.getLogger(__name__)


def buckets(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


class GraphedLayers:
    """`encoder.stream_layers` for one lookahead mode, replayed from per-bucket CUDA graphs."""

    def __init__(self, encoder: ConformerEncoder, pool: EncoderCache, scratch_slot: int, mode, frames: int, max_batch: int):
        self.encoder, self.pool, self.mode = encoder, pool, mode
        self.scratch, self.frames = scratch_slot, frames
        self.sizes = buckets(max_batch)
        self._graphs: dict[int, tuple] = {}
        self._failed: set[int] = set()

    def __call__(self, x: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        n = x.size(0)
        size = next((b for b in self.sizes if b >= n), None)
        if size is None or size in self._failed or x.size(1) != self.frames:
            return self.encoder.stream_layers(x, lens, self.pool, slots, self.mode)
        graph = self._graphs.get(size) or self._capture(size, x)
        if graph is None:
            return self.encoder.stream_layers(x, lens, self.pool, slots, self.mode)
        g, sx, slens, sslots, out = graph
        sx[:n].copy_(x)
        slens[:n].copy_(lens)
        slens[n:].zero_()
        sslots[:n].copy_(slots)
        sslots[n:].fill_(self.scratch)
        g.replay()
        return out[:n]

    def _capture(self, size: int, like: torch.Tensor):
        dev = like.device
        sx = torch.zeros(size, self.frames, like.size(2), device=dev, dtype=like.dtype)
        slens = torch.zeros(size, dtype=torch.long, device=dev)
        sslots = torch.full((size,), self.scratch, dtype=torch.long, device=dev)
        try:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up: memoised position tables, cuBLAS workspaces
                self.encoder.stream_layers(sx, slens, self.pool, sslots, self.mode)
            torch.cuda.current_stream(dev).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = self.encoder.stream_layers(sx, slens, self.pool, sslots, self.mode)
        except RuntimeError as exc:
            log.warning("CUDA graph capture failed for batch %d (%s); running that size eagerly", size, exc)
            self._failed.add(size)
            return None
        self._graphs[size] = (g, sx, slens, sslots, out)
        return self._graphs[size]
