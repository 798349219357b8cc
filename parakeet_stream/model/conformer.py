"""Cache-aware FastConformer encoder: whole-utterance forward and batched stream step.

Module names follow NeMo's so converted checkpoints map one to one (apart from the fused QKV).
"""

from __future__ import annotations

import math
from functools import cache, partial
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .attention import RelPositionSelfAttention, chunked_limited_allowed, relative_positions
from .config import EncoderConfig, Lookahead
from .subsampling import CausalSubsampling, conv_out_length


@dataclass(frozen=True)
class ChunkSpec:
    """How NeMo's CacheAwareStreamingAudioBuffer cuts a stream of mel frames for one lookahead."""

    first_frames: int  # mel frames of the first chunk
    chunk_frames: int  # mel frames of every later chunk
    pre_cache: int  # mel frames of the previous chunk prepended to later chunks
    drop: int  # leading pre-encoded frames dropped from every later chunk
    out_frames: int  # encoder frames per full chunk
    factor: int  # subsampling factor

    @property
    def window(self) -> int:
        """Mel frames each batched step sees: later chunks, and the first one left-padded to match."""
        return self.pre_cache + self.chunk_frames

    @property
    def first_pad(self) -> int:
        return self.window - self.first_frames

    def frames_through(self, chunk: int) -> int:
        """Mel frames of a stream up to the end of its chunk `chunk` (0-based), lookahead included:
        the one definition of where a chunk ends (both the samples and the frames a chunk waits
        for are counted from it)."""
        return self.first_frames + chunk * self.chunk_frames

    def size(self, chunk: int) -> int:
        """Mel frames of chunk `chunk` alone."""
        return self.frames_through(chunk) - (self.frames_through(chunk - 1) if chunk else 0)

    def shortest_last(self, chunk: int) -> int:
        """Fewest mel frames a partial last chunk `chunk` keeps: NeMo's streaming buffer drops a last
        piece shorter than one subsampling step (a first chunk keeps any)."""
        return 1 if chunk == 0 else self.factor


@cache  # a pure function of two small values, asked for per chunk on the hot path
def chunk_spec(lookahead: Lookahead, factor: int) -> ChunkSpec:
    right, pre_cache = lookahead[1], factor + 1
    return ChunkSpec(
        first_frames=1 + factor * right,
        chunk_frames=factor * (1 + right),
        pre_cache=pre_cache,
        drop=1 + (pre_cache - 1) // factor,
        out_frames=right + 1,
        factor=factor,
    )


@dataclass
class EncoderCache:
    """Streaming state of a batch of streams (or of the whole slot pool).

    Keys and values are ring buffers of C + T frames (C: longest left context, T: most frames a
    step adds): a step writes its new frames at `head`, then reads its whole attention window
    back in time order with one gather, so nothing is shifted, concatenated or rewritten.
    """

    keys: torch.Tensor  # [layers, B, C + T, D] projected keys of the last frames
    values: torch.Tensor  # [layers, B, C + T, D]
    conv: torch.Tensor  # [layers, B, D, kernel-1] depthwise-conv inputs of the last frames
    length: torch.Tensor  # [B] valid frames of left context (at most C)
    head: torch.Tensor  # [B] ring index where the next frame is written

    @classmethod
    def zeros(cls, cfg: EncoderConfig, batch: int, device=None, dtype=torch.float32) -> "EncoderCache":
        kv = (cfg.n_layers, batch, _ring_frames(cfg), cfg.d_model)
        return cls(
            keys=torch.zeros(kv, device=device, dtype=dtype),
            values=torch.zeros(kv, device=device, dtype=dtype),
            conv=torch.zeros(cfg.n_layers, batch, cfg.d_model, cfg.conv_kernel_size - 1, device=device, dtype=dtype),
            length=torch.zeros(batch, dtype=torch.long, device=device),
            head=torch.zeros(batch, dtype=torch.long, device=device),
        )

    @staticmethod
    def slot_bytes(cfg: EncoderConfig, dtype: torch.dtype) -> int:
        """Memory of one stream's keys, values and conv inputs (what `zeros` allocates per row)."""
        frames = 2 * _ring_frames(cfg) + cfg.conv_kernel_size - 1
        return cfg.n_layers * cfg.d_model * frames * torch.finfo(dtype).bits // 8

    def reset(self, idx: torch.Tensor) -> None:
        self.keys[:, idx] = 0
        self.values[:, idx] = 0
        self.conv[:, idx] = 0
        self.length[idx] = 0
        self.head[idx] = 0


