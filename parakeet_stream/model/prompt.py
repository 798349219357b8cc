"""Language-ID prompt conditioning between the encoder and the joint (nemotron-3.5-asr).

NeMo's EncDecRNNTBPEModelWithPrompt joins the one-hot of a prompt index to every encoder frame
and maps the pair back to d_model with Linear(D + P, 2D), ReLU, Linear(2D, D), before the joint,
in its offline forward and in every streaming step alike. Each frame is mapped alone, so it does
not matter where a chunk's frames are cut. The one-hot only selects a column of the first
weight: that column is added instead of building [B, T, P] one-hots (a batch may mix prompts).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .config import PromptConfig


class PromptKernel(nn.Module):
    def __init__(self, d_model: int, cfg: PromptConfig):
        super().__init__()
        self.hidden = nn.Linear(d_model + cfg.num_prompts, 2 * d_model)  # NeMo's prompt_kernel.0
        self.out = nn.Linear(2 * d_model, d_model)  # NeMo's prompt_kernel.2

    def forward(self, enc: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        """enc [B, T, D], prompts [B] prompt indices (one per row) -> [B, T, D]."""
        d = enc.size(-1)
        w = self.hidden.weight
        h = F.linear(enc, w[:, :d], self.hidden.bias) + w[:, d:].T[prompts].unsqueeze(1)
        return self.out(torch.relu(h))
