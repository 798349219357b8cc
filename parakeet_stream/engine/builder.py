"""An engine's parts built from its EngineConfig, in start-up order: the model at its precision,
the slots its memory holds, the Scheduler, the ModelRunner with its pools and captured graphs, the
diarizer with its state pool (where one is asked for), and what the engine's users read of it (EngineInfo)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import NamedTuple

import torch

from ..audio import SAMPLE_RATE
from ..host import free_memory
from ..model.loading import load_model
from ..model.parakeet import ParakeetModel
from ..model.sortformer import Sortformer, StreamingConfig
from ..model.precision import check_precision, set_precision
from .config import EngineConfig
from .diarizer import TOKEN_LAG_FRAMES, Diarizer
from .diarizer_model import live_streaming, load_diarizer
from .info import EngineInfo
from .languages import Languages
from .memory import MAX_SLOTS, plan_memory, slot_bytes, stream_bytes
from .modes import ServedModes
from .options import auto_num_streams
from .pipeline import DEPTH
from .policy import bulk_lookahead
from .results import ResultBuilder
from .runner.model_runner import ModelRunner
from .scheduler import Scheduler

log = logging.getLogger(__name__)


class EngineParts(NamedTuple):
    model: ParakeetModel
    device: torch.device  # with its index: what CUDA calls need ("cuda" -> "cuda:0")
    modes: ServedModes
    languages: Languages
    scheduler: Scheduler
    runner: ModelRunner
    results: ResultBuilder
    info: EngineInfo
    diarizer: Diarizer | None


def build(config: EngineConfig) -> EngineParts:
    started, lap = time.monotonic(), _Laps()
    check_precision(torch.device(config.device), config.dtype, config.quantize)  # before any weights move
    model = config.model
    if not isinstance(model, ParakeetModel):
        model = load_model(model, torch.device(config.device))
    lap("load")
    model = set_precision(model, config.dtype, config.quantize)
    lap("precision")
    device = model.features.fb.device
    modes = ServedModes(model, config.modes, config.lookahead)
    sortformer = _sortformer(config.diarizer, device)
    streaming = live_streaming(sortformer, config.diarizer_latency) if sortformer is not None else None
    slots, max_batch = _slots(config, model, device, sortformer, streaming)
    scheduler = Scheduler(slots, config.max_queue, config.latency_target, SAMPLE_RATE, max_batch,
                          max_in_flight=DEPTH, lead=modes.first_chunk_seconds())
    lap("memory")
    runner = ModelRunner(model, scheduler.max_num_streams, scheduler.max_batch, config.cuda_graphs, modes.default,
                         modes.served)
    diarizer = None
    if sortformer is not None:  # its graphs replay on the decode stage's stream, whose thread runs it (pipeline.route)
        diarizer = Diarizer(sortformer, scheduler.max_num_streams, streaming,
                            max_batch=scheduler.max_batch, graphs=runner.graphs, lane=runner.lanes.get("decode"),
                            token_lag=TOKEN_LAG_FRAMES * model.frame_seconds)
    lap("pools")
    runner.capture()  # before the stage threads run: a capture must not overlap their work
    if diarizer is not None:
        diarizer.capture()
    lap("capture")
    runner.keep_samples = diarizer is not None
    tok = model.tokenizer
    endpoint_frames = max(1, round(config.endpoint_seconds / model.frame_seconds))
    results = ResultBuilder(model.frame_seconds, tok.eou_id if tok else None, endpoint_frames,
                            tok.language_tags if tok else None)
    languages = Languages(tuple(model.cfg.prompt.languages) if model.cfg.prompt else ())
    info = EngineInfo(
        sample_rate=SAMPLE_RATE,
        frame_seconds=model.frame_seconds,
        tokenizer=tok,
        lookahead_modes=tuple(modes.served),
        default_lookahead=modes.default,
        bulk_lookahead=bulk_lookahead(modes.served),
        chunk_seconds={mode: modes.chunk_seconds(mode) for mode in modes.served},
        ready_samples={mode: modes.inbox(mode).readiness for mode in modes.served},
        precision=model.precision,
        start_seconds=round(time.monotonic() - started, 2),
        cuda_graphs=runner.graph_count + (diarizer.graph_count if diarizer is not None else 0),
        start_phases=lap.seconds,
        languages=languages.names,
        default_language=languages.default,
        endpoint_frames=endpoint_frames,
        speakers=diarizer.speakers if diarizer else 0,
        speaker_frame_seconds=diarizer.frame_seconds if diarizer else 0.0,
    )
    log.info("engine ready in %.1f s (%s)", info.start_seconds,
             ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in lap.seconds.items()))
    return EngineParts(model, device, modes, languages, scheduler, runner, results, info, diarizer)


def _sortformer(diarizer: str | Path | Sortformer | None, device: torch.device) -> Sortformer | None:
    if diarizer is None or isinstance(diarizer, Sortformer):
        return diarizer.to(device) if diarizer is not None else None
    return load_diarizer(diarizer).to(device)


def _slots(config: EngineConfig, model: ParakeetModel, device: torch.device, sortformer: Sortformer | None,
           streaming: StreamingConfig | None) -> tuple[int, int | None]:
    """(slots, most streams a step): on CUDA what its free memory holds (memory.py; a diarizer's
    state pool counts in each slot, its round in each stream of a step), on a CPU as asked (`auto`:
    what the host's memory holds)."""
    most = min(config.auto_limit or MAX_SLOTS, MAX_SLOTS)
    slots = config.max_num_streams
    if device.type == "cuda":
        slot, step = slot_bytes(model), stream_bytes(model)
        if sortformer is not None:  # one round at a time (the decode thread's), not one per step in flight
            slot = slot + Diarizer.slot_bytes(sortformer, streaming)
            step = step + -(-Diarizer.row_bytes(sortformer, streaming) // DEPTH)
        plan = plan_memory(free_memory(device), slot, step,
                           None if slots == "auto" else int(slots), config.max_batch, most=most)
        return plan.slots, plan.max_batch
    if slots == "auto":
        slots = auto_num_streams(model, device, model.encoder_dtype, cap=most)
    return int(slots), config.max_batch


class _Laps:
    """Seconds of each phase of the engine's start-up, in order (each call ends one)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def __call__(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 2)
        self._last = now
