"""Relative-position multi-head self-attention (Transformer-XL style) with a fused QKV projection.

The streaming cache holds the projected keys and values of the last frames, so a chunk
projects only its own frames. Scores are masked with -10000 (not -inf) and fully masked
query rows give zeros, as NeMo does.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

MASK_VALUE = -10000.0


def relative_positions(length: int, d_model: int, device=None) -> torch.Tensor:
    """Sinusoidal embeddings of relative positions length-1 ... -(length-1): [2*length-1, d_model]."""
    pos = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(pos.size(0), d_model, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """[b, h, t_q, 2L-1] scores over relative positions -> scores over absolute key index."""
    b, h, qlen, pos_len = x.shape
    x = F.pad(x, (1, 0)).view(b, h, -1, qlen)
    return x[:, :, 1:].reshape(b, h, qlen, pos_len)


def chunked_limited_allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, lookahead: tuple[int, int]) -> torch.Tensor:
    """[Tq, Tk] True where a query may see a key: same chunk of (right+1) frames or up to left/(right+1) chunks back."""
    left, right = lookahead
    chunk = right + 1
    diff = q_pos.unsqueeze(1) // chunk - k_pos.unsqueeze(0) // chunk
    return (diff >= 0) & (diff <= left // chunk)


class RelPositionSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, bias: bool):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))
        self._pos_cache: dict = {}

    def train(self, mode: bool = True):
        self._pos_cache.clear()
        return super().train(mode)

    def projected_positions(self, pos_emb: torch.Tensor) -> torch.Tensor:
        """linear_pos(pos_emb) as [1, h, 2L-1, d_k]; memoised at inference (weights are fixed then)."""
        key = (pos_emb.size(0), pos_emb.device, pos_emb.dtype)
        frozen = not self.training and not torch.is_grad_enabled()
        if frozen and key in self._pos_cache:
            return self._pos_cache[key]
        p = self.linear_pos(pos_emb).view(1, -1, self.h, self.d_k).transpose(1, 2)
        if frozen:
            self._pos_cache[key] = p
        return p

    @staticmethod
    def _position_scores(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """q [B, h, t, d_k] @ p [1, h, P, d_k]^T as one matmul per head (broadcasting would copy p B times)."""
        b, h, t, d = q.shape
        scores = torch.matmul(q.transpose(0, 1).reshape(h, b * t, d), p[0].transpose(-2, -1))
        return scores.view(h, b, t, -1).transpose(0, 1)

    def forward(self, x, pos_emb, mask, extend=None):
        """x [B, T, D]; pos_emb [2L-1, D] with L = cached frames + T; mask [B, T, L] True = hidden.

        extend: None (whole utterances), or a function taking this chunk's keys and values
        [B, T, D] and returning those of all L frames (the streaming cache's window).
        """
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if extend is not None:
            k, v = extend(k, v)
        q = q.view(b, t, self.h, self.d_k)
        k = k.view(b, -1, self.h, self.d_k).transpose(1, 2)
        v = v.view(b, -1, self.h, self.d_k).transpose(1, 2)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        scale = 1.0 / math.sqrt(self.d_k)
        bd = rel_shift(self._position_scores(q_v, self.projected_positions(pos_emb)))
        bd = (bd[..., : k.size(2)] * scale).masked_fill(mask.unsqueeze(1), MASK_VALUE)
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bd, scale=scale)
        out = out.masked_fill(mask.all(-1)[:, None, :, None], 0.0)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, -1))
