"""The whole model (features, encoder, greedy RNN-T decoder) and loading it from a model folder.

A model folder holds `config.json`, `model.safetensors` and `tokenizer.model`; converted
NVIDIA checkpoints and the bundled demo model load the same way.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .config import ModelConfig
from .conformer import ConformerEncoder
from .features import LogMelFeatures
from .rnnt import GreedyDecoder
from .tokenizer import Tokenizer

REPO_WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
NAMED_MODELS = {
    "demo": "bundled demo model",
    "small": "nvidia/parakeet_realtime_eou_120m-v1",
    "large": "nvidia/nemotron-speech-streaming-en-0.6b",
}


class ModelNotFound(FileNotFoundError):
    pass


class ParakeetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.features = LogMelFeatures(cfg.features)
        self.encoder = ConformerEncoder(cfg.encoder)
        self.decoder = GreedyDecoder(cfg.encoder.d_model, cfg.decoder)
        self.tokenizer: Tokenizer | None = None
        self.encoder_dtype = torch.float32  # see precision.set_precision

    @property
    def frame_seconds(self) -> float:
        """Stream seconds per encoder frame."""
        f = self.cfg.features
        return f.hop_length * self.cfg.encoder.subsampling_factor / f.sample_rate

    @classmethod
    def from_dir(cls, path: str | Path, device: str | torch.device = "cpu", dtype=torch.float32) -> "ParakeetModel":
        folder = resolve_model_dir(path)
        model = cls(ModelConfig.load(folder / "config.json"))
        state = load_file(str(folder / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        model.tokenizer = Tokenizer(folder / "tokenizer.model")
        model.encoder_dtype = dtype
        return model.to(device=device, dtype=dtype).eval()


def resolve_model_dir(name: str | Path) -> Path:
    """A model folder path, or a name (demo, small, large) looked up under ./weights and the repo's weights/."""
    name = str(name)
    candidates = [Path(name)]
    if name in NAMED_MODELS:
        candidates = [Path("weights") / name, REPO_WEIGHTS / name]
    for folder in candidates:
        if (folder / "config.json").is_file():
            return folder
    if name in NAMED_MODELS and name != "demo":
        raise ModelNotFound(
            f"model {name!r} is not converted yet: run `parakeet-convert {NAMED_MODELS[name]} weights/{name}` "
            "(needs network access to Hugging Face)"
        )
    raise ModelNotFound(f"no model folder at {name!r} (expected config.json, model.safetensors, tokenizer.model)")
