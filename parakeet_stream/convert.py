"""`parakeet-convert SRC DST_DIR`: a NeMo `.nemo` checkpoint (or a Hugging Face repo id) to a model folder.

Writes config.json, model.safetensors and tokenizer.model into DST_DIR, all or nothing.
Pickled weights are only loaded with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file
from tqdm import tqdm

from .config import ModelConfig, UnsupportedModel
from .model import ParakeetModel


class ConvertError(Exception):
    pass


QKV = re.compile(r"^encoder\.layers\.(\d+)\.self_attn\.linear_([qkv])\.(weight|bias)$")
RENAMES = [
    ("decoder.prediction.embed.", "decoder.predictor.embed."),
    ("decoder.prediction.dec_rnn.lstm.", "decoder.predictor.lstm."),
    ("joint.enc.", "decoder.joint.enc."),
    ("joint.pred.", "decoder.joint.pred."),
    ("joint.joint_net.2.", "decoder.joint.out."),
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


def read_nemo(path: Path) -> tuple[dict, dict[str, torch.Tensor], bytes]:
    """(model_config, state_dict, tokenizer bytes) from a .nemo archive."""
    if not path.is_file():
        raise ConvertError(f"{path}: no such file")
    try:
        with tarfile.open(path, "r:*") as tar:
            members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
            cfg = yaml.safe_load(_member(tar, members, "model_config.yaml", path))
            weights = _member(tar, members, "model_weights.ckpt", path, progress=True)
            tokenizer = _member(tar, members, _tokenizer_name(cfg, members), path)
    except tarfile.TarError:
        raise ConvertError(f"{path}: not a .nemo archive (not a tar file)") from None
    try:
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad checkpoint
        raise ConvertError(f"{path}: model_weights.ckpt is not a plain tensor checkpoint ({type(exc).__name__})") from None
    return cfg, state.get("state_dict", state), tokenizer


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
    with tqdm(total=members[name].size, unit="B", unit_scale=True, desc=name, disable=not progress, leave=False) as bar:
        while block := src.read(1 << 22):
            buf.write(block)
            bar.update(len(block))
    return buf.getvalue()


def fetch_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise ConvertError("downloading needs the optional dependency: pip install 'parakeet-stream[hf]'") from None
    try:
        files = [f for f in HfApi().list_repo_files(repo_id) if f.endswith(".nemo")]
        if not files:
            raise ConvertError(f"{repo_id}: the repository has no .nemo file")
        return Path(hf_hub_download(repo_id, files[0]))
    except ConvertError:
        raise
    except Exception as exc:  # noqa: BLE001 - network/hub errors become one line
        raise ConvertError(f"{repo_id}: download failed ({type(exc).__name__}: {exc})") from None


def convert(src: str, dst: Path) -> ModelConfig:
    path = Path(src)
    if not path.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", src):
        path = fetch_from_hub(src)
    cfg_dict, state, tokenizer = read_nemo(path)
    try:
        cfg = ModelConfig.from_nemo(cfg_dict)
    except UnsupportedModel as exc:
        raise ConvertError(f"{src}: unsupported model: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConvertError(f"{src}: model_config.yaml is incomplete ({exc})") from None
    weights = map_state_dict(state, cfg)
    _write_atomically(dst, cfg, weights, tokenizer)
    return cfg


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="parakeet-convert", description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a .nemo file or a Hugging Face repo id (e.g. nvidia/parakeet_realtime_eou_120m-v1)")
    ap.add_argument("dst", type=Path, help="output folder, e.g. weights/small")
    args = ap.parse_args(argv)
    try:
        cfg = convert(args.src, args.dst)
    except ConvertError as exc:
        print(f"parakeet-convert: error: {exc}", file=sys.stderr)
        return 1
    enc = cfg.encoder
    modes = " ".join(f"[{a},{b}]" for a, b in enc.att_context_sizes)
    print(f"wrote {args.dst}: {enc.n_layers} layers x {enc.d_model}, lookahead modes {modes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
