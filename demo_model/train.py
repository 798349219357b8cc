#!/usr/bin/env python3
"""Train the bundled demo model (weights/demo/) from scratch on synthetic espeak-ng speech.

One command, resumable, CPU friendly::

    python -m demo_model.train                   # train until stopped (Ctrl-C / SIGTERM saves)
    python -m demo_model.train --minutes 120     # stop after a 2-hour budget
    python -m demo_model.train --threads 1       # fixed thread count (default: auto)
    python -m demo_model.train --data data/demo_multi --init weights/demo   # continue a model
                                                   # on another corpus, with the model's tokenizer
    python -m demo_model.train --data data/demo_turns_w --turns-from data/demo_turns_e --init weights/demo \
        --eou-window 0.24 --turn-synths espeak      # teach it turns with hesitations inside them

What it does:

1. data: runs demo_model/data.py (espeak-ng corpus -> data/demo/) and
   demo_model/tokenizer.py (BPE 256 + <EOU>, <EOB>) when their outputs are missing;
2. features: log-mel (80 bins) of every utterance, computed once with the model's own
   feature extractor and cached as float16 shards in data/demo/feats/;
3. trains a ~4 M-parameter cache-aware FastConformer RNN-T (our own modules) with RNN-T loss
   + 0.3 x auxiliary CTC (training-only head), targets = BPE ids of the text + <EOU>; 10% of
   the examples are two utterances joined by a pause (targets ... <EOU> ... <EOU>), so the
   model keeps going after an <EOU> in a live stream;
4. every --ckpt-minutes: checkpoint to data/demo/train/last.pt (rerunning resumes from it);
5. every --eval-minutes: greedy WER (our decoder) on the first --eval-utts utterances of
   test_sentences (unseen sentences) and test_voices (unseen voices); whenever the
   test_sentences WER improves, exports weights/demo/ (config.json, model.safetensors in
   float16, tokenizer.model, README.md with the figures; files written atomically), after
   measuring both full test sets.

Torch threads: `--threads auto` (default) uses the cores of this process's affinity mask
minus what other processes are using, re-checked every 30 s (oversubscribed OpenMP threads
make CPU training up to ~10x slower).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Large tensors in transparent huge pages: a step's fresh [B, T, U, V] joint tensors otherwise
# cost ~180k page faults/s (30% of the CPU in the kernel); 1.32 -> 1.07 s/step on 2 cores.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np
import torch

from evaluations.real_speech_wer import offline_report
from parakeet_stream.model.config import (
    DecoderConfig,
    EncoderConfig,
    FeatureConfig,
    ModelConfig,
)
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.tokenizer import Tokenizer
from parakeet_stream.training.data import FeatureSet, Subset, collate, plan_epoch, wer
from parakeet_stream.training.export import (
    atomic_write,
    copy_model,
    export_model,
    remove_stale_temp,
)
from parakeet_stream.training.objective import (
    Transducer,
    check_fast_encoder,
    transcribe_offline,
)
from parakeet_stream.training.schedule import learning_rate
from parakeet_stream.training.threads import ThreadGovernor

COMMAND = "python -m demo_model.train"
SUBSAMPLING = 8
ENCODER_FRAME_S = SUBSAMPLING / 100  # feature frames are 10 ms


def log(msg: str) -> None:
    print(f"{datetime.now():%Y-%m-%d %H:%M:%S} {msg}", flush=True)


def model_config(vocab: int, args) -> ModelConfig:
    return ModelConfig(
        FeatureConfig(n_mels=80),
        EncoderConfig(feat_in=80, n_layers=args.layers, d_model=args.d_model, n_heads=4, ff_expansion=4,
                      subsampling_factor=SUBSAMPLING, subsampling_channels=args.d_model, conv_kernel_size=9,
                      xscaling=False, use_bias=True, att_context_sizes=((70, 1),)),
        DecoderConfig(num_classes=vocab, pred_hidden=256, pred_rnn_layers=1, joint_hidden=320, max_symbols=10),
    )


# --------------------------------------------------------------------------
# data preparation
# --------------------------------------------------------------------------

def adopt_tokenizer(init: Path, data: Path) -> None:
    """--init continues a model: its tokenizer, not one trained on this corpus's text, must be used."""
    src, dst = init / "tokenizer.model", data / "tokenizer.model"
    if not dst.exists():
        data.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        log(f"[data] tokenizer from {init}")
    elif dst.read_bytes() != src.read_bytes():
        sys.exit(f"--init {init}: {dst} is another tokenizer than the model's; remove it to use the model's")


