"""LSTM prediction network, joint network and batched greedy RNN-T decoding.

Blank is the last output id and doubles as the start symbol (its embedding is zero). Greedy
decoding emits at most `max_symbols` tokens per encoder frame, then moves on, as NeMo does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import DecoderConfig


class Predictor(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.blank = cfg.num_classes
        self.embed = nn.Embedding(cfg.num_classes + 1, cfg.pred_hidden, padding_idx=cfg.num_classes)
        self.lstm = nn.LSTM(cfg.pred_hidden, cfg.pred_hidden, cfg.pred_rnn_layers)

    def forward(self, tokens: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        """tokens [B, U] (blank = start symbol), state ([layers, B, H] x2) -> (out [B, U, H], state)."""
        emb = self.embed(tokens) * (tokens != self.blank).unsqueeze(-1)
        out, state = self.lstm(emb.transpose(0, 1), state)
        return out.transpose(0, 1), state


class Joint(nn.Module):
    def __init__(self, d_model: int, cfg: DecoderConfig):
        super().__init__()
        self.enc = nn.Linear(d_model, cfg.joint_hidden)
        self.pred = nn.Linear(cfg.pred_hidden, cfg.joint_hidden)
        self.out = nn.Linear(cfg.joint_hidden, cfg.num_classes + 1)

    def forward(self, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Projected encoder and predictor outputs (broadcastable) -> logits."""
        return self.out(torch.relu(f + g))


@dataclass
class DecoderState:
    """Greedy state of a batch of streams, or of the whole slot pool: the LSTM state and the
    projected predictor output for the last token. Its users move rows with `gather`, `scatter`
    and `reset`, as EncoderCache's do, and never touch the fields."""

    h: torch.Tensor  # [layers, B, H]
    c: torch.Tensor  # [layers, B, H]
    g: torch.Tensor  # [B, J]
    start: "DecoderState | None" = None  # a pool's: one stream before any token, what `reset` writes

    def gather(self, slots: torch.Tensor) -> "DecoderState":
        """The state of the streams at `slots` (a copy)."""
        return DecoderState(self.h[:, slots], self.c[:, slots], self.g[slots])

    def scatter(self, slots: torch.Tensor, state: "DecoderState") -> None:
        """Write `state` (one row per slot, or one row for all) back at `slots`."""
        self.h[:, slots], self.c[:, slots], self.g[slots] = state.h, state.c, state.g

    def reset(self, slots: torch.Tensor) -> None:
        """The streams at `slots` start over (a pool made by `GreedyDecoder.state_pool` only)."""
        self.scatter(slots, self.start)


@dataclass
class Emission:
    """Tokens found by one greedy pass, flat over the batch in emission order."""

    stream: list[int]
    token: list[int]
    frame: list[int]

    def per_stream(self, batch: int) -> list[list[tuple[int, int]]]:
        out: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
        for b, tok, t in zip(self.stream, self.token, self.frame):
            out[b].append((tok, t))
        return out


class GreedyDecoder(nn.Module):
    def __init__(self, d_model: int, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.blank = cfg.num_classes
        self.predictor = Predictor(cfg)
        self.joint = Joint(d_model, cfg)

    def initial_state(self, batch: int, device=None, dtype=torch.float32) -> DecoderState:
        shape = (self.cfg.pred_rnn_layers, batch, self.cfg.pred_hidden)
        zeros = torch.zeros(shape, device=device, dtype=dtype)
        start = torch.full((batch, 1), self.blank, device=device, dtype=torch.long)
        out, (h, c) = self.predictor(start, (zeros, zeros.clone()))
        return DecoderState(h, c, self.joint.pred(out[:, 0]))

    def state_pool(self, slots: int, device=None) -> DecoderState:
        """The states of `slots` streams, every one at the start, with `reset` to start one over."""
        start = self.initial_state(1, device)
        return DecoderState(start.h.repeat(1, slots, 1), start.c.repeat(1, slots, 1), start.g.repeat(slots, 1), start)

    @torch.no_grad()
    def decode(self, enc: torch.Tensor, lengths: torch.Tensor, state: DecoderState) -> tuple[Emission, DecoderState]:
        """Greedy over enc [B, T, D] for every stream at once; loops over decisions, not streams."""
        f = self.joint.enc(enc)
        b = f.size(0)
        rows = torch.arange(b, device=f.device)
        h, c, g = state.h.clone(), state.c.clone(), state.g.clone()
        t = torch.zeros(b, dtype=torch.long, device=f.device)
        symbols = torch.zeros_like(t)
        active = t < lengths
        found: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        while bool(active.any()):
            frame = f[rows, t.clamp(max=max(f.size(1) - 1, 0))]
            k = self.joint(frame, g).argmax(-1)
            emit = active & (k != self.blank)
            idx = emit.nonzero().squeeze(1)
            if idx.numel():
                out, (h_new, c_new) = self.predictor(k[idx].unsqueeze(1), (h[:, idx], c[:, idx]))
                g[idx] = self.joint.pred(out[:, 0])
                h[:, idx], c[:, idx] = h_new, c_new
                found.append((idx, k[idx], t[idx]))
            symbols = symbols + emit
            advance = active & (~emit | (symbols >= self.cfg.max_symbols))
            t = t + advance
            symbols = symbols.masked_fill(advance, 0)
            active = t < lengths
        return _emission(found), DecoderState(h, c, g)


def _emission(found) -> Emission:
    if not found:
        return Emission([], [], [])
    idx, tok, t = (torch.cat(parts).tolist() for parts in zip(*found))
    return Emission(idx, tok, t)
