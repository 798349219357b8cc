"""The frame-looping greedy RNN-T decoder the engine used before label looping: the reference
the label-looping decoder (model/greedy.py) must match token for token, frame for frame
(tests/test_greedy.py), and the baseline of the decode benchmark (benchmarks/kernels/decode.py)."""

from __future__ import annotations

import torch

from parakeet_stream.model.rnnt import DecoderState, GreedyDecoder


@torch.no_grad()
def frame_looping(decoder: GreedyDecoder, enc: torch.Tensor, lengths: torch.Tensor, state: DecoderState):
    """Greedy over enc [B, T, D], one decision (a label or a move to the next frame) per stream per
    iteration. Returns ([(token, frame)] per stream, final DecoderState)."""
    f = decoder.joint.enc(enc)
    b = f.size(0)
    rows = torch.arange(b)
    h, c, g = state.h.clone(), state.c.clone(), state.g.clone()
    t = torch.zeros(b, dtype=torch.long)
    symbols = torch.zeros_like(t)
    active = t < lengths
    out: list[list[tuple[int, int]]] = [[] for _ in range(b)]
    while bool(active.any()):
        frame = f[rows, t.clamp(max=max(f.size(1) - 1, 0))]
        k = decoder.joint(frame, g).argmax(-1)
        emit = active & (k != decoder.blank)
        idx = emit.nonzero().squeeze(1)
        if idx.numel():
            o, (h_new, c_new) = decoder.predictor(k[idx].unsqueeze(1), (h[:, idx], c[:, idx]))
            g[idx] = decoder.joint.pred(o[:, 0])
            h[:, idx], c[:, idx] = h_new, c_new
            for i, tok, at in zip(idx.tolist(), k[idx].tolist(), t[idx].tolist()):
                out[i].append((tok, at))
        symbols = symbols + emit
        advance = active & (~emit | (symbols >= decoder.cfg.max_symbols))
        t = t + advance
        symbols = symbols.masked_fill(advance, 0)
        active = t < lengths
    return out, DecoderState(h, c, g)