def ensure_data(data: Path, jobs: int) -> None:
    manifests = [data / f"{s}.jsonl" for s in ("train", "test_sentences", "test_voices")]
    if not all(m.exists() for m in manifests):
        log(f"[data] manifests missing: running python -m demo_model.data --out {data}")
        subprocess.run([sys.executable, "-m", "demo_model.data", "--out", str(data),
                        "--jobs", str(jobs)], check=True, cwd=ROOT)
    if not (data / "tokenizer.model").exists():
        log("[data] tokenizer missing: running python -m demo_model.tokenizer")
        subprocess.run([sys.executable, "-m", "demo_model.tokenizer", "--data", str(data)],
                       check=True, cwd=ROOT)


def train_subset(train: FeatureSet, args, more_turns: FeatureSet | None = None) -> FeatureSet | Subset:
    """The first --train-limit utterances and the turns of --turns-from, less the turns of
    synthesizers not in --turn-synths, each turn --turn-repeat times."""
    n = len(train) if not args.train_limit else min(args.train_limit, len(train))
    synths = set(args.turn_synths.split(",")) if args.turn_synths else None
    picks, left_out = [], 0
    candidates = [(train, i) for i in range(n)]
    if more_turns is not None:
        candidates += [(more_turns, i) for i, r in enumerate(more_turns.records) if "segments" in r]
    for fs, i in candidates:
        r = fs.records[i]
        if "segments" not in r:
            picks.append((fs, i))
        elif synths is None or r.get("synth", "espeak") in synths:
            picks += [(fs, i)] * args.turn_repeat
        else:
            left_out += 1
    if picks == [(train, i) for i in range(len(train))]:
        return train
    if left_out:
        log(f"[data] {left_out} turns of other synthesizers than {args.turn_synths} left out")
    return Subset(picks)


# --------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------

def evaluate(model: ParakeetModel, tok: Tokenizer, fs: FeatureSet, n: int | None) -> dict:
    idx = range(len(fs) if n is None else min(n, len(fs)))
    feats = [torch.from_numpy(np.asarray(fs.feats(i), dtype=np.float32)) for i in idx]
    hyps_ids = transcribe_offline(model, feats)
    refs = [fs.records[i]["text"] for i in idx]
    hyps = [tok.decode(h) for h in hyps_ids]
    eou_ok = sum(1 for h in hyps_ids if h and h[-1] == tok.eou_id and h.count(tok.eou_id) == 1)
    return {"wer": wer(refs, hyps), "eou": eou_ok / max(1, len(refs)), "n": len(refs),
            "words": sum(len(r.split()) for r in refs), "example": (refs[0], hyps[0])}


# --------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------

def real_speech_row(real: dict | None) -> str:
    if real is None:
        return "| WER, real speech (LibriVox) | not measured: `apt-get install pocketsphinx-testdata` |"
    return (f"| WER, real speech (Debian's 5 LibriVox recordings, {real['words']} words; reported, never "
            f"trained or tuned on) | {100 * real['wer']:.1f}% |")


def synth_names(corpus: dict) -> str:
    names = {"espeak": "espeak-ng", "flite": "flite", "festival": "festival"}
    mix = corpus.get("synths", {"espeak": 1.0})
    if len(mix) == 1:
        return names[next(iter(mix))]
    return " + ".join(f"{names[k]} {100 * w:.0f}%" for k, w in mix.items())


def other_voices_text(corpus: dict) -> str:
    return "".join(f"\n* {name} voices: {', '.join(v['train'])}; **held out**: {', '.join(v['heldout'])}."
                   for name in ("flite", "festival") if (v := corpus.get(f"{name}_voices")))


def room_phone_text(corpus: dict) -> str:
    aug = corpus.get("augmentation") or {}
    parts = []
    if aug.get("reverb_prob"):
        parts.append(f"a synthetic room (RT60 {aug['rt60_s'][0]}-{aug['rt60_s'][1]} s) on {100 * aug['reverb_prob']:.0f}%")
    if aug.get("telephone_prob"):
        parts.append(f"telephone band (8 kHz, part through mu-law) on {100 * aug['telephone_prob']:.0f}%")
    return f"\n  Also {' and '.join(parts)} of utterances." if parts else ""


