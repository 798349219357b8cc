"""A NeMo `.nemo` checkpoint to a model folder (config.json, model.safetensors, tokenizer.model), all or nothing.

Pickled weights are only loaded with `torch.load(weights_only=True)`. The command line is
tools/convert.py (`parakeet-convert`).
"""

from __future__ import annotations

import errno
import io
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import save_file
from tqdm import tqdm

from .config import ModelConfig, UnsupportedModel
from .parakeet import ParakeetModel


class ConvertError(Exception):
    pass


QKV = re.compile(r"^encoder\.layers\.(\d+)\.self_attn\.linear_([qkv])\.(weight|bias)$")
RENAMES = [
    ("decoder.prediction.embed.", "decoder.predictor.embed."),
    ("decoder.prediction.dec_rnn.lstm.", "decoder.predictor.lstm."),
    ("joint.enc.", "decoder.joint.enc."),
    ("joint.pred.", "decoder.joint.pred."),
    ("joint.joint_net.2.", "decoder.joint.out."),
    ("prompt_kernel.0.", "prompt.hidden."),
    ("prompt_kernel.2.", "prompt.out."),
    ("encoder.", "encoder."),
]
IGNORED = re.compile(r"(num_batches_tracked$|^encoder\.pos_enc\.pe$|^preprocessor\.featurizer\.(?!fb$|window$))")


def map_state_dict(nemo: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """NeMo parameter names -> ours (fused QKV, renamed decoder/joint); raises ConvertError on mismatch."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    unexpected = []
    for key, value in nemo.items():
        if m := QKV.match(key):
            qkv.setdefault((m[1], m[3]), {})[m[2]] = value
        elif key == "preprocessor.featurizer.fb":
            out["features.fb"] = value.reshape(value.shape[-2], value.shape[-1])
        elif key == "preprocessor.featurizer.window":
            out["features.window"] = value
        elif key in ("encoder.pos_bias_u", "encoder.pos_bias_v"):  # untie_biases: false
            for i in range(cfg.encoder.n_layers):
                out[f"encoder.layers.{i}.self_attn.{key.split('.')[-1]}"] = value
        elif IGNORED.search(key):
            continue
        elif new := _rename(key):
            out[new] = value
        else:
            unexpected.append(key)
    for (layer, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise ConvertError(f"layer {layer}: incomplete q/k/v {kind} weights")
        out[f"encoder.layers.{layer}.self_attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    expected = set(ParakeetModel(cfg).state_dict())
    missing = sorted(expected - set(out))
    unexpected += sorted(set(out) - expected)
    if missing or unexpected:
        raise ConvertError(f"weights do not match the architecture: missing {_few(missing)}, unexpected {_few(unexpected)}")
    return out


def _rename(key: str) -> str | None:
    for old, new in RENAMES:
        if key.startswith(old):
            return new + key[len(old) :]
    return None


def _few(keys: list[str]) -> str:
    return "none" if not keys else ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")


def read_nemo(path: Path, tokenizer: bool = True) -> tuple[dict, dict[str, torch.Tensor], bytes]:
    """(model_config, state_dict, tokenizer bytes) from a .nemo archive (no tokenizer read, b"",
    where `tokenizer` is False: a model without one, the speaker diarizer)."""
    if not path.is_file():
        raise ConvertError(f"{path}: no such file")
    try:
        with tarfile.open(path, "r:*") as tar:
            members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
            cfg = yaml.safe_load(_member(tar, members, "model_config.yaml", path))
            weights = _member(tar, members, "model_weights.ckpt", path, progress=True)
            tokens = _member(tar, members, _tokenizer_name(cfg, members), path) if tokenizer else b""
    except tarfile.TarError:
        raise ConvertError(f"{path}: not a .nemo archive (not a tar file)") from None
    try:
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad checkpoint
        raise ConvertError(f"{path}: model_weights.ckpt is not a plain tensor checkpoint ({type(exc).__name__})") from None
    return cfg, state.get("state_dict", state), tokens


def _tokenizer_name(cfg: dict, members: dict) -> str:
    named = str((cfg.get("tokenizer") or {}).get("model", "")).removeprefix("nemo:")
    if named in members:
        return named
    models = [n for n in members if n.endswith(".model")]
    return models[0] if models else "tokenizer.model"


def _member(tar: tarfile.TarFile, members: dict, name: str, path: Path, progress: bool = False) -> bytes:
    if name not in members:
        raise ConvertError(f"{path}: not a .nemo archive we can read (no {name})")
    src = tar.extractfile(members[name])
    buf = io.BytesIO()
    # a bar only for reads that take a while (a checkpoint of gigabytes, not a test fixture)
    with tqdm(total=members[name].size, unit="B", unit_scale=True, desc=name, disable=not progress, leave=False,
              delay=2) as bar:
        while block := src.read(1 << 22):
            buf.write(block)
            bar.update(len(block))
    return buf.getvalue()


def model_config(cfg_dict: dict, label: str) -> ModelConfig:
    """Our structure from a checkpoint's model_config.yaml; unsupported models raise ConvertError with the reason."""
    try:
        return ModelConfig.from_nemo(cfg_dict)
    except UnsupportedModel as exc:
        raise ConvertError(f"{label}: unsupported model: {exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConvertError(f"{label}: model_config.yaml is incomplete ({exc})") from None


def convert_nemo(path: Path, dst: Path, label: str) -> ModelConfig:
    cfg_dict, state, tokenizer = read_nemo(path)
    cfg = model_config(cfg_dict, label)
    weights = map_state_dict(state, cfg)
    try:
        _write_atomically(dst, cfg, weights, tokenizer)
    except (OSError, SafetensorError) as exc:  # nothing of the folder is left behind
        raise ConvertError(f"{dst}: cannot write the model folder: {_write_failure(exc)}") from None
    return cfg


def _write_failure(exc: Exception) -> str:
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc):
        return "no space left on device"
    return getattr(exc, "strerror", None) or str(exc).splitlines()[0]


def _write_atomically(dst: Path, cfg: ModelConfig, weights: dict, tokenizer: bytes) -> None:
    if dst.exists() and any(dst.iterdir()):
        raise ConvertError(f"{dst}: destination exists and is not empty")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        (tmp / "config.json").write_text(cfg.to_json())
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        (tmp / "tokenizer.model").write_bytes(tokenizer)
        if dst.exists():
            dst.rmdir()
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
