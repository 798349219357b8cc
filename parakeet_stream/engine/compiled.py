"""The encoder layer stack compiled with torch.compile (inductor), an opt-in (`ASREngine(compile=True)`).

Inductor fuses the elementwise work between the matmuls (norms, activations, the KV ring's
gathers and scatters) into generated C++ (CPU) or Triton (CUDA) kernels. A compiled graph is
specialised to its shapes, so the runner calls it through static batches (cuda_graphs.py) at the
few sizes of `buckets`, each compiled at start-up: a step pads its batch to the next size up and
never compiles at run time.
"""

from __future__ import annotations

from typing import Callable

import torch


def buckets(max_batch: int) -> list[int]:
    """Batch sizes to compile, up to `max_batch`: powers of two (each size is a full compile, so
    few of them; a batch pads by less than half)."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch]


def compile_layers(fn: Callable, graphs: int) -> Callable:
    """`fn` compiled for fixed shapes; `graphs`: how many it will be compiled for (sizes x modes, all
    one code object), which the recompile limit must allow, or the later ones would run eager."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, graphs)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, graphs)
    return torch.compile(fn, dynamic=False)
