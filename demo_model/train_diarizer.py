"""Trains the demo speaker diarizer: a small Streaming Sortformer on synthetic conversations
(demo_model/conversations.py), saved as a NeMo-layout `.nemo` that `parakeet-serve --diarizer` loads
like NVIDIA's. Resumable: run it again with the same --out and it goes on from its last checkpoint.

    python -m demo_model.train_diarizer --minutes 60             # trains, evaluates, exports
    python -m demo_model.train_diarizer --minutes 0 --export-only   # exports the last checkpoint
    python -m demo_model.train_diarizer --init weights/demo-diarizer --out results/more   # continues the bundled one

Training sees whole conversations cut at a random point (so that the last frames are decided with
as little future as streaming gives them), one sigmoid per speaker, speakers in the order they first
spoke (Sortformer's sorted targets). The evaluation streams held-out voices' conversations through
the same StreamingSortformer the server runs and reports the diarization error rate (missed,
false and confused speech over all speech, 80 ms frames, speakers matched by the best mapping).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import random
import signal
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.nn import functional as F

from parakeet_stream.engine.diarizer_model import live_streaming, load_diarizer
from parakeet_stream.model.config import EncoderConfig, FeatureConfig
from parakeet_stream.model.sortformer import Sortformer, SortformerConfig, StreamingConfig, length_mask
from parakeet_stream.model.sortformer_streaming import StreamingSortformer

from .conversations import Conversations, load_pool, render_pool, save_pool

SPEAKERS = 4
CONFIG = SortformerConfig(
    features=FeatureConfig(n_mels=80, pad_to=16),
    encoder=EncoderConfig(feat_in=80, n_layers=4, d_model=96, n_heads=4, subsampling_channels=64, conv_kernel_size=9,
                          xscaling=True, use_bias=True, att_context_sizes=((-1, -1),)),
    tf_layers=2, tf_d_model=96, tf_heads=4, tf_inner=256, n_spk=SPEAKERS, streaming=StreamingConfig())


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def pools(out: Path, args) -> tuple[Conversations, Conversations]:
    train = pool(out / "pool_train.npz", "train", args.voices, 1, args.per_voice, args.jobs)
    return Conversations(train, SPEAKERS), Conversations(test_pool(out, args.per_voice, args.jobs), SPEAKERS)


def test_pool(out: Path, per_voice: int = 6, jobs: int = 1) -> list:
    """The held-out voices' utterances (24 voices), rendered into `out` the first time."""
    return pool(out / "pool_test.npz", "test", 24, 2, per_voice, jobs)


def pool(path: Path, split: str, voices: int, seed: int, per_voice: int, jobs: int) -> list:
    if not path.exists():
        log(f"rendering {split} voices ({voices} x {per_voice} sentences)")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_pool(path, render_pool(split, voices, per_voice, seed, jobs))
    return load_pool(path)


