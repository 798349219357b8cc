"""Sizing a GPU engine to its device's memory: slots and the largest step, from measured peaks.

Counting only the encoder caches (what `options.auto_num_streams` does on CPU) gives thousands
of slots on an 80 GB GPU; a step over all of them would then need tens of GB of activations (the
first subsampling convolution alone, at 8 chunks per stream). So on a GPU one plan sizes both:
what a step needs per stream is measured (the peak of an eager pre-encode, encode and greedy
decode of a probe batch, in every lookahead mode), DEPTH steps of the largest size are set
aside, and the slots get the rest. Pre-encode batches are split to the same largest size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.beam import BeamPool
from ..model.boosting import BoostPool
from ..model.conformer import EncoderCache
from ..model.greedy import GreedyPass
from ..model.parakeet import ParakeetModel
from .chunker import FrontEnds
from .phrases import BEAM, LIMITS
from .pipeline import DEPTH

MAX_BATCH = 1024  # largest step planned: the target load (1,000 streams) fits one; graphs grow with it
MAX_SLOTS = 4096
SHARE = 0.9  # of the free memory: the rest for the allocator's fragmentation and CUDA's own


class DoesNotFit(ValueError):
    """The requested streams do not fit in the device's memory."""


@dataclass(frozen=True)
class MemoryPlan:
    slots: int
    max_batch: int  # most streams in one step (the Scheduler's limit, the largest CUDA graph)


def plan_memory(free: int, slot_bytes: int, stream_bytes: int, slots: int | None = None,
                max_batch: int | None = None, most: int = MAX_SLOTS) -> MemoryPlan:
    """Slots (given, or as many as fit, at most `most`) and the largest step, from the free bytes,
    one slot's state and one stream's share of a step. Raises DoesNotFit when the given slots leave
    no room for a step of one stream."""
    budget = int(free * SHARE)
    batch = min(max_batch or MAX_BATCH, slots or most)
    if slots is None:  # steps take at most half the budget, slots the rest
        batch = max(1, min(batch, budget // 2 // (DEPTH * stream_bytes)))
        slots = max(1, min(most, (budget - DEPTH * batch * stream_bytes) // slot_bytes))
        return MemoryPlan(slots, min(batch, slots))
    room = budget - slots * slot_bytes
    batch = min(batch, room // (DEPTH * stream_bytes)) if room > 0 else 0
    if batch < 1:
        raise DoesNotFit(f"{slots} streams do not fit in {free / 2**30:.1f} GiB free "
                           f"({slot_bytes / 2**20:.1f} MiB per stream; try --max-num-streams auto)")
    return MemoryPlan(slots, batch)


def slot_bytes(model: ParakeetModel) -> int:
    """One slot's encoder cache, decoder state, key phrase tables, beams and mel frames kept."""
    d = model.cfg.decoder
    decoder = (2 * d.pred_rnn_layers * d.pred_hidden + d.joint_hidden) * 4
    return (EncoderCache.slot_bytes(model.cfg.encoder, model.encoder_dtype) + decoder + BoostPool.slot_bytes(LIMITS)
            + BeamPool.slot_bytes(model.decoder, BEAM) + FrontEnds.slot_bytes(model))


@torch.inference_mode()
def stream_bytes(model: ParakeetModel, probe: int = 32) -> int:
    """Peak device bytes per stream of one step's pre-encode, encode and decode (CUDA), the worst
    lookahead mode; measured on a probe batch against a one-slot pool."""
    device = model.features.fb.device
    enc, cfg = model.encoder, model.cfg
    cache = EncoderCache.zeros(cfg.encoder, 1, device, model.encoder_dtype)
    state = model.decoder.state_pool(1, device)
    slots = torch.zeros(probe, dtype=torch.long, device=device)
    worst = 0
    for mode in cfg.encoder.att_context_sizes:
        spec = enc.chunk_spec(mode)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        feats = torch.zeros(probe, spec.window, cfg.features.n_mels, device=device, dtype=model.encoder_dtype)
        frames = torch.full((probe,), spec.window, device=device)
        x, lengths = enc.stream_pre_encode(feats, frames, torch.zeros_like(frames), mode)
        out = enc.stream_layers(x, lengths, cache, slots, mode)
        GreedyPass(model.decoder, out.float(), lengths, state.gather(slots)).run(fixed=True)
        torch.cuda.synchronize(device)
        worst = max(worst, torch.cuda.max_memory_allocated(device) - base)
    return -(-worst // probe)
