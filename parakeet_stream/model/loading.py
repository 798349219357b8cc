"""A model by name: a model folder, a named model (registry.py) or a Hugging Face repository (hub.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from . import hub
from .config import Lookahead, ModelConfig
from .device import check_device
from .errors import ModelNotFound
from .parakeet import ParakeetModel
from .registry import NAMED_MODELS, REPO_WEIGHTS


def load_model(name: str | Path, device: str | torch.device = "cpu", dtype=torch.float32) -> ParakeetModel:
    """The model `name` names (see resolve_model_dir), on `device`."""
    return ParakeetModel.from_dir(resolve_model_dir(name), check_device(device), dtype)


def resolve_model_dir(name: str | Path, download: bool = True) -> Path | None:
    """The folder of a model: a folder path; `demo` (bundled); `small`, `large` or ORG/NAME[@REVISION]
    from the Hugging Face hub, converted once into the model cache (see hub.py). `download=False`:
    None for a hub model the cache does not have, and nothing touches the network.

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
                                "python -m demo_model.train makes it")
    if path.is_dir():
        raise ModelNotFound(f"{name}: not a model folder (expected config.json, model.safetensors, tokenizer.model)")
    if path.is_file():
        hint = f": convert it first with `parakeet-convert {name} DIR`" if path.suffix == ".nemo" else ""
        raise ModelNotFound(f"{name}: a file, not a model folder{hint}")
    # ORG/NAME where ORG is a folder here (weights/smal) is a mistyped path, not a repository
    if hub.is_hub_name(name) and not (name not in NAMED_MODELS and path.parent.is_dir()):
        return hub.resolve(name) if download else hub.cached(name)
    raise ModelNotFound(f"no model {name!r}: expected demo, small, large, multilingual, ORG/NAME[@REVISION] or a model folder")


def check_lookaheads(name: str | Path, lookaheads: list[Lookahead]) -> None:
    """ValueError, in the loaded model's words, for a lookahead mode the model lacks: read from its
    config.json, before its weights load. A model still to download (or not found) is checked once it loads."""
    try:
        folder = resolve_model_dir(name, download=False)
    except ModelNotFound:
        return
    if folder is not None:
        encoder = ModelConfig.load(folder / "config.json").encoder
        for lookahead in lookaheads:
            encoder.check_lookahead(lookahead)
