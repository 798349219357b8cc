"""The whole model (features, encoder, greedy RNN-T decoder) and loading it from a model folder.

A model folder holds `config.json`, `model.safetensors` and `tokenizer.model`; converted
NVIDIA checkpoints and the bundled demo model load the same way. Hugging Face names resolve to
folders in the model cache (hub.py).
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
    """A model that cannot be found or fetched; the message is one line for users."""


class DeviceError(ValueError):
    """A --device this torch build or machine cannot use."""


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
        device = check_device(device)
        model = cls(ModelConfig.load(folder / "config.json"))
        state = load_file(str(folder / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        model.tokenizer = Tokenizer(folder / "tokenizer.model")
        model.encoder_dtype = dtype
        return model.to(device=device, dtype=dtype).eval()


def resolve_model_dir(name: str | Path) -> Path:
    """The folder of a model: a folder path; `demo` (bundled); `small`, `large` or ORG/NAME[@REVISION]
    from the Hugging Face hub, converted once into the model cache (see hub.py).

    A converted folder under ./weights or the repository's weights/ still serves `small` and `large`.
    """
    name = str(name)
    path = Path(name)
    if (path / "config.json").is_file():
        return path
    if name in NAMED_MODELS:
        for folder in (Path("weights") / name, REPO_WEIGHTS / name):
            if (folder / "config.json").is_file():
                return folder
        if name == "demo":
            raise ModelNotFound("the bundled demo model is missing (weights/demo/config.json): "
                                "python scripts/train_demo.py makes it")
    if path.is_dir():
        raise ModelNotFound(f"{name}: not a model folder (expected config.json, model.safetensors, tokenizer.model)")
    if path.is_file():
        hint = f": convert it first with `parakeet-convert {name} DIR`" if path.suffix == ".nemo" else ""
        raise ModelNotFound(f"{name}: a file, not a model folder{hint}")
    from . import hub

    # ORG/NAME where ORG is a folder here (weights/smal) is a mistyped path, not a repository
    if hub.is_hub_name(name) and not (name not in NAMED_MODELS and path.parent.is_dir()):
        return hub.resolve(name)
    raise ModelNotFound(f"no model {name!r}: expected demo, small, large, ORG/NAME[@REVISION] or a model folder")


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, or DeviceError with a one-line reason where this torch cannot use it."""
    try:
        device = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"unknown device {str(device)!r} (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise DeviceError(f"--device {device}: this torch {torch.__version__} is a CPU-only build "
                              "(install a CUDA build of torch, or use --device cpu)")
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {device}: no CUDA GPU is visible to torch (use --device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type not in ("cpu", "meta") and not _backend_available(device.type):
        raise DeviceError(f"--device {device}: not available in this torch build")
    return device


def _backend_available(kind: str) -> bool:
    backend = getattr(torch, kind, None) or getattr(torch.backends, kind, None)
    return bool(backend is not None and getattr(backend, "is_available", lambda: False)())
