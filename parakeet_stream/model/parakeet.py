"""The whole model (features, encoder, language prompts where it has them, greedy RNN-T decoder)
and reading it from a model folder.

A model folder holds `config.json`, `model.safetensors` and `tokenizer.model`; converted
NVIDIA checkpoints and the bundled demo model load the same way. Names (`demo`, `small`,
ORG/NAME) become folders in loading.py.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .config import ModelConfig
from .conformer import ConformerEncoder
from .features import LogMelFeatures
from .prompt import PromptKernel
from .rnnt import GreedyDecoder
from .tokenizer import Tokenizer


class ParakeetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.features = LogMelFeatures(cfg.features)
        self.encoder = ConformerEncoder(cfg.encoder)
        self.prompt = PromptKernel(cfg.encoder.d_model, cfg.prompt) if cfg.prompt else None
        self.decoder = GreedyDecoder(cfg.encoder.d_model, cfg.decoder)
        self.tokenizer: Tokenizer | None = None
        self.encoder_dtype = torch.float32  # see precision.set_precision
        self.precision = None  # precision.set_precision's PrecisionChoice: the encoder's precision and why

    @property
    def frame_seconds(self) -> float:
        """Stream seconds per encoder frame."""
        f = self.cfg.features
        return f.hop_length * self.cfg.encoder.subsampling_factor / f.sample_rate

    def prompted(self, enc: torch.Tensor, prompts: torch.Tensor | None) -> torch.Tensor:
        """What the joint sees: encoder output [B, T, D] (whole utterances or one streaming chunk),
        each row conditioned on its language prompt, prompts [B] (indices, `cfg.prompt.index`).
        With prompts None, enc unchanged, as NeMo does before `set_inference_prompt`."""
        if prompts is None:
            return enc
        if self.prompt is None:
            raise ValueError("this model has no language prompts")
        return self.prompt(enc, prompts)

    @classmethod
    def from_dir(cls, folder: str | Path, device: str | torch.device = "cpu", dtype=torch.float32) -> "ParakeetModel":
        """The model in a model folder (a path; loading.load_model also takes names)."""
        folder = Path(folder)
        model = cls(ModelConfig.load(folder / "config.json"))
        state = load_file(str(folder / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        model.tokenizer = Tokenizer(folder / "tokenizer.model")
        model.encoder_dtype = dtype
        return model.to(device=device, dtype=dtype).eval()


