"""Static batches: a function over a batch of rows, replayed at a few fixed batch sizes from CUDA graphs.

A step of a few hundred streams on a GPU is dominated by kernel launches (17-24 layers x ~40
kernels for the encoder; a greedy decode is a loop of small kernels), so each function the
runner calls per step (encoder layers, greedy decode; one of each per lookahead mode) is
captured once per batch size of `graph_sizes` and replayed with the step's rows copied into
its static inputs. Rules that keep it right:

- Every graph is captured at start-up (`capture`), before the stage threads run, in
  "thread_local" capture mode: in "global" mode another thread's allocation during a capture is
  an error.
- The sizes of one function share one set of static tensors (views of the largest) and the
  graphs of one CUDA stream share one memory pool (replays on one stream never overlap).
- Each graph is captured on the stream that replays it (its stage's). A captured GEMM keeps the
  cuBLAS workspace of the stream it was captured on, so graphs replayed at once on different
  streams must come from different capture streams: captured on one (torch's default capture
  stream), the pre-encode, encode and decode graphs would share one workspace while they run side by
  side, and GEMMs racing in it give wrong sums or, where a split GEMM waits on its counters there,
  a kernel that never ends.
- Rows past the batch (padding) get the values of `padding` (a zero length, the scratch slot
  past the real ones), so they touch no stream's state.
- What a call returns is a copy: the static output is overwritten by the next replay, which may
  come before the caller reads it (the next round of a step, the next step's encode).
- On CPU (`graphs=False`) the same bookkeeping runs with an eager stand-in for the replay, which
  is how the tests check it without a GPU.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Callable

import torch

from ...model.device import next_size

log = logging.getLogger(__name__)


def on_device(device: torch.device):
    """The device as CUDA's current one (what the graphs capture on); nothing on CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def graph_sizes(max_batch: int, dense: int = 64) -> list[int]:
    """Batch sizes to capture, up to `max_batch`: a batch of n rows runs at the next size up.
    Up to `dense` rows the sizes are powers of two (a GPU step's time is flat there: 9 ms at 1 row,
    12.5 ms at 64 for `large` on an H200, so padding costs next to nothing); above, each size pads
    by less than an eighth of itself (powers of two would pad 513 rows to 1,024)."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size = next_size(size, dense=dense)
    return sizes + [max_batch]


class StaticBatches:
    """`fn(*inputs, fixed=...)` over row batches, at the sizes of `graph_sizes(max_batch)`.

    `inputs(n)` makes example inputs of n rows (their shapes and dtypes are the static ones);
    `padding` gives, per input, the value of padding rows (None: left as they are). `fn` returns one
    tensor with a row per input row; with `fixed=True` (captured, or its stand-in) its loops run a
    fixed number of times, with `fixed=False` (a batch past the largest size) as the data needs.
    """

    def __init__(self, name: str, fn: Callable, inputs: Callable[[int], tuple[torch.Tensor, ...]],
                 padding: tuple, max_batch: int, graphs: bool, pool=None, sizes: list[int] | None = None,
                 stream: torch.cuda.Stream | None = None):
        """pool, stream: the memory pool and the stream of the stage that replays the graphs (CUDA)."""
        self.name, self.fn, self.padding, self.graphs, self.pool = name, fn, padding, graphs, pool
        self.stream = stream
        self.sizes = sizes or graph_sizes(max_batch)
        self.static = tuple(t.clone() for t in inputs(max_batch))
        for t, pad in zip(self.static, padding):
            if pad is not None:
                t.fill_(pad)
        self.out: torch.Tensor | None = None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = self.eager_calls = 0
        self.capture_seconds = 0.0

    def capture(self) -> None:
        """Every size, largest first (the static output is sized by the largest)."""
        start = time.perf_counter()
        for size in reversed(self.sizes):
            self._capture(size)
        self.capture_seconds = time.perf_counter() - start

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        n = inputs[0].size(0)
        size = next((s for s in self.sizes if s >= n), None)
        if size is None or self.out is None:  # beyond the largest size, or before `capture`: eager
            self.eager_calls += 1
            return self.fn(*inputs, fixed=False)
        for static, value, pad in zip(self.static, inputs, self.padding):
            static[:n].copy_(value, non_blocking=True)
            if pad is not None:
                static[n:size].fill_(pad)
        self._replay(size)
        self.replays += 1
        return self.out[:n].clone()

    def _replay(self, size: int) -> None:
        if self.graphs:
            self._graphs[size].replay()
        else:  # the eager stand-in: the same static tensors in and out, the same fixed-shape loops
            self.out[:size].copy_(self.fn(*(t[:size] for t in self.static), fixed=True))

    def _capture(self, size: int) -> None:
        views = tuple(t[:size] for t in self.static)
        if not self.graphs:
            self._keep(size, self.fn(*views, fixed=True))
            return
        device = self.static[0].device
        stream = self.stream or torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up, the captured ops: memoised tables, cuBLAS workspaces, lazy loads
            self._keep(size, self.fn(*views, fixed=True))
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # capture_begin/end as torch.cuda.graph does, without its empty_cache per graph: that hands
        # the warm-up's memory (and the cached pinned host blocks) back to the driver before each of
        # a few hundred captures, for the next warm-up to allocate again
        torch.cuda.synchronize(device)
        pool = {} if self.pool is None else {"pool": self.pool}
        with torch.cuda.stream(stream):
            graph.capture_begin(**pool, capture_error_mode="thread_local")
            try:
                self.out[:size].copy_(self.fn(*views, fixed=True))
            finally:
                graph.capture_end()
        self._graphs[size] = graph

    def _keep(self, size: int, result: torch.Tensor) -> None:
        if self.out is None:
            self.out = result.new_zeros((self.static[0].size(0),) + tuple(result.shape[1:]))
        self.out[:size].copy_(result)