def batch(model: Sortformer, convs: Conversations, rng: random.Random, size: int):
    """Features [B, T, n_mels], their lengths and labels [B, frames, speakers], each cut at random."""
    feats, labels = [], []
    for _ in range(size):
        audio, lab = convs.draw(rng)
        cut = rng.randint(max(1, lab.shape[0] // 2), lab.shape[0])
        with torch.no_grad():
            feats.append(model.features(torch.from_numpy(audio[: cut * 1280]))[0])
        labels.append(torch.from_numpy(lab[:cut]))
    lengths = torch.tensor([f.size(0) for f in feats])
    return (torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), lengths,
            torch.nn.utils.rnn.pad_sequence(labels, batch_first=True))


def loss_of(model: Sortformer, feats, lengths, labels) -> torch.Tensor:
    emb, emb_len = model.encoder.pre_encode(feats, lengths)
    probs = model.speaker_probs(emb, emb_len).clamp(1e-6, 1 - 1e-6)
    t = min(probs.size(1), labels.size(1))
    valid = length_mask(emb_len.clamp(max=t), t).unsqueeze(-1).float()
    bce = F.binary_cross_entropy(probs[:, :t], labels[:, :t], reduction="none")
    return (bce * valid).sum() / (valid.sum() * SPEAKERS)


def stream(model: Sortformer, audio: np.ndarray) -> np.ndarray:
    """Speaker probabilities [frames, speakers] as the server's diarizer makes them."""
    run = StreamingSortformer(model, live_streaming(model))
    with torch.no_grad():
        feats = model.features(torch.from_numpy(audio))[0]
        state, out = run.init_state(1), []
        for start, end, left, right in run.chunks(feats.size(0)):
            probs, n = run.step(state, feats[start:end][None], torch.tensor([end - start]), torch.tensor([left]),
                                torch.tensor([right]))
            out.append(probs[0, : int(n[0])])
    return torch.cat(out).numpy()


def der(probs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(errors, speech) in speaker-frames: missed + false + confused, the best speaker mapping."""
    t = min(len(probs), len(labels))
    hyp, ref = probs[:t] > 0.5, labels[:t] > 0.5
    best = min(np.sum(np.maximum(ref.sum(1), hyp[:, p].sum(1)) - (ref & hyp[:, p]).sum(1))
               for p in itertools.permutations(range(SPEAKERS)))
    return float(best), float(ref.sum())


def evaluate(model: Sortformer, convs: Conversations, n: int = 60) -> dict:
    model.eval()
    rng, errors, speech = random.Random(7), 0.0, 0.0
    for k in range(n):
        audio, labels = convs.draw(rng, speakers=2 + k % 2)
        e, s = der(stream(model, audio), labels)
        errors, speech = errors + e, speech + s
    model.train()
    return {"der": round(errors / max(speech, 1), 4), "conversations": n}


def nemo_config(cfg: SortformerConfig) -> dict:
    """What SortformerConfig.from_nemo reads, in NeMo's layout."""
    f, e, s = cfg.features, cfg.encoder, cfg.streaming
    return {
        "sample_rate": f.sample_rate, "max_num_of_spks": cfg.n_spk,
        "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor", "normalize": "NA",
                         "window_size": f.win_length / f.sample_rate, "window_stride": f.hop_length / f.sample_rate,
                         "sample_rate": f.sample_rate, "window": "hann", "features": f.n_mels, "n_fft": f.n_fft,
                         "frame_splicing": 1, "pad_to": f.pad_to, "dither": 0.0},
        "sortformer_modules": {"num_spks": cfg.n_spk, **{k: getattr(s, k) for k in s.__dataclass_fields__}},
        "encoder": {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": e.feat_in, "n_layers": e.n_layers,
                    "d_model": e.d_model, "n_heads": e.n_heads, "ff_expansion_factor": e.ff_expansion,
                    "subsampling": "dw_striding", "subsampling_factor": e.subsampling_factor,
                    "subsampling_conv_channels": e.subsampling_channels, "causal_downsampling": False,
                    "self_attention_model": "rel_pos", "att_context_size": [-1, -1], "xscaling": e.xscaling,
                    "untie_biases": True, "conv_kernel_size": e.conv_kernel_size, "conv_norm_type": "batch_norm",
                    "conv_context_size": None, "use_bias": e.use_bias},
        "transformer_encoder": {"num_layers": cfg.tf_layers, "hidden_size": cfg.tf_d_model, "inner_size": cfg.tf_inner,
                                "num_attention_heads": cfg.tf_heads, "hidden_act": "relu", "pre_ln": False},
    }


def nemo_state(model: Sortformer) -> dict[str, torch.Tensor]:
    """Our names -> NeMo's (map_state_dict's inverse): q/k/v split, the filterbank as NeMo keeps it."""
    out = {}
    for key, value in model.state_dict().items():
        if ".self_attn.qkv." in key:
            for name, part in zip("qkv", value.chunk(3)):
                out[key.replace(".qkv.", f".linear_{name}.")] = part.clone()
        elif key == "features.fb":
            out["preprocessor.featurizer.fb"] = value[None].clone()
        elif key == "features.window":
            out["preprocessor.featurizer.window"] = value.clone()
        else:
            out[key] = value.clone()
    return out


def export(model: Sortformer, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = io.BytesIO()
    torch.save({k: v.half() if v.is_floating_point() and not k.startswith("preprocessor") else v
                for k, v in nemo_state(model).items()}, weights)
    with tarfile.open(path, "w") as tar:
        for name, data in (("model_config.yaml", yaml.safe_dump(nemo_config(model.cfg)).encode()),
                           ("model_weights.ckpt", weights.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    log(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/diarizer"))
    ap.add_argument("--export", type=Path, default=Path("weights/demo-diarizer/diarizer.nemo"))
    ap.add_argument("--minutes", type=float, default=60.0, help="training time this run")
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--init", type=Path, help="start from this .nemo's weights (without a checkpoint in --out)")
    ap.add_argument("--voices", type=int, default=160)
    ap.add_argument("--per-voice", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="processes rendering speech")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Sortformer(CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-3)
    ckpt, step = args.out / "checkpoint.pt", 0
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step = int(saved["step"])
        log(f"resumed at step {step}")
    elif args.init:
        model.load_state_dict(load_diarizer(args.init).float().state_dict())
        log(f"initialised from {args.init}")
    train, test = pools(args.out, args)
    stop, end, rng = [False], time.monotonic() + args.minutes * 60, random.Random(step)
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    model.train()
    last_save, running = time.monotonic(), None
    while not args.export_only and not stop[0] and time.monotonic() < end:
        for group in opt.param_groups:  # warm up, then a slow cosine over 20k steps
            group["lr"] = args.lr * min(1.0, (step + 1) / 300) * (0.55 + 0.45 * math.cos(math.pi * min(step, 20000) / 20000))
        loss = loss_of(model, *batch(model, train, rng, args.batch))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        step += 1
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0:
            log(f"step {step} loss {running:.4f}")
        if time.monotonic() - last_save > 300:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
            last_save = time.monotonic()
    if not args.export_only:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    figures = {"step": step, **evaluate(model, test)}
    log(json.dumps(figures))
    (args.out / "figures.json").write_text(json.dumps(figures))
    export(model.eval(), args.export)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
