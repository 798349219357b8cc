"""Causal depthwise-striding subsampling (FastConformer's pre-encoder), 2**k-fold in time.

Each stage pads 2 frames on the left and 1 on the right (time and frequency) and strides by
2. Frames outside each stream's valid span are zeroed before every layer, as NeMo's
MaskedConvSequential does; the span may start late (`start`, even), which lets a stream's
first chunk (which has no pre-encode cache) share a batch with later chunks that have one:
zero frames before `start` act exactly like the causal zero padding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

KERNEL, STRIDE, LEFT_PAD, RIGHT_PAD = 3, 2, 2, 1


def conv_out_length(length: torch.Tensor | int, stages: int):
    """Frames out of `stages` causal stride-2 stages: floor(L / 2) + 1 each (0 stays 0 in masks)."""
    for _ in range(stages):
        length = (length + LEFT_PAD + RIGHT_PAD - KERNEL) // STRIDE + 1
    return length


class CausalConv2d(nn.Conv2d):
    """Pads LEFT_PAD before and RIGHT_PAD after, in time and frequency: as the convolution's own
    padding of LEFT_PAD on both sides, less the last output row or column the extra padding makes
    (its zeros change no other output). The convolution pads in place, where `F.pad` copied the
    input out of channels-last: pre-encode at batch 16 took 2-3x as long that way (docs/performance.md)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, padding=LEFT_PAD, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[:, :, : conv_out_length(x.size(2), 1), : conv_out_length(x.size(3), 1)]


class CausalSubsampling(nn.Module):
    """[B, T, feat_in] log-mel -> [B, T', d_model]. Module names follow NeMo's `pre_encode`."""

    def __init__(self, feat_in: int, d_model: int, channels: int, factor: int):
        super().__init__()
        self.stages = int(math.log2(factor))
        layers: list[nn.Module] = [CausalConv2d(1, channels, KERNEL, STRIDE), nn.ReLU()]
        for _ in range(self.stages - 1):
            layers += [
                CausalConv2d(channels, channels, KERNEL, STRIDE, groups=channels),
                nn.Conv2d(channels, channels, 1),
                nn.ReLU(),
            ]
        self.conv = nn.Sequential(*layers)
        # channels-last convolutions are ~3x faster on CPU (oneDNN's native layout), same results
        self.conv.to(memory_format=torch.channels_last)
        self.out = nn.Linear(channels * conv_out_length(feat_in, self.stages), d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, start: torch.Tensor | None = None):
        """x [B, T, F]; frames [start, start + lengths) are valid. Returns (y, out_lengths, out_start)."""
        if start is None:
            start = torch.zeros_like(lengths)
        x = x.unsqueeze(1)
        end = start + lengths
        for layer in self.conv:
            x = x * _span_mask(x.size(2), start, end, x.dtype).view(x.size(0), 1, -1, 1)
            x = layer(x)
            if isinstance(layer, CausalConv2d):
                start, end = start // STRIDE, conv_out_length(end, 1)
        x = x * _span_mask(x.size(2), start, end, x.dtype).view(x.size(0), 1, -1, 1)
        b, c, t, f = x.shape
        y = self.out(x.transpose(1, 2).reshape(b, t, c * f))
        return y, end - start, start


def _span_mask(t: int, start: torch.Tensor, end: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    idx = torch.arange(t, device=start.device)
    return ((idx >= start.unsqueeze(1)) & (idx < end.unsqueeze(1))).to(dtype)
