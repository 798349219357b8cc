"""EngineConfig: everything an ASREngine is built from, as one value (nano-vllm's Config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from ..model.config import Lookahead
from ..model.parakeet import ParakeetModel
from ..model.sortformer import Sortformer
from .diarizer_model import DEFAULT_LATENCY, LATENCIES
from .latency import DEFAULT_TARGET


@dataclass(frozen=True)
class EngineConfig:
    """max_batch: most streams per step (default: every slot on CPU; sized to memory on CUDA,
    memory.py); latency_target: seconds, p95 from a chunk's last sample to its result taken
    (latency.py); cuda_graphs: replay encoder and decoder from CUDA graphs (default: on CUDA);
    auto_limit: with max_num_streams "auto", at most this many slots (the server's bound: what its
    connections may take of the host's memory); modes: the lookahead modes served (default: every
    mode of the model; graphs are captured for these only, and streams may ask for no other);
    calibrate: measure the step cost when the engine starts, before any client (calibration.py;
    off for a tool that serves files only, which admission does not pace); diarizer: a Streaming
    Sortformer (.nemo, a folder holding one, or the model) for the streams that ask for speakers;
    diarizer_latency: the audio its chunks wait for, one of diarizer_model.LATENCIES (seconds)."""

    model: str | Path | ParakeetModel = "demo"
    device: str = "cpu"
    max_num_streams: int | str = 64
    max_queue: int = 256
    lookahead: Lookahead | None = None
    endpoint_seconds: float = 0.8
    dtype: str | torch.dtype = torch.float32
    quantize: str | None = None
    max_batch: int | None = None
    latency_target: float = DEFAULT_TARGET
    threads: int | None = None
    cuda_graphs: bool | None = None
    auto_limit: int | None = None
    modes: Iterable[Lookahead] | None = None
    calibrate: bool = True
    diarizer: str | Path | Sortformer | None = None
    diarizer_latency: float = DEFAULT_LATENCY

    def __post_init__(self) -> None:
        if self.diarizer_latency not in LATENCIES:
            raise ValueError(f"diarizer_latency must be one of {sorted(LATENCIES)} seconds, got {self.diarizer_latency}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