def _ring_frames(cfg: EncoderConfig) -> int:
    """C + T of EncoderCache: the longest left context and the most frames one step adds."""
    return max(left for left, _ in cfg.att_context_sizes) + max(right + 1 for _, right in cfg.att_context_sizes)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.linear2(F.silu(self.linear1(x)))


class CausalConvModule(nn.Module):
    """Pointwise conv + GLU, causal depthwise conv, layer norm, swish, pointwise conv; [B, T, D] in and out."""

    def __init__(self, d_model: int, kernel: int, bias: bool):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel, groups=d_model, bias=bias)
        self.batch_norm = nn.LayerNorm(d_model)  # NeMo's name, though it is a layer norm
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, 1, bias=bias)

    def forward(self, x, pad_mask, cache=None):
        """pad_mask [B, T] True = padding; cache [B, D, kernel-1] or None. Returns (out, new cache)."""
        h = F.glu(F.linear(x, self.pointwise_conv1.weight.squeeze(-1), self.pointwise_conv1.bias), dim=-1)
        h = h.masked_fill(pad_mask.unsqueeze(-1), 0.0).transpose(1, 2)
        ctx = self.depthwise_conv.kernel_size[0] - 1
        h = F.pad(h, (ctx, 0)) if cache is None else torch.cat((cache, h), dim=-1)
        new_cache = h[:, :, -ctx:]
        h = self.depthwise_conv(h).transpose(1, 2)
        h = F.silu(self.batch_norm(h))
        return F.linear(h, self.pointwise_conv2.weight.squeeze(-1), self.pointwise_conv2.bias), new_cache


class ConformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d, bias = cfg.d_model, cfg.use_bias
        self.norm_feed_forward1 = nn.LayerNorm(d)
        self.feed_forward1 = FeedForward(d, d * cfg.ff_expansion, bias)
        self.norm_self_att = nn.LayerNorm(d)
        self.self_attn = RelPositionSelfAttention(d, cfg.n_heads, bias)
        self.norm_conv = nn.LayerNorm(d)
        self.conv = CausalConvModule(d, cfg.conv_kernel_size, bias)
        self.norm_feed_forward2 = nn.LayerNorm(d)
        self.feed_forward2 = FeedForward(d, d * cfg.ff_expansion, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x, pos_emb, att_mask, pad_mask, extend=None, conv_cache=None):
        res = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        att = self.self_attn(self.norm_self_att(res), pos_emb, att_mask, extend)
        res = res + att
        conv, conv_cache = self.conv(self.norm_conv(res), pad_mask, conv_cache)
        res = res + conv
        res = res + 0.5 * self.feed_forward2(self.norm_feed_forward2(res))
        return self.norm_out(res), conv_cache


class ConformerEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_encode = CausalSubsampling(cfg.feat_in, cfg.d_model, cfg.subsampling_channels, cfg.subsampling_factor)
        self.layers = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.n_layers))
        self.xscale = math.sqrt(cfg.d_model) if cfg.xscaling else None
        self._pos: dict = {}
        self._frames: dict[tuple[int, Lookahead], int] = {}

    def chunk_spec(self, lookahead: Lookahead) -> ChunkSpec:
        return chunk_spec(lookahead, self.cfg.subsampling_factor)

    def check_lookahead(self, lookahead: Lookahead | None) -> Lookahead:
        return self.cfg.check_lookahead(lookahead)

    def _pos_emb(self, length: int, like: torch.Tensor) -> torch.Tensor:
        key = (length, like.device)
        if key not in self._pos:
            self._pos[key] = relative_positions(length, self.cfg.d_model, like.device)
        return self._pos[key].to(like.dtype)

    def _scale(self, x):
        return x * self.xscale if self.xscale else x

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor, lookahead: Lookahead | None = None):
        """Whole utterances: feats [B, T, feat_in], lengths [B] -> (encoded [B, T', D], lengths [B])."""
        lookahead = self.check_lookahead(lookahead)
        x, lens, _ = self.pre_encode(feats, lengths)
        return self.encode_subsampled(x, lens, lookahead), lens

    def encode_subsampled(self, x: torch.Tensor, lens: torch.Tensor, lookahead: Lookahead) -> torch.Tensor:
        """The conformer layers over whole pre-encoded utterances x [B, T', D] -> [B, T', D]."""
        x = self._scale(x)
        t = x.size(1)
        pos = torch.arange(t, device=x.device)
        valid = pos.unsqueeze(0) < lens.unsqueeze(1)
        allowed = chunked_limited_allowed(pos, pos, lookahead).unsqueeze(0) & valid.unsqueeze(1) & valid.unsqueeze(2)
        att_mask, pad_mask = ~allowed, ~valid
        pos_emb = self._pos_emb(t, x)
        for layer in self.layers:
            x, _ = layer(x, pos_emb, att_mask, pad_mask)
        return x

    def stream_pre_encode(self, feats, lengths, start, lookahead: Lookahead):
        """Subsample one chunk of each stream: feats [B, window, feat_in] (pre-encode cache + new
        frames; first chunks left-padded by `first_pad` zero frames with start = first_pad), valid
        frames [start, start + lengths). Returns (x [B, T, D], lengths [B])."""
        spec = self.chunk_spec(lookahead)
        x, lens, first = self.pre_encode(feats, lengths, start)
        return x[:, spec.drop :], (first + lens - spec.drop).clamp(min=0)

    def stream_frames(self, start: int, length: int, lookahead: Lookahead) -> int:
        """The valid frames `stream_pre_encode` gives a chunk whose mel frames [start, start + length)
        are valid: its returned length, known on the host without a copy from the device."""
        key = (start + length, lookahead)
        if key not in self._frames:  # a few window shapes per mode, asked for per chunk
            self._frames[key] = max(0, conv_out_length(start + length, self.pre_encode.stages)
                                    - self.chunk_spec(lookahead).drop)
        return self._frames[key]

    def stream_layers(self, x, lens, pool: EncoderCache, slots: torch.Tensor, lookahead: Lookahead):
        """The conformer layers over one pre-encoded chunk per stream; streams' caches live in
        `pool` at `slots` and are updated there. Returns encoded [B, T, D]."""
        x = self._scale(x)
        t = x.size(1)
        c, size = lookahead[0], pool.keys.size(2)
        cached, head = pool.length[slots], pool.head[slots]
        pos = torch.arange(c + t, device=x.device)
        offset = c - cached.clamp(max=c)
        valid = (pos.unsqueeze(0) >= offset.unsqueeze(1)) & (pos.unsqueeze(0) < (lens + c).unsqueeze(1))
        allowed = chunked_limited_allowed(pos[c:], pos, lookahead).unsqueeze(0) & valid[:, c:].unsqueeze(2) & valid.unsqueeze(1)
        att_mask, pad_mask = ~allowed, ~valid[:, c:]
        pos_emb = self._pos_emb(c + t, x)
        rows = slots.unsqueeze(1)
        write = (head.unsqueeze(1) + torch.arange(t, device=x.device)) % size
        window = (head.unsqueeze(1) + torch.arange(-c, t, device=x.device)) % size  # oldest first

        def extend(keys, values, i):
            pool.keys[i][rows, write], pool.values[i][rows, write] = keys, values
            return pool.keys[i][rows, window], pool.values[i][rows, window]

        for i, layer in enumerate(self.layers):
            x, pool.conv[i, slots] = layer(x, pos_emb, att_mask, pad_mask, partial(extend, i=i), pool.conv[i, slots])
        pool.length[slots] = (cached + t).clamp(max=size)
        pool.head[slots] = (head + t) % size
        return x

