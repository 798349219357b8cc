"""The ModelRunner: the model, its cache pools, and three stage threads that execute scheduled steps.

pre-encode: features and subsampling of every chunk in the step, one batch per lookahead mode;
encode: cache-aware encoder rounds (one chunk per stream per round) over the slot pool;
decode: one batched greedy RNN-T pass per step, results built, the step handed back.
Stages are joined by FIFO queues, so a stream's steps stay in order. The runner decides
nothing: the Scheduler chose the step. A stage that raises fails only that step's streams.
Two steps are in flight, so one step's decode overlaps the next one's encode; on CUDA the
host also prepares a step while the device runs the other, and encoder steps replay CUDA
graphs (cuda_graphs.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from typing import Callable

import torch

from ..model.conformer import EncoderCache
from ..model.parakeet import ParakeetModel
from ..model.rnnt import DecoderState
from . import chunker
from .cuda_graphs import GraphedLayers
from .results import ResultBuilder, StreamResult
from .scheduler import Scheduler, Step, StepItem
from .sequence import Sequence

log = logging.getLogger(__name__)
_STOP = object()


class ModelRunner:
    def __init__(self, model: ParakeetModel, scheduler: Scheduler, notify: Callable[[list[Sequence]], None],
                 endpoint_seconds: float = 0.8, threads: int | None = None):
        self.model = model
        self.scheduler = scheduler
        self.notify = notify  # tells the engine which streams' queue state changed
        self.device = model.features.fb.device
        self.threads = threads
        tok = model.tokenizer
        frames = max(1, round(endpoint_seconds / model.frame_seconds))
        self.results = ResultBuilder(model.frame_seconds, tok.eou_id if tok else None, frames)
        self.cache, self.decoder_state = self.allocate_pools(scheduler.max_num_streams)
        self._graphed: dict = {}  # lookahead mode -> GraphedLayers (CUDA only)
        self._encode_q: queue.Queue = queue.Queue()
        self._decode_q: queue.Queue = queue.Queue()
        self._threads = [
            threading.Thread(target=self._loop, args=(scheduler.schedule, "pre_encode", self._encode_q), name="pre-encode", daemon=True),
            threading.Thread(target=self._loop, args=(self._encode_q.get, "encode", self._decode_q), name="encode", daemon=True),
            threading.Thread(target=self._loop, args=(self._decode_q.get, "decode", None), name="decode", daemon=True),
        ]

    def allocate_pools(self, slots: int) -> tuple[EncoderCache, DecoderState]:
        """Encoder caches and decoder states of every slot, allocated once as [layers, slots, ...]
        (on CUDA one more: the scratch slot that padding rows of graphed steps write to)."""
        dtype = self.model.encoder_dtype
        extra = 1 if self.device.type == "cuda" else 0
        cache = EncoderCache.zeros(self.model.cfg.encoder, slots + extra, self.device, dtype)
        start = self.model.decoder.initial_state(slots, self.device)
        return cache, start

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self.scheduler.stop()
        for t in self._threads:
            t.join(timeout=10)

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def _loop(self, take: Callable, stage: str, out: queue.Queue | None) -> None:
        if self.device.type == "cpu":  # per thread: each calling thread has its own OpenMP team
            # Only the encoder's big matmuls gain from a team; decoding is thousands of tiny ops (a
            # fork/join each would cost more than the op), and a second team beside the encoder's
            # would leave both waiting at barriers for threads the other one preempted.
            torch.set_num_threads(self.threads if stage == "encode" else 1)
        while True:
            step = take()
            if step is None or step is _STOP:
                if out is not None:
                    out.put(_STOP)
                return
            start = time.perf_counter()
            try:
                with torch.inference_mode():
                    getattr(self, stage)(step)
            except Exception as exc:  # noqa: BLE001 - a model fault must not kill the thread
                log.error("inference failed for %d stream(s): %r", len(step), exc)
                self._fail(step)
                continue
            step.seconds[stage] = time.perf_counter() - start
            if out is not None:
                out.put(step)
            else:
                self._finish(step)

    # --- stages ----------------------------------------------------------------------------
    def pre_encode(self, step: Step) -> None:
        live = [item for item in step if item.live]
        chunker.add_features(self.model.features, [i.seq for i in live], [i.last for i in live],
                             [i.samples_upto for i in live])
        windows = [(item, w) for item in live for w in chunker.cut(item.seq, item.chunks, item.last)]
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

    def _stream_layers(self, x, lens, slots, mode) -> torch.Tensor:
        if self.device.type != "cuda":
            return self.model.encoder.stream_layers(x, lens, self.cache, slots, mode)
        graphed = self._graphed.get(mode)
        if graphed is None:
            scratch, most = self.scheduler.max_num_streams, self.scheduler.max_batch
            graphed = self._graphed[mode] = GraphedLayers(self.model.encoder, self.cache, scratch, mode, x.size(1), most)
        return graphed(x, lens, slots)

    def decode(self, step: Step) -> None:
        """One greedy pass per encoder round, so every chunk gets its own result, as NeMo's steps do."""
        live = [item for item in step if item.live]
        results: list[tuple[Sequence, StreamResult]] = []
        for r in range(max((len(i.encoded) for i in live), default=0)):
            group = [i for i in live if len(i.encoded) > r]
            for item, tokens in zip(group, self._greedy(group, r)):
                ready = item.ready_times[r] if r < len(item.ready_times) else item.seq.final_at
                latency = time.monotonic() - ready
                results.append((item.seq, self.results.build(item.seq, tokens, item.encoded[r].size(0), False, latency)))
        results += [(i.seq, self.results.build(i.seq, [], 0, True, None)) for i in live if i.last]
        step.results = results

    def _finish(self, step: Step) -> None:
        if log.isEnabledFor(logging.DEBUG):
            ms = {k: round(v * 1000, 1) for k, v in step.seconds.items()}
            wall = (time.monotonic() - step.started) * 1000
            log.debug("step: %d streams, %d chunks, %s ms, %.1f ms wall", len(step), len(step.results), ms, wall)
        _, changed = self.scheduler.postprocess(step)  # first, so a slot is free once its final result is out
        for seq, result in step.results:
            seq.publish(result)
        self.notify(changed)

    def _greedy(self, items: list[StepItem], r: int) -> list[list[tuple[int, int]]]:
        pool = self.decoder_state
        if r == 0 and (first := [i.slot for i in items if i.first]):
            idx = torch.tensor(first, device=self.device)
            start = self.model.decoder.initial_state(len(first), self.device)
            pool.h[:, idx], pool.c[:, idx], pool.g[idx] = start.h, start.c, start.g
        idx = torch.tensor([i.slot for i in items], device=self.device)
        enc = torch.nn.utils.rnn.pad_sequence([i.encoded[r] for i in items], batch_first=True).float()
        lens = torch.tensor([i.encoded[r].size(0) for i in items], device=self.device)
        emission, state = self.model.decoder.decode(enc, lens, pool.select(idx))
        pool.h[:, idx], pool.c[:, idx], pool.g[idx] = state.h, state.c, state.g
        return emission.per_stream(len(items))

    def _fail(self, step: Step) -> None:
        failed, changed = self.scheduler.postprocess(step, failed=True)
        for seq in failed:
            seq.publish(StreamResult(seq.stream_id, [], "", is_final=True, error="inference_error"))
        self.notify(changed)


def _by_mode(items: list, mode_of: Callable) -> dict:
    """Items grouped by lookahead mode: shapes differ between modes."""
    groups: dict = defaultdict(list)
    for item in items:
        groups[mode_of(item)].append(item)
    return groups
