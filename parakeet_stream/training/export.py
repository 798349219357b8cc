"""Export a trained ParakeetModel as a model folder (config.json, model.safetensors, tokenizer.model,
README.md), atomically: every file is written to a temp name in the folder, then renamed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..model.parakeet import ParakeetModel


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def fp16_state(model: ParakeetModel) -> dict[str, torch.Tensor]:
    """Weights as float16; the feature buffers (window, mel filterbank) stay float32 so the
    served features match the training features bit for bit."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu().contiguous()
        if v.is_floating_point() and not k.startswith("features."):
            v = v.half()
        out[k] = v
    return out


def export_model(model: ParakeetModel, tokenizer_model: Path, out_dir: Path, readme: str | None = None) -> int:
    """Write the model folder; returns the size of model.safetensors in bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "config.json", model.cfg.to_json().encode() + b"\n")
    tok = tokenizer_model.read_bytes()
    if not (out_dir / "tokenizer.model").exists() or (out_dir / "tokenizer.model").read_bytes() != tok:
        atomic_write(out_dir / "tokenizer.model", tok)
    tmp = out_dir / f".model.safetensors.tmp{os.getpid()}"
    save_file(fp16_state(model), str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out_dir / "model.safetensors")
    if readme is not None:
        atomic_write(out_dir / "README.md", readme.encode())
    return (out_dir / "model.safetensors").stat().st_size


def copy_model(model: ParakeetModel) -> ParakeetModel:
    """A detached copy (for EMA weights and exports)."""
    clone = ParakeetModel(model.cfg)
    clone.load_state_dict(model.state_dict())
    return clone


def remove_stale_temp(out_dir: Path) -> None:
    for p in out_dir.glob(".*.tmp*"):
        try:
            p.unlink() if p.is_file() else shutil.rmtree(p)
        except OSError:
            pass