def warp_text(args: dict) -> str:
    warp = args.get("freq_warp", 0)
    return (f"Vocal tract length perturbation (each example's mel axis warped by a factor in "
            f"{1 - warp:.2f}-{1 + warp:.2f}), " if warp else "")


def eou_text(args: dict) -> str:
    window = args.get("eou_window", 0)
    return (f" Each `<EOU>` only within {window:g} s of audio after its speech ends (its last frame within "
            f"40 dB of the loudest and 6 dB over the noise floor), so that the model learns to say when a "
            f"turn ends, not to wait." if window else "")


def cooldown_text(args: dict) -> str:
    minutes = args.get("cooldown_minutes", 0)
    return f", annealed linearly to 0 over the run's last {minutes:g} minutes" if minutes else ""


def readme_text(st: dict, corpus: dict, cfg: ModelConfig, params: int, size: int, full: dict) -> str:
    sp = corpus.get("splits", {})
    tr, ts, tv = (sp.get(k, {}) for k in ("train", "test_sentences", "test_voices"))
    hist = st["history"]
    rows = "\n".join(
        f"| {h['wall'].replace('T', ' ')[:16]} | {h['train_hours']:.2f} | {h['step']} | {h['audio_hours_seen']:.1f} | "
        f"{100 * h['wer_sentences']:.1f} | {100 * h['wer_voices']:.1f} | {100 * h['eou']:.0f} |"
        for h in hist[-15:])
    enc, dec = cfg.encoder, cfg.decoder
    return f"""# Demo model (bundled)

A tiny streaming RNN-T trained by this project on synthetic **{synth_names(corpus)}** speech, so that the
server, the tests and the examples work without downloading anything. It recognises
synthetic English over a ~{corpus.get('text', {}).get('vocab_size', 3000):,}-word vocabulary; it is NOT a general speech recogniser (use
`small` / `large`, converted from NVIDIA's checkpoints, for real speech).

Same architecture family and streaming behaviour as NVIDIA's parakeet_realtime_eou: cache-aware
FastConformer encoder with chunked-limited attention (att_context_size [70, 1]: 160 ms
lookahead, 80 ms frames), causal convolutions, an LSTM prediction network and an RNN-T joint;
the tokenizer ends with `<EOU>` / `<EOB>` and the model emits `<EOU>` at the end of each
utterance.

## Figures (written by the training script at each export)

> Lead: the figures below are regenerated automatically at every export of
> `python -m demo_model.train`; to record a final measurement, edit this line and the table.

| | |
|---|---|
| WER, unseen sentences (test_sentences, all {full['sentences']['n']} utts, {full['sentences']['words']} words) | **{100 * full['sentences']['wer']:.1f}%** |
| WER, unseen voices + sentences (test_voices, all {full['voices']['n']} utts, {full['voices']['words']} words) | **{100 * full['voices']['wer']:.1f}%** |
{real_speech_row(full.get('real'))}
| utterances ending with exactly one `<EOU>` (both test sets) | {100 * (full['sentences']['eou'] + full['voices']['eou']) / 2:.0f}% |
| exported at | step {st['step']}, epoch {st['epoch'] + st['batch_in_epoch'] / max(1, st.get('batches_per_epoch', 1)):.2f}, {st['train_seconds'] / 3600:.2f} h of training ({st['audio_seconds'] / 3600:.0f} h of audio seen), {datetime.now():%Y-%m-%d %H:%M} |
| trained on | CPU only ({os.cpu_count()} cores, shared with other work; torch threads chosen automatically), started {st['started'][:16].replace('T', ' ')} |
| training speed | {st.get('speed', {}).get('s_per_step', float('nan')):.2f} s/step, {st.get('speed', {}).get('x_real_time', float('nan')):.0f}x real time ({st.get('speed', {}).get('threads', '?')} thread(s), batches of ~{st['args']['batch_frames'] / 100:.0f} s) at export time |
| parameters | {params / 1e6:.2f} M ({size / 1e6:.1f} MB float16 safetensors) |

WER = word edits / reference words, greedy decoding of whole utterances with this
repository's decoder (identical to streaming). The checkpoint is chosen by the WER on the
first 100 test_sentences utterances, so that figure is slightly optimistic; test_voices is
never used for selection.

WER trajectory (first 100 utterances of each test set, raw or EMA weights, whichever was
better on test_sentences):

| wall clock | training hours | step | audio hours seen | WER sentences % | WER voices % | `<EOU>` ok % |
|---|---|---|---|---|---|---|
{rows}

## Data

Generated by `python -m demo_model.data` ({synth_names(corpus)}, 16 kHz):

* **train**: {tr.get('sentences', '?')} distinct sentences, {tr.get('utterances', '?')} utterances, {tr.get('hours', 0):.1f} h,
  {tr.get('words', '?')} words. Text: sentences from the Debian `fortunes` files normalised
  to lowercase words over the {corpus.get('text', {}).get('vocab_size', '?')} most common words, plus sentences generated from
  the same vocabulary (clause recombination, trigram walks, templates).
* **test_sentences**: {ts.get('utterances', '?')} natural fortune sentences never in train, spoken by training voices ({ts.get('hours', 0):.2f} h).
* **test_voices**: {tv.get('utterances', '?')} other unseen sentences, each spoken by a voice never in train ({tv.get('hours', 0):.2f} h).
* Voices: espeak-ng accents {', '.join(corpus.get('train_accents', []))} x {len(corpus.get('train_variants', []))} voice
  variants; speed {corpus.get('speed_wpm', ['?', '?'])[0]}-{corpus.get('speed_wpm', ['?', '?'])[1]} wpm, pitch {corpus.get('pitch', ['?', '?'])[0]}-{corpus.get('pitch', ['?', '?'])[1]}.
  **Held out** (test_voices only): accent {', '.join(corpus.get('heldout_accents', []))} (with any variant) and variants
  {', '.join(corpus.get('heldout_variants', []))} (with any accent).{other_voices_text(corpus)}
* Augmentation baked into the audio: lead-in silence, extra tail silence, random level
  (-24 to -1 dBFS peak), white or pink noise (SNR 20-45 dB) on 80% of utterances.{room_phone_text(corpus)}

## Recipe

* Features: 80-bin log-mel (NeMo-style, no normalisation), computed with
  `parakeet_stream.model.features.LogMelFeatures` and cached once per utterance.
* Encoder: {enc.n_layers} conformer layers, d_model {enc.d_model}, {enc.n_heads} heads, feed-forward x{enc.ff_expansion},
  causal depthwise conv kernel {enc.conv_kernel_size}, causal 8x depthwise-striding subsampling
  ({enc.subsampling_channels} channels), att_context_size {list(enc.att_context_sizes[0])}.
* Decoder: 1-layer LSTM {dec.pred_hidden}, joint {dec.joint_hidden}, BPE {dec.num_classes - 2} + `<EOU>` + `<EOB>` + blank.
* Targets: BPE ids of the text followed by `<EOU>`; 10% of the examples are two utterances
  joined by a 0-1.5 s pause (`... <EOU> ... <EOU>`).{eou_text(st['args'])}
* Loss: RNN-T (plain PyTorch, `parakeet_stream/training/rnnt_loss.py`) + 0.3 x CTC on a
  training-only linear head (not exported). Per-token normalisation.
* Start: the first {st['args']['warm_steps']} steps use only utterances <= {st['args']['warm_max_frames'] / 100:.1f} s, without
  augmentation, with CTC weight {st['args']['warm_ctc_weight']} (a transducer trained from scratch first sits on a
  "blank plateau"; short clean examples shorten it). He-normal init with zero biases in the
  subsampling stack; the first conv is optimised in normalised coordinates (as if the
  input were (x - mean) / std) and stored in raw coordinates, so the model reads raw log-mel.
* {warp_text(st['args'])}SpecAugment (2 frequency masks <= 15 bins, 5 time masks <= 4% of the
  utterance) and a random +-6 dB level shift; half the examples end with the all-zero feature frame a
  streaming session ends with; AdamW (peak lr {st['args']['lr']}, {st['args']['warmup']} warmup steps, inverse-sqrt decay
  to {st['args']['min_lr']}{cooldown_text(st['args'])}, weight decay {st['args']['weight_decay']}), batches of <= {st['args']['batch_frames'] / 100:.0f} s of padded audio bucketed by
  length, gradient clipping 5, EMA of the weights (decay {st['args']['ema']}).

## Reproduce

```
{COMMAND}                   # resumable; add --minutes N for a time budget
```

It builds the corpus and tokenizer if `data/demo/` lacks them, caches features, trains,
checkpoints to `data/demo/train/` (rerun to resume) and re-exports this folder whenever the
WER improves. The log goes to stdout (`data/demo/train/log.txt` in the background run).
"""


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def param_groups(module: torch.nn.Module, wd: float):
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    if path.exists():
        os.replace(path, path.with_name(path.stem + ".prev.pt"))
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "data" / "demo"))
    ap.add_argument("--out", default=str(ROOT / "weights" / "demo"), help="export folder")
    ap.add_argument("--work", default=None, help="checkpoints (default <data>/train)")
    ap.add_argument("--init", default=None,
                    help="start from this exported model folder (same config) instead of from scratch; "
                         "only when --work holds no checkpoint")
    ap.add_argument("--minutes", type=float, default=0, help="stop after this many minutes (0: run until stopped)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop at this step (0: no limit)")
    ap.add_argument("--threads", default="auto", help="torch threads: auto (default) or a number")
    ap.add_argument("--nice", type=int, default=5, help="lower this process's CPU priority (default 5)")
    ap.add_argument("--log-minutes", type=float, default=2.0)
    ap.add_argument("--eval-minutes", type=float, default=15.0)
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--eval-utts", type=int, default=100)
    ap.add_argument("--train-limit", type=int, default=0, help="use only the first N train utterances (testing)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=144)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=400)
    ap.add_argument("--cooldown-minutes", type=float, default=0,
                    help="anneal the lr linearly to 0 over the last N minutes of --minutes (0: off)")
    ap.add_argument("--weight-decay", type=float, default=1e-2)
    ap.add_argument("--batch-frames", type=int, default=8000, help="padded feature frames per batch (100/s)")
    ap.add_argument("--pair-prob", type=float, default=0.1)
    ap.add_argument("--end-silence", type=float, default=0.0,
                    help="end each example with 0 to this many seconds more of its trailing silence "
                         "(default 0: off), so that the <EOU> cannot wait for the end of the audio")
    ap.add_argument("--turn-synths", default="",
                    help="train only on the turns (utterances with pauses inside) of these synthesizers, "
                         "e.g. espeak (default: every one): flite and festival say each part of a turn as "
                         "a whole utterance, so their pauses sound like ends")
    ap.add_argument("--turns-from", default="",
                    help="also train on the turns of this corpus's train split (one made with the same "
                         "tokenizer, e.g. `demo_model.data --synths espeak --turns N --train-limit 1`)")
    ap.add_argument("--turn-repeat", type=int, default=1,
                    help="each turn this many times an epoch (default 1)")
    ap.add_argument("--eou-window", type=float, default=0.0,
                    help="each <EOU> only within this many seconds of audio after its speech ends "
                         "(default 0: anywhere after its words; 0.24 = 3 encoder frames)")
    ap.add_argument("--freq-warp", type=float, default=0.1,
                    help="warp each example's frequency axis by up to this fraction (default 0.1; 0: off)")
    ap.add_argument("--ctc-weight", type=float, default=0.3)
    ap.add_argument("--warm-steps", type=int, default=1000,
                    help="first steps on short clean utterances only (default 1000)")
    ap.add_argument("--warm-max-frames", type=int, default=250, help="longest warm-up utterance (frames, 100/s)")
    ap.add_argument("--warm-ctc-weight", type=float, default=0.5)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.turn_repeat < 1:
        sys.exit(f"--turn-repeat {args.turn_repeat}: must be at least 1")
    if args.eou_window < 0 or 0 < args.eou_window < ENCODER_FRAME_S / 2:
        sys.exit(f"--eou-window {args.eou_window:g}: 0 (off) or at least one encoder frame ({ENCODER_FRAME_S:g} s)")
    if args.turns_from and not (Path(args.turns_from) / "train.jsonl").exists():
        sys.exit(f"--turns-from {args.turns_from}: no train.jsonl there (make one with python -m demo_model.data)")
    if not 0 <= args.freq_warp < 0.5:
        sys.exit(f"--freq-warp {args.freq_warp}: must be at least 0 (off) and below 0.5")
    if args.cooldown_minutes and not 0 < args.cooldown_minutes <= args.minutes:
        sys.exit(f"--cooldown-minutes {args.cooldown_minutes:g}: must be above 0 and within the --minutes budget "
                 f"({args.minutes:g}; 0 means no budget)")

    deadline = time.monotonic() + 60 * args.minutes if args.minutes else math.inf
    if args.nice:
        try:
            os.nice(args.nice)
        except OSError:
            pass
    gov = ThreadGovernor(args.threads, log=log)
    torch.set_num_interop_threads(1)
    data = Path(args.data)
    work = Path(args.work) if args.work else data / "train"
    work.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out)
    if args.init and (Path(args.init) / "tokenizer.model").exists():
        adopt_tokenizer(Path(args.init), data)
    ensure_data(data, gov.cores)

    tok = Tokenizer(data / "tokenizer.model")
    cfg = model_config(tok.vocab_size, args)
    cache = data / "feats"
    train = FeatureSet(data, "train", cache, cfg.features, jobs=gov.cores, log=log)
    tests = {name: FeatureSet(data, name, cache, cfg.features, log=log)
             for name in ("test_sentences", "test_voices")}
    more = FeatureSet(Path(args.turns_from), "train", Path(args.turns_from) / "feats", cfg.features, jobs=gov.cores,
                      log=log) if args.turns_from else None
    train = train_subset(train, args, more)
    n_train = len(train)
    lengths = train.lengths
    targets = [tok.encode(r["text"]) for r in train.records]
    corpus = json.loads((data / "corpus.json").read_text()) if (data / "corpus.json").exists() else {}
    log(f"[data] train {n_train} utterances, {lengths.sum() / 360000:.1f} h; "
        f"test_sentences {len(tests['test_sentences'])}, test_voices {len(tests['test_voices'])}")

    torch.manual_seed(args.seed)
    model = ParakeetModel(cfg)
    sample = np.concatenate([np.asarray(train.feats(i), np.float32) for i in range(0, n_train, max(1, n_train // 300))])
    # channels-last conv weights: ~2x faster subsampling convolutions on CPU (same values)
    model.encoder.pre_encode.to(memory_format=torch.channels_last)
    trainer = Transducer(model, float(sample.mean()), float(sample.std()))
    trainer.init_pre_encode()
    probe = plan_epoch(lengths, np.random.default_rng(0), 3000, 0.0)[0]
    probe_batch = collate(train, targets, probe, np.random.default_rng(0), tok.eou_id, augment=False)
    diff = check_fast_encoder(model, probe_batch.feats, probe_batch.lengths)
    if not diff < 1e-4:
        sys.exit(f"the fast training encoder differs from the model's ({diff}): fix objective.py")
    log(f"[model] fast training pre-encode checked (max diff vs the module {diff:.1e}); input mean "
        f"{float(sample.mean()):.2f} std {float(sample.std()):.2f} (first conv trained in normalised coordinates)")
    ema = copy_model(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(param_groups(trainer, args.weight_decay), lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    params = sum(p.numel() for p in model.parameters())
    log(f"[model] {params / 1e6:.2f} M parameters (+{sum(p.numel() for p in trainer.ctc_head.parameters())} "
        f"in the training-only CTC head); {cfg.encoder.n_layers} layers x {cfg.encoder.d_model}")

    st = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "train_seconds": 0.0, "audio_seconds": 0.0,
          "best_wer": float("inf"), "history": [], "args": vars(args), "ema_updates": 0,
          "started": datetime.now().isoformat(timespec="seconds")}
    eou_window = round(args.eou_window / ENCODER_FRAME_S)
    ckpt = work / "last.pt"
    aug_rng = np.random.default_rng(args.seed + 12345)
    if args.init and not ckpt.exists():
        try:
            trainer.load_exported(Path(args.init))
        except (OSError, RuntimeError) as exc:  # no model folder, or another architecture
            sys.exit(f"--init {args.init}: not a model folder of this configuration ({str(exc)[:200]})")
        ema.load_state_dict(model.state_dict())
        log(f"[init] weights from {args.init} (optimiser state starts fresh)")
    if ckpt.exists():
        try:
            saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - a torn file: fall back to the previous one
            log(f"[resume] {ckpt} unreadable ({exc}); trying last.prev.pt")
            saved = torch.load(work / "last.prev.pt", map_location="cpu", weights_only=False)
        trainer.load_state_dict(saved["trainer"])
        ema.load_state_dict(saved["ema"])
        opt.load_state_dict(saved["opt"])
        st.update({k: v for k, v in saved["state"].items() if k != "args"})
        aug_rng.bit_generator.state = saved["aug_rng"]
        torch.set_rng_state(saved["torch_rng"])
        log(f"[resume] step {st['step']}, epoch {st['epoch']} batch {st['batch_in_epoch']}, "
            f"{st['train_seconds'] / 3600:.2f} h trained, best test_sentences WER {100 * st['best_wer']:.1f}%")
    st["args"] = vars(args)
    if out_dir.exists():
        remove_stale_temp(out_dir)

    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True
        log(f"[signal] {signal.Signals(signum).name}: saving and stopping after this step")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def checkpoint():
        save_checkpoint(ckpt, {"trainer": trainer.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                               "state": st, "aug_rng": aug_rng.bit_generator.state,
                               "torch_rng": torch.get_rng_state(), "config": json.loads(cfg.to_json())})

    def run_eval():
        t0 = time.monotonic()
        cand = {}
        for name, m in (("raw", model), ("ema", ema)):
            r = evaluate(m, tok, tests["test_sentences"], args.eval_utts)
            cand[name] = r
        which = min(cand, key=lambda k: cand[k]["wer"])
        best_model = model if which == "raw" else ema
        rv = evaluate(best_model, tok, tests["test_voices"], args.eval_utts)
        rs = cand[which]
        model.train()
        entry = {"step": st["step"], "train_hours": st["train_seconds"] / 3600,
                 "audio_hours_seen": st["audio_seconds"] / 3600, "wer_sentences": rs["wer"],
                 "wer_voices": rv["wer"], "eou": (rs["eou"] + rv["eou"]) / 2, "weights": which,
                 "wer_sentences_raw": cand["raw"]["wer"], "wer_sentences_ema": cand["ema"]["wer"],
                 "wall": datetime.now().isoformat(timespec="seconds")}
        st["history"].append(entry)
        log(f"[eval] step {st['step']} ({st['train_seconds'] / 3600:.2f} h): WER test_sentences "
            f"{100 * rs['wer']:.1f}% ({which}; raw {100 * cand['raw']['wer']:.1f}, ema {100 * cand['ema']['wer']:.1f}), "
            f"test_voices {100 * rv['wer']:.1f}%, <EOU> ok {100 * entry['eou']:.0f}%  "
            f"[{time.monotonic() - t0:.0f}s]  e.g. {rs['example'][0]!r} -> {rs['example'][1]!r}")
        if rs["wer"] < st["best_wer"]:
            st["best_wer"] = rs["wer"]
            t1 = time.monotonic()
            full = {"sentences": evaluate(best_model, tok, tests["test_sentences"], None),
                    "voices": evaluate(best_model, tok, tests["test_voices"], None)}
            model.train()
            entry["full"] = {k: {kk: v[kk] for kk in ("wer", "eou", "n", "words")} for k, v in full.items()}
            export_copy = copy_model(best_model).eval()
            export_copy.tokenizer = tok
            full["real"] = offline_report(export_copy)
            size = export_model(export_copy, data / "tokenizer.model", out_dir)
            atomic_write(out_dir / "README.md", readme_text(st, corpus, cfg, params, size, full).encode())
            log(f"[export] {out_dir}: full test sets WER sentences {100 * full['sentences']['wer']:.1f}%, "
                f"voices {100 * full['voices']['wer']:.1f}%; {size / 1e6:.1f} MB [{time.monotonic() - t1:.0f}s]")
        checkpoint()

    model.train()
    last_log = last_eval = last_ckpt = time.monotonic()
    acc = {"loss": 0.0, "rnnt": 0.0, "ctc": 0.0, "n": 0, "audio": 0.0, "t": 0.0}
    batches = None
    warm_batches = None
    while True:
        warm = st["step"] < args.warm_steps
        if warm:
            # warm-up phase: short utterances only, no augmentation, no joined pairs, more CTC
            # (a transducer from scratch first sits on a blank plateau; short, clean
            # examples get the encoder aligning sooner)
            if warm_batches is None:
                short = np.flatnonzero(lengths <= args.warm_max_frames)
                plan = plan_epoch(lengths[short], np.random.default_rng(args.seed * 1000 - 1), args.batch_frames, 0.0)
                plan = [[type(e)((int(short[e.parts[0]]),), e.frames) for e in b] for b in plan]
                warm_batches = plan
                log(f"[warm] first {args.warm_steps} steps: {len(short)} utterances <= "
                    f"{args.warm_max_frames / 100:.1f} s, {len(plan)} batches per pass, no augmentation")
            batch = warm_batches[st["step"] % len(warm_batches)]
        else:
            if batches is None:
                batches = plan_epoch(lengths, np.random.default_rng(args.seed * 1000 + st["epoch"]),
                                     args.batch_frames, args.pair_prob)
                st["batches_per_epoch"] = len(batches)
            if st["batch_in_epoch"] >= len(batches):
                st["epoch"] += 1
                st["batch_in_epoch"] = 0
                batches = None
                log(f"[epoch] starting epoch {st['epoch']}")
                continue
            batch = batches[st["batch_in_epoch"]]
        t0 = time.monotonic()
        b = collate(train, targets, batch, aug_rng, tok.eou_id, augment=not warm,
                    max_warp=args.freq_warp, end_silence=args.end_silence)
        lr = learning_rate(st["step"], peak=args.lr, warmup=args.warmup, floor=args.min_lr,
                           cooldown_s=60 * args.cooldown_minutes, seconds_left=deadline - time.monotonic())
        for g in opt.param_groups:
            g["lr"] = lr
        out = trainer(b.feats, b.lengths, b.targets, b.target_lengths,
                      ctc_weight=args.warm_ctc_weight if warm else args.ctc_weight,
                      eou_frames=b.eou_frames, eou_window=eou_window)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        gnorm = torch.nn.utils.clip_grad_norm_(trainer.parameters(), 5.0)
        if torch.isfinite(gnorm):
            opt.step()
            trainer.sync()
        else:
            log(f"[warn] non-finite gradient at step {st['step']}: skipped")
        st["ema_updates"] += 1
        d = min(args.ema, (1 + st["ema_updates"]) / (10 + st["ema_updates"]))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - d)
        st["step"] += 1
        if not warm:
            st["batch_in_epoch"] += 1
        dt = time.monotonic() - t0
        audio = float(b.lengths.sum()) / 100
        st["train_seconds"] += dt
        st["audio_seconds"] += audio
        acc["loss"] += out["loss"].item()
        acc["rnnt"] += out["rnnt"].item()
        acc["ctc"] += float(out["ctc"].item()) if "ctc" in out else 0.0
        acc["n"] += 1
        acc["audio"] += audio
        acc["t"] += dt
        now = time.monotonic()
        if now - last_log >= 60 * args.log_minutes or st["step"] <= 3:
            n = max(1, acc["n"])
            where = "warm-up" if warm else f"epoch {st['epoch']} ({st['batch_in_epoch']}/{len(batches)})"
            log(f"[train] step {st['step']} {where} "
                f"loss {acc['loss'] / n:.3f} (rnnt {acc['rnnt'] / n:.3f}, ctc {acc['ctc'] / n:.3f}) lr {lr:.2e} "
                f"{acc['t'] / n:.2f} s/step, {acc['audio'] / max(1e-9, acc['t']):.0f}x real time, "
                f"threads {gov.threads}, {st['train_seconds'] / 3600:.2f} h trained")
            st["speed"] = {"s_per_step": acc["t"] / n, "x_real_time": acc["audio"] / max(1e-9, acc["t"]),
                           "threads": gov.threads}
            acc = {k: 0.0 for k in acc} | {"n": 0}
            last_log = now
        gov.maybe_update()
        budget_over = now >= deadline
        steps_over = args.max_steps and st["step"] >= args.max_steps
        if now - last_eval >= 60 * args.eval_minutes or budget_over or steps_over or stop["flag"]:
            run_eval()
            last_eval = last_ckpt = time.monotonic()
        elif now - last_ckpt >= 60 * args.ckpt_minutes:
            checkpoint()
            last_ckpt = time.monotonic()
        if budget_over or steps_over or stop["flag"]:
            log(f"[done] step {st['step']}, {st['train_seconds'] / 3600:.2f} h trained; "
                f"best test_sentences WER {100 * st['best_wer']:.1f}%")
            return 0


if __name__ == "__main__":
    sys.exit(main())
