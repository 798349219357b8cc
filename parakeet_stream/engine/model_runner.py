"""The ModelRunner: the model and its state pools; it runs a step's stages and nothing else.

pre-encode: features and subsampling of every chunk in the step, one batch per lookahead mode;
encode: cache-aware encoder rounds (one chunk per stream per round) over the slot pool;
decode: one batched greedy RNN-T pass per round.
Each stage adds its output to the step's items (step.py). As nano-vllm's ModelRunner.run, it
decides nothing (the Scheduler chose the step) and delivers nothing (the engine turns tokens
into results and publishes them). On CUDA, encoder steps replay CUDA graphs (cuda_graphs.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch

from ..model.conformer import EncoderCache
from ..model.parakeet import ParakeetModel
from ..model.rnnt import DecoderState
from . import chunker
from .cuda_graphs import GraphedLayers
from .step import Step, StepItem


class ModelRunner:
    def __init__(self, model: ParakeetModel, slots: int, max_batch: int):
        self.model = model
        self.device = model.features.fb.device
        self.slots, self.max_batch = slots, max_batch
        self.cache, self.decoder_state = self.allocate_pools(slots)
        self._graphed: dict = {}  # lookahead mode -> GraphedLayers (CUDA only)

    def allocate_pools(self, slots: int) -> tuple[EncoderCache, DecoderState]:
        """Encoder caches and decoder states of every slot, allocated once as [layers, slots, ...]
        (on CUDA one more: the scratch slot that padding rows of graphed steps write to)."""
        extra = 1 if self.device.type == "cuda" else 0
        cache = EncoderCache.zeros(self.model.cfg.encoder, slots + extra, self.device, self.model.encoder_dtype)
        return cache, self.model.decoder.state_pool(slots, self.device)

    # --- stages ----------------------------------------------------------------------------
    def pre_encode(self, step: Step) -> None:
        live = [item for item in step if item.live]
        samples = [item.seq.inbox.take_samples(item.samples_upto) for item in live]
        chunker.add_features(self.model.features, [i.seq.front for i in live], samples, [i.last for i in live])
        windows = [(item, w) for item in live for w in chunker.cut(item.seq.front, item.chunks, item.last)]
        dtype = self.model.encoder_dtype
        for mode, group in _by_mode(windows, lambda p: p[0].seq.lookahead).items():
            feats = torch.stack([w.frames for _, w in group]).to(self.device, dtype)
            lengths = torch.tensor([w.length for _, w in group], device=self.device)
            start = torch.tensor([w.start for _, w in group], device=self.device)
            x, lens = self.model.encoder.stream_pre_encode(feats, lengths, start, mode)
            for (item, _), xi, n in zip(group, x, lens.tolist()):
                item.pre.append((xi, n))

    def encode(self, step: Step) -> None:
        live = [item for item in step if item.live]
        first = [item.slot for item in live if item.first]
        if first:
            self.cache.reset(torch.tensor(first, device=self.device))
        for r in range(max((len(i.pre) for i in live), default=0)):
            for mode, group in _by_mode([i for i in live if len(i.pre) > r], lambda i: i.seq.lookahead).items():
                x = torch.stack([i.pre[r][0] for i in group])
                lens = torch.tensor([i.pre[r][1] for i in group], device=self.device)
                slots = torch.tensor([i.slot for i in group], device=self.device)
                enc = self._stream_layers(x, lens, slots, mode)
                for item, e in zip(group, enc):
                    item.encoded.append(e[: item.pre[r][1]])

    def decode(self, step: Step) -> None:
        """One greedy pass per encoder round, so every chunk gets its own tokens, as NeMo's steps do."""
        live = [item for item in step if item.live]
        first = [item.slot for item in live if item.first]
        if first:
            self.decoder_state.reset(torch.tensor(first, device=self.device))
        for r in range(max((len(i.encoded) for i in live), default=0)):
            group = [i for i in live if len(i.encoded) > r]
            for item, tokens in zip(group, self._greedy(group, r)):
                item.tokens.append(tokens)

    # --- internals ---------------------------------------------------------------------------
    def _stream_layers(self, x, lens, slots, mode) -> torch.Tensor:
        if self.device.type != "cuda":
            return self.model.encoder.stream_layers(x, lens, self.cache, slots, mode)
        graphed = self._graphed.get(mode)
        if graphed is None:
            graphed = GraphedLayers(self.model.encoder, self.cache, self.slots, mode, x.size(1), self.max_batch)
            self._graphed[mode] = graphed
        return graphed(x, lens, slots)

    def _greedy(self, items: list[StepItem], r: int) -> list[list[tuple[int, int]]]:
        slots = torch.tensor([i.slot for i in items], device=self.device)
        enc = torch.nn.utils.rnn.pad_sequence([i.encoded[r] for i in items], batch_first=True).float()
        lens = torch.tensor([i.encoded[r].size(0) for i in items], device=self.device)
        emission, state = self.model.decoder.decode(enc, lens, self.decoder_state.gather(slots))
        self.decoder_state.scatter(slots, state)
        return emission.per_stream(len(items))


def _by_mode(items: list, mode_of: Callable) -> dict:
    """Items grouped by lookahead mode: shapes differ between modes."""
    groups: dict = defaultdict(list)
    for item in items:
        groups[mode_of(item)].append(item)
    return groups
