"""bfloat16 Linear layers whose weights are packed once for oneDNN, on CPUs with native bfloat16.

A plain bfloat16 `F.linear` on CPU reorders its weight into oneDNN's blocked layout on every call;
a streaming step is dozens of such products over a few rows each, so that reorder is a large part
of a step's weight traffic. Packed once at start-up (as PyTorch's inductor does when it freezes
a model), the product gives the same bits (tests/test_precision.py) in less time.
"""

from __future__ import annotations

import torch
from torch import nn

ROWS_HINT = 16  # rows a step's products usually have (a few streams x a chunk's frames): the layout's tuning


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """An nn.Linear's product with its weight in oneDNN's layout (not in the state dict: made from one)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` by its PackedLinear; returns how many."""
    count = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child))
            count += 1
        else:
            count += pack_linears(child)
    return count
