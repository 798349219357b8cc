"""The model behind three worker threads joined by queues.

pre-encode: features + subsampling for every stream with new audio, batched;
encode: one batched cache-aware encoder step over the next chunk of every ready stream;
decode: one batched greedy RNN-T pass over those chunks, results published per stream.
A failure in a stage fails only the streams of that batch (`inference_error`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict, deque
from typing import Callable

import torch

from ..model import ParakeetModel
from .scheduler import Scheduler
from .sequence import Chunk, Sequence, StreamResult, feature_batch

log = logging.getLogger(__name__)
_STOP = object()


class ChunkRounds:
    """Chunks waiting for a stage, in order per stream. A round takes the oldest chunk of every
    stream with work, so whatever piled up while the stage was busy runs as one batch.

    With `expected` and `max_wait`, a round that holds fewer streams than `expected()` waits up
    to `max_wait` seconds for the others: unaligned streams then share steps instead of each
    arriving chunk paying for a whole (memory-bound) step of its own.
    """

    def __init__(self, expected: Callable[[], int] | None = None, max_wait: float = 0.0) -> None:
        self._q: queue.Queue = queue.Queue()
        self._pending: dict[int, deque[Chunk]] = defaultdict(deque)
        self._expected = expected
        self._max_wait = max_wait

    def put(self, chunks) -> None:
        self._q.put(chunks)

    def next_round(self):
        items = [] if self._pending else [self._q.get()]
        self._drain(items)
        if self._expected and self._max_wait > 0 and not any(i is _STOP for i in items):
            deadline = time.monotonic() + self._max_wait
            while self._streams(items) < self._expected() and (left := deadline - time.monotonic()) > 0:
                try:
                    items.append(self._q.get(timeout=left))
                except queue.Empty:
                    break
                self._drain(items)
        if any(item is _STOP for item in items):
            return _STOP
        for chunks in items:
            for c in chunks:
                self._pending[c.seq.stream_id].append(c)
        heads = [q.popleft() for q in self._pending.values()]
        self._pending = defaultdict(deque, {sid: q for sid, q in self._pending.items() if q})
        return heads

    def _drain(self, items: list) -> None:
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return

    def _streams(self, items: list) -> int:
        ids = set(self._pending)
        for chunks in items:
            ids.update(c.seq.stream_id for c in chunks if c is not _STOP)
        return len(ids)


class ModelRunner:
    def __init__(
        self,
        model: ParakeetModel,
        scheduler: Scheduler,
        on_release: Callable[[Sequence], None],
        endpoint_seconds: float = 0.8,
        max_batch: int | None = None,
        batch_wait: float = 0.0,
    ):
        self.model = model
        self.max_batch = max_batch
        self.scheduler = scheduler
        self.on_release = on_release
        self.endpoint_frames = max(1, round(endpoint_seconds / model.frame_seconds))
        self.eou_id = model.tokenizer.eou_id if model.tokenizer else None
        self.device = model.features.fb.device
        self._dirty: dict[int, Sequence] = {}
        self._wake = threading.Condition()
        self._flight = threading.Lock()
        self._encode_q = ChunkRounds(lambda: len(scheduler.active), batch_wait)
        self._decode_q = ChunkRounds()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._loop, args=(self._pre_encode_wait, "pre_encode"), name="pre-encode", daemon=True),
            threading.Thread(target=self._loop, args=(self._encode_q.next_round, "encode"), name="encode", daemon=True),
            threading.Thread(target=self._loop, args=(self._decode_q.next_round, "decode"), name="decode", daemon=True),
        ]

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._encode_q.put(_STOP)
        self._decode_q.put(_STOP)
        for t in self._threads:
            t.join(timeout=10)

    def wake(self, seq: Sequence) -> None:
        with self._wake:
            self._dirty[seq.stream_id] = seq
            self._wake.notify()

    def cancel(self, seq: Sequence) -> None:
        with self._flight:
            seq.cancelled = True
            idle = seq.in_flight == 0
        if idle:
            self.on_release(seq)

    # --- thread loops --------------------------------------------------------------------
    def _loop(self, wait: Callable, stage: str) -> None:
        while True:
            batch = wait()
            if batch is _STOP:
                return
            try:
                with torch.inference_mode():
                    getattr(self, stage)(batch)
            except Exception as exc:  # noqa: BLE001 - a model fault must not kill the thread
                self._fail(batch, exc)

    def _pre_encode_wait(self):
        with self._wake:
            while not self._dirty and not self._stopped:
                self._wake.wait()
            if self._stopped:
                return _STOP
            batch, self._dirty = list(self._dirty.values()), {}
        return [s for s in batch if s.slot is not None and not (s.cancelled or s.failed or s.finished_input)]

    # --- stages ----------------------------------------------------------------------------
    def pre_encode(self, seqs: list[Sequence]) -> None:
        if not seqs:
            return
        ending = {s.stream_id for s in seqs if s.final_requested}
        feature_batch(self.model.features, seqs, ending)
        fcfg = self.model.cfg.features
        chunks: list[Chunk] = []
        for seq in seqs:
            cut = seq.cut_chunks(fcfg.hop_length, fcfg.n_fft)
            if seq.stream_id in ending:
                seq.finished_input = True
                cut.append(Chunk(seq, None, 0, 0, time.monotonic(), last=True))
            chunks += cut
        real = [c for c in chunks if c.window is not None]
        for group in self._batches(real):
            self._pre_encode_group(group)
        with self._flight:
            chunks = [c for c in chunks if not c.seq.cancelled]
            for c in chunks:
                c.seq.in_flight += 1
        if chunks:
            self._encode_q.put(chunks)

    def _pre_encode_group(self, group: list[Chunk]) -> None:
        dev = self.device
        feats = torch.stack([c.window for c in group]).to(dev)
        lengths = torch.tensor([c.length for c in group], device=dev)
        start = torch.tensor([c.start for c in group], device=dev)
        x, lens = self.model.encoder.stream_pre_encode(feats, lengths, start, group[0].seq.lookahead)
        for c, xi, li in zip(group, x, lens.tolist()):
            c.x, c.x_len, c.window = xi, li, c.window[:0]

    def encode(self, chunks: list[Chunk]) -> None:
        live = self._drop_dead(chunks)
        real = [c for c in live if c.x is not None]
        for group in self._batches(real):
            idx = torch.tensor([c.seq.slot for c in group], device=self.device)
            x = torch.stack([c.x for c in group])
            lens = torch.tensor([c.x_len for c in group], device=self.device)
            enc = self.model.encoder.stream_layers(x, lens, self.scheduler.cache, idx, group[0].seq.lookahead)
            for c, e in zip(group, enc):
                c.encoded = e
        if live:
            self._decode_q.put(live)

    def decode(self, chunks: list[Chunk]) -> None:
        live = self._drop_dead(chunks)
        found: dict[int, list[tuple[int, int]]] = {}
        for group in self._batches([c for c in live if c.encoded is not None], by_mode=False):
            idx = torch.tensor([c.seq.slot for c in group], device=self.device)
            pool = self.scheduler.decoder
            enc = torch.nn.utils.rnn.pad_sequence([c.encoded for c in group], batch_first=True)
            lens = torch.tensor([c.x_len for c in group], device=self.device)
            emission, state = self.model.decoder.decode(enc, lens, pool.select(idx))
            pool.h[:, idx], pool.c[:, idx], pool.g[idx] = state.h, state.c, state.g
            found.update({id(c): toks for c, toks in zip(group, emission.per_stream(len(group)))})
        for c in live:
            self._chunk_done(c)  # first, so a stream's slot is free once its final result is out
            self._publish(c, found.get(id(c), []))

    # --- results ------------------------------------------------------------------------
    def _publish(self, chunk: Chunk, tokens: list[tuple[int, int]]) -> None:
        seq, fs = chunk.seq, self.model.frame_seconds
        ids = [tok for tok, _ in tokens]
        frames = [seq.frames_decoded + t for _, t in tokens]
        seq.frames_decoded += chunk.x_len if chunk.encoded is not None else 0
        seq.token_ids += ids
        text = seq.detok.push(ids) + (seq.detok.flush() if chunk.last else "")
        if chunk.encoded is None and not chunk.last:
            return
        result = StreamResult(
            stream_id=seq.stream_id,
            token_ids=ids,
            text=text,
            is_final=chunk.last,
            utterance_end=self._utterance_end(seq, ids, frames),
            start=frames[0] * fs if frames else None,
            end=frames[-1] * fs if frames else None,
            token_times=[f * fs for f in frames],
            audio_seconds=seq.frames_decoded * fs,
            latency=time.monotonic() - chunk.ready_at if chunk.encoded is not None else None,
        )
        seq.publish(result)

    def _utterance_end(self, seq: Sequence, ids: list[int], frames: list[int]) -> bool:
        if frames:
            seq.last_token_frame = frames[-1]
            seq.utterance_has_tokens = True
        if self.eou_id is not None:
            ended = self.eou_id in ids
            if ended:
                seq.utterance_has_tokens = ids[-1] != self.eou_id
            return ended
        if seq.utterance_has_tokens and seq.frames_decoded - 1 - seq.last_token_frame >= self.endpoint_frames:
            seq.utterance_has_tokens = False
            return True
        return False

    # --- bookkeeping -----------------------------------------------------------------------
    def _drop_dead(self, chunks: list[Chunk]) -> list[Chunk]:
        live = []
        for c in chunks:
            if c.seq.cancelled or c.seq.failed:
                self._chunk_done(c)
            else:
                live.append(c)
        return live

    def _chunk_done(self, chunk: Chunk) -> None:
        seq = chunk.seq
        with self._flight:
            seq.in_flight -= 1
            release = seq.in_flight == 0 and (seq.cancelled or seq.failed or chunk.last)
        if release:
            self.on_release(seq)

    def _fail(self, batch, exc: Exception) -> None:
        log.exception("inference failed for %d chunk(s)", len(batch), exc_info=exc)
        chunks = [c for c in batch if isinstance(c, Chunk)]
        seqs = {id(s): s for s in [c.seq for c in chunks] + [s for s in batch if isinstance(s, Sequence)]}
        failed = [s for s in seqs.values() if not (s.failed or s.cancelled)]
        for seq in failed:
            seq.failed = True
        for c in chunks:
            self._chunk_done(c)
        for seq in seqs.values():
            with self._flight:
                idle = seq.in_flight == 0
            if idle and not chunks:
                self.on_release(seq)
        for seq in failed:
            seq.publish(StreamResult(seq.stream_id, [], "", is_final=True, error="inference_error"))

    def _batches(self, chunks: list[Chunk], by_mode: bool = True) -> list[list[Chunk]]:
        """Chunks grouped by lookahead mode (shapes differ between modes), at most max_batch each."""
        groups: dict = defaultdict(list)
        for c in chunks:
            groups[c.seq.lookahead if by_mode else None].append(c)
        size = self.max_batch or max(1, len(chunks))
        return [g[i : i + size] for g in groups.values() for i in range(0, len(g), size)]
