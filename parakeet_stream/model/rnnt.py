"""LSTM prediction network, joint network and batched greedy RNN-T decoding (greedy.py's loop).

Blank is the last output id and doubles as the start symbol (its embedding is zero). Greedy
decoding emits at most `max_symbols` tokens per encoder frame, then moves on, as NeMo does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .config import DecoderConfig
from .greedy import GreedyPass, unpack


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

    def step(self, tokens: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """One label per stream: tokens [B], h and c [layers, B, H] -> (out [B, H], (h, c)).

        The same LSTM as `forward`, one cell per layer: the fused multi-layer LSTM reorders its
        weights on every call on CPU (measured 4x slower at one step of a few streams)."""
        x = self.embed(tokens) * (tokens != self.blank).unsqueeze(-1)
        hs, cs = [], []
        for layer in range(self.lstm.num_layers):
            weights = [getattr(self.lstm, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            x, cell = torch.lstm_cell(x, (h[layer], c[layer]), *weights)
            hs.append(x)
            cs.append(cell)
        return x, (torch.stack(hs), torch.stack(cs))


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
    """Tokens found by one greedy pass, flat over the batch, stream by stream."""

    stream: list[int]
    token: list[int]
    frame: list[int]

    @classmethod
    def of(cls, per_stream: list[list[tuple[int, int]]]) -> "Emission":
        flat = [(b, tok, t) for b, found in enumerate(per_stream) for tok, t in found]
        return cls(*(list(x) for x in zip(*flat))) if flat else cls([], [], [])

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

    @torch.no_grad()
    def initial_state(self, batch: int, device=None, dtype=torch.float32) -> DecoderState:
        shape = (self.cfg.pred_rnn_layers, batch, self.cfg.pred_hidden)
        zeros = torch.zeros(shape, device=device, dtype=dtype)
        start = torch.full((batch, 1), self.blank, device=device, dtype=torch.long)
        out, (h, c) = self.predictor(start, (zeros, zeros.clone()))
        return DecoderState(h, c, self.joint.pred(out[:, 0]))

    @torch.no_grad()
    def state_pool(self, slots: int, device=None) -> DecoderState:
        """The states of `slots` streams, every one at the start, with `reset` to start one over."""
        start = self.initial_state(1, device)
        return DecoderState(start.h.repeat(1, slots, 1), start.c.repeat(1, slots, 1), start.g.repeat(slots, 1), start)

    @torch.no_grad()
    def label_prior(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """The model's own prior of each label of each sequence given the labels before it, with no
        audio (the joint's encoder input left at its bias, blank left out): log-probabilities, one
        array per sequence. An estimate of the language model the prediction network learned
        (internal LM estimation, as in Meng et al. 2021), used to judge a key phrase's evidence."""
        if not sequences:
            return []
        device = self.joint.out.weight.device
        longest = max(map(len, sequences))
        labels = torch.full((len(sequences), longest), self.blank, dtype=torch.long)
        for row, seq in enumerate(sequences):
            labels[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        labels = labels.to(device)
        history = torch.cat([torch.full_like(labels[:, :1], self.blank), labels[:, :-1]], 1)  # blank starts
        zeros = torch.zeros(self.cfg.pred_rnn_layers, len(sequences), self.cfg.pred_hidden, device=device,
                            dtype=self.joint.out.weight.dtype)
        out, _ = self.predictor(history, (zeros, zeros.clone()))
        logits = self.joint(self.joint.enc.bias, self.joint.pred(out))[..., : self.blank].float()
        logp = torch.log_softmax(logits, -1).gather(2, labels.clamp(max=self.blank - 1).unsqueeze(2))[..., 0].cpu()
        return [logp[row, : len(seq)].numpy() for row, seq in enumerate(sequences)]

    @torch.no_grad()
    def decode(self, enc: torch.Tensor, lengths: torch.Tensor, state: DecoderState,
               window: int | None = None) -> tuple[Emission, DecoderState]:
        """Greedy over enc [B, T, D] for every stream at once (label looping, greedy.py)."""
        done = GreedyPass(self, enc, lengths, state, window).run()
        return Emission.of(unpack(done.packed().cpu().numpy())), DecoderState(*done.state())
