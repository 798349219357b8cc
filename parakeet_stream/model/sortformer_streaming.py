"""Streaming Sortformer: each stream's speaker cache and FIFO, and the batched streaming step.

What NeMo's SortformerEncLabelModel.forward_streaming_step and SortformerModules.streaming_update_async
compute, for a batch of streams each at its own place: a chunk of mel frames (with left and right
context) is subsampled alone; [speaker cache; FIFO; chunk] of pre-encoded frames, packed per stream,
go through the encoder, Transformer and head; the chunk's own frames' probabilities are the step's
output. The chunk then joins the FIFO; when the FIFO overflows its oldest frames (at least
spkcache_update_period of them) move to the speaker cache, their silent frames update the mean
silence embedding, and a cache grown past spkcache_len is compressed back to it: per speaker its
most confidently single-speaker frames, then spkcache_sil_frames_per_spk silence frames.

With `fixed=True` a step's shapes depend on its inputs' shapes only, never on their values (what
a CUDA graph needs, engine/diarizer.py): the widths are the most the chunk can take, and every
stream's cache is compressed, kept only where it overflowed.

`sync_first_compress=True` reproduces NeMo's synchronous `streaming_update` instead (its default
when async_streaming is off): the first compression of a stream's cache scores its older frames
with this step's predictions rather than those they had when they left the FIFO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .sortformer import Sortformer, StreamingConfig, length_mask


@dataclass
class SortformerState:
    """The streaming state of B streams (NeMo's StreamingSortformerState, async layout)."""

    spkcache: torch.Tensor  # [B, spkcache_len, D] pre-encoded frames
    spkcache_preds: torch.Tensor  # [B, spkcache_len, n_spk] their probabilities when they left the FIFO
    spkcache_lengths: torch.Tensor  # [B]
    fifo: torch.Tensor  # [B, fifo_len, D]
    fifo_lengths: torch.Tensor  # [B]
    mean_sil_emb: torch.Tensor  # [B, D]
    n_sil_frames: torch.Tensor  # [B]
    compressed: torch.Tensor  # [B] bool: the cache was compressed at least once

    @classmethod
    def zeros(cls, model: Sortformer, s: StreamingConfig, batch: int, device=None, dtype=torch.float32) -> "SortformerState":
        d, n = model.cfg.encoder.d_model, model.cfg.n_spk
        z = dict(device=device, dtype=dtype)
        count = dict(device=device, dtype=torch.long)
        return cls(
            torch.zeros(batch, s.spkcache_len, d, **z), torch.zeros(batch, s.spkcache_len, n, **z),
            torch.zeros(batch, **count), torch.zeros(batch, s.fifo_len, d, **z), torch.zeros(batch, **count),
            torch.zeros(batch, d, **z), torch.zeros(batch, **count), torch.zeros(batch, dtype=torch.bool, device=device),
        )

    def select(self, rows: torch.Tensor | list[int]) -> "SortformerState":
        return SortformerState(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def put(self, rows: torch.Tensor | list[int], part: "SortformerState") -> None:
        """Write `part` (a select of these rows, stepped) back into the rows."""
        for f in fields(self):
            getattr(self, f.name)[rows] = getattr(part, f.name)

    def reset(self, rows: torch.Tensor | list[int]) -> None:
        """The rows start over: empty cache and FIFO, no silence seen."""
        for f in fields(self):
            getattr(self, f.name)[rows] = 0

    def nbytes_per_row(self) -> int:
        return sum(getattr(self, f.name)[0].numel() * getattr(self, f.name).element_size() for f in fields(self))


def _gather(x: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x [B, T, C] at idx [B, L] (clamped into range), zero where not valid -> [B, L, C]."""
    if x.size(1) == 0:  # an empty FIFO (fifo_len 0)
        return x.new_zeros(x.size(0), idx.size(1), x.size(2))
    idx = idx.clamp(0, x.size(1) - 1).expand(x.size(0), -1).unsqueeze(-1).expand(-1, -1, x.size(2))
    return torch.gather(x, 1, idx) * valid.unsqueeze(-1).to(x.dtype)


class StreamingSortformer:
    def __init__(self, model: Sortformer, streaming: StreamingConfig | None = None, sync_first_compress: bool = False):
        self.model = model
        self.cfg = streaming or model.cfg.streaming
        self.sync_first_compress = sync_first_compress
        self.factor = model.cfg.encoder.subsampling_factor
        c = self.cfg
        if c.spkcache_len < (1 + c.spkcache_sil_frames_per_spk) * model.cfg.n_spk or c.chunk_len < 1:
            raise ValueError(f"spkcache_len must be at least {(1 + c.spkcache_sil_frames_per_spk) * model.cfg.n_spk}, chunk_len at least 1")

    def init_state(self, batch: int, device=None) -> SortformerState:
        return SortformerState.zeros(self.model, self.cfg, batch, device, next(self.model.parameters()).dtype)

    def chunks(self, n_frames: int):
        """NeMo's streaming_feat_loader over one stream of n_frames mel frames: (start, end) of each
        chunk's mel frames, context included, and its left / right context in mel frames."""
        c, f = self.cfg, self.factor
        start = end = 0
        while end < n_frames:
            left = min(c.chunk_left_context * f, start)
            end = min(start + c.chunk_len * f, n_frames)
            right = min(c.chunk_right_context * f, n_frames - end)
            yield start - left, end + right, left, right
            start = end

    def own_frames(self, lengths: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """The pre-encoded frames of each chunk's own (those `step` returns), from its mel frames
        `lengths` of which left / right are context."""
        f = self.factor
        lc = torch.round(left / f).long()  # round half to even, as Python's round
        rc = torch.div(right + f - 1, f, rounding_mode="floor").long()
        return (self.model.encoder.pre_encode.out_lengths(lengths) - lc - rc).clamp(min=0)

    @torch.no_grad()
    def step(self, state: SortformerState, feats: torch.Tensor, lengths: torch.Tensor,
             left: torch.Tensor, right: torch.Tensor, fixed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk per stream: feats [B, T, n_mels] with `lengths` valid mel frames, of which
        left / right [B] are context (mel frames; a stream with no chunk this step: length 0).
        Updates `state` in place; returns (probs [B, frames, n_spk], valid frames [B]): frames the
        most valid ones, or with `fixed` the most T mel frames can give."""
        emb, emb_len = self.model.encoder.pre_encode(feats, lengths)
        lc = torch.round(left / self.factor).long()
        n = self.own_frames(lengths, left, right)
        ls, lf = state.spkcache_lengths, state.fifo_lengths
        S, Fl = state.spkcache.size(1), state.fifo.size(1)
        most = emb.size(1) if fixed else None  # own frames at most

        # [spkcache; fifo; chunk] packed per stream
        total = ls + lf + emb_len
        p = torch.arange(S + Fl + most if fixed else int(total.max()), device=feats.device).unsqueeze(0)
        src = torch.where(p < ls[:, None], p, torch.where(p < (ls + lf)[:, None], S + p - ls[:, None], S + Fl + p - (ls + lf)[:, None]))
        packed = _gather(torch.cat((state.spkcache, state.fifo, emb), 1), src, length_mask(total, p.size(1)))
        preds = self.model.speaker_probs(packed, total)

        # the chunk's own frames
        q = torch.arange(most if fixed else max(int(n.max()), 0), device=feats.device).unsqueeze(0)
        chunk_preds = _gather(preds, (ls + lf + lc)[:, None] + q, q < n[:, None])
        self._update(state, emb, preds, lc, n, most)
        return chunk_preds, n

    def _update(self, state: SortformerState, emb, preds, lc, n, most: int | None = None) -> None:
        """`most`: the most own frames a chunk has (fixed shapes), None: as many as this step's have."""
        c = self.cfg
        ls, lf = state.spkcache_lengths, state.fifo_lengths
        S, Fl = state.spkcache.size(1), state.fifo.size(1)
        fixed = most is not None
        most = most if fixed else max(int(n.max()), 0)
        # FIFO with the chunk appended: positions < lf from the FIFO, then the chunk's frames after its left context
        grown = lf + n
        p = torch.arange(Fl + most, device=emb.device).unsqueeze(0)
        is_fifo = p < lf[:, None]
        ok = p < grown[:, None]
        fifo = torch.where(is_fifo.unsqueeze(-1), _gather(state.fifo, p, ok), _gather(emb, lc[:, None] + p - lf[:, None], ok))
        fifo_preds = _gather(preds, ls[:, None] + p + lc[:, None] * (~is_fifo), ok)

        pop = torch.maximum(torch.full_like(n, c.spkcache_update_period), n - Fl + lf)
        pop = torch.where(grown > Fl, torch.minimum(pop, grown), torch.zeros_like(pop))
        popped = p < pop[:, None]
        self._silence_profile(state, fifo, fifo_preds, popped)

        # the speaker cache with the popped frames appended
        new_len = ls + pop
        # NeMo's working width (its topk breaks ties by position), or more for a chunk past chunk_len;
        # fixed: what new_len can reach (pop <= max(update period, n) as lf <= Fl), which is NeMo's
        # width where the update period is at least the chunk's pre-encoded frames (the live setting:
        # 144 and 14). Where it is not, equal scores in _compress may keep other frames than eagerly.
        nemo = S + min(max(c.spkcache_update_period, c.chunk_len), c.chunk_len + c.fifo_len)
        width = max(nemo, S + max(c.spkcache_update_period, most) if fixed else int(new_len.max()))
        k = torch.arange(width, device=emb.device).unsqueeze(0)
        in_cache = k < ls[:, None]
        ok = k < new_len[:, None]
        cache = torch.where(in_cache.unsqueeze(-1), _gather(state.spkcache, k, ok), _gather(fifo, k - ls[:, None], ok))
        old_preds = state.spkcache_preds
        if self.sync_first_compress:  # NeMo's synchronous update: the first compression rescores the cache now
            fresh = (~state.compressed & (new_len > S))[:, None, None]
            now = torch.arange(S, device=emb.device).unsqueeze(0)
            old_preds = torch.where(fresh, _gather(preds, now, now < preds.size(1)), old_preds)
        cache_preds = torch.where(in_cache.unsqueeze(-1), _gather(old_preds, k, ok), _gather(fifo_preds, k - ls[:, None], ok))

        # what stays in the FIFO
        left = grown - pop
        q = torch.arange(Fl, device=emb.device).unsqueeze(0)
        state.fifo = _gather(fifo, pop[:, None] + q, q < left[:, None])
        state.fifo_lengths = left

        full = new_len > S
        state.spkcache, state.spkcache_preds = cache[:, :S].clone(), cache_preds[:, :S].clone()
        if fixed:  # every row compressed, kept where its cache overflowed: no data-dependent rows
            kept, kept_preds = self._compress(cache, cache_preds, state.mean_sil_emb)
            state.spkcache = torch.where(full[:, None, None], kept, state.spkcache)
            state.spkcache_preds = torch.where(full[:, None, None], kept_preds, state.spkcache_preds)
        elif bool(full.any()):
            rows = full.nonzero().squeeze(1)
            state.spkcache[rows], state.spkcache_preds[rows] = self._compress(cache[rows], cache_preds[rows], state.mean_sil_emb[rows])
        state.spkcache_lengths = new_len.clamp(max=S)
        state.compressed = state.compressed | full

    def _silence_profile(self, state, frames, preds, popped) -> None:
        """Running mean of the popped frames whose probabilities sum below sil_threshold."""
        is_sil = popped & (preds.sum(-1) < self.cfg.sil_threshold)
        count = is_sil.sum(1)
        total = state.mean_sil_emb * state.n_sil_frames.unsqueeze(1) + (frames * is_sil.unsqueeze(-1)).sum(1)
        updated = total / (state.n_sil_frames + count).clamp(min=1).unsqueeze(1)
        state.mean_sil_emb = torch.where((count > 0).unsqueeze(1), updated, state.mean_sil_emb)
        state.n_sil_frames = state.n_sil_frames + count

    def _scores(self, preds: torch.Tensor, min_pos: int) -> torch.Tensor:
        """Per frame and speaker: high for confident single-speaker speech, -inf for non-speech (and
        for overlapped speech of a speaker with at least min_pos positive frames)."""
        thr = self.cfg.pred_score_threshold
        log_p = torch.log(preds.clamp(min=thr))
        log_not = torch.log((1.0 - preds).clamp(min=thr))
        scores = log_p - log_not + log_not.sum(-1, keepdim=True) - math.log(0.5)
        speech = preds > 0.5
        scores = scores.masked_fill(~speech, float("-inf"))  # a fill, not a host tensor copied in: capturable
        pos = scores > 0
        drop = ~pos & speech & (pos.sum(1, keepdim=True) >= min_pos)
        return scores.masked_fill(drop, float("-inf"))

    @staticmethod
    def _boost(scores: torch.Tensor, k: int, scale: float) -> torch.Tensor:
        """Raise each speaker's k best scores by -scale * log(0.5)."""
        idx = torch.topk(scores, k, dim=1, largest=True, sorted=False).indices
        return scores.scatter_add(1, idx, torch.full(idx.shape, -scale * math.log(0.5), dtype=scores.dtype, device=scores.device))

    def _compress(self, emb: torch.Tensor, preds: torch.Tensor, mean_sil: torch.Tensor):
        """Keep spkcache_len of the frames [B, W, *] (zero-padded ones have zero probabilities):
        per speaker its best-scored frames in time order, then its silence slots (the mean silence
        embedding, zero probabilities); slots not filled at the end, as silence too."""
        c, (b, w, n_spk) = self.cfg, preds.shape
        S, sil = c.spkcache_len, c.spkcache_sil_frames_per_spk
        per_spk = S // n_spk - sil
        scores = self._scores(preds, math.floor(per_spk * c.min_pos_scores_rate))
        if c.scores_boost_latest > 0:
            scores[:, S:] += c.scores_boost_latest
        scores = self._boost(scores, math.floor(per_spk * c.strong_boost_rate), 2.0)
        scores = self._boost(scores, math.floor(per_spk * c.weak_boost_rate), 1.0)
        if sil > 0:
            scores = torch.cat((scores, scores.new_full((b, sil, n_spk), float("inf"))), 1)
        frames = w + sil
        values, idx = torch.topk(scores.transpose(1, 2).reshape(b, -1), S, dim=1, sorted=False)
        idx = torch.where(values == float("-inf"), torch.full_like(idx, c.max_index), idx)
        idx = torch.sort(idx, dim=1).values
        disabled = idx == c.max_index
        idx = idx.remainder(frames)
        disabled |= idx >= w
        idx = idx.masked_fill(disabled, 0)
        keep = ~disabled
        kept = _gather(emb, idx, keep) + mean_sil.unsqueeze(1) * disabled.unsqueeze(-1).to(emb.dtype)
        return kept, _gather(preds, idx, keep)


def stream_features(runner: StreamingSortformer, feats: list[torch.Tensor]) -> list[torch.Tensor]:
    """Whole streams of mel frames [T_i, n_mels], all stepped together chunk by chunk (a stream
    whose chunks have run out sits the later steps out) -> each stream's probabilities [T_i', n_spk]."""
    plans = [list(runner.chunks(f.size(0))) for f in feats]
    state = runner.init_state(len(feats), feats[0].device)
    out: list[list[torch.Tensor]] = [[] for _ in feats]
    for i in range(max(len(p) for p in plans)):
        pieces = [p[i] if i < len(p) else (0, 0, 0, 0) for p in plans]
        width = max(end - start for start, end, _, _ in pieces)
        batch = feats[0].new_zeros(len(feats), width, feats[0].size(1))
        for row, (start, end, _, _) in enumerate(pieces):
            batch[row, : end - start] = feats[row][start:end]
        lengths = torch.tensor([end - start for start, end, _, _ in pieces], device=batch.device)
        left = torch.tensor([piece[2] for piece in pieces], device=batch.device)
        right = torch.tensor([piece[3] for piece in pieces], device=batch.device)
        probs, n = runner.step(state, batch, lengths, left, right)
        for row in range(len(feats)):
            out[row].append(probs[row, : int(n[row])])
    return [torch.cat(o) for o in out]
