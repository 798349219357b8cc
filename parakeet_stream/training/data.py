"""Data for training the demo model: manifests, a log-mel feature cache, batches, SpecAugment.

Features are computed ONCE per utterance with the model's own `LogMelFeatures` (exactly what
the server computes at inference) and cached as float16 shards::

    <cache>/<split>/shard_000.npy       [sum of frames, n_mels] float16, utterances back to back
    <cache>/<split>/shard_000.idx.npy   [n_utts + 1] int64 frame offsets into the shard
    <cache>/<split>/meta.json           feature config + manifest hash (a mismatch rebuilds)

Shards are written to temp files and renamed, so an interrupted build resumes shard by shard.
At training time the shards are memory-mapped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..model.config import FeatureConfig
from ..model.features import LogMelFeatures

SHARD = 1000  # utterances per feature shard
DB = math.log(10) / 10  # a decibel of power in log-mel (natural log) units


def load_manifest(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def _manifest_hash(recs: list[dict], fcfg: FeatureConfig) -> str:
    h = hashlib.sha1(json.dumps(dataclasses.asdict(fcfg), sort_keys=True).encode())
    for r in recs:
        h.update(f"{r['id']}|{r['audio_filepath']}|{r.get('duration')}\n".encode())
    return h.hexdigest()[:16]


def _features_of(path: Path, feats: LogMelFeatures) -> np.ndarray:
    import soundfile as sf

    x, sr = sf.read(str(path), dtype="float32", always_2d=False)
    if x.ndim != 1:
        x = x.mean(axis=1)
    if sr != feats.cfg.sample_rate:
        from ..audio import resample

        x = resample(x, sr, feats.cfg.sample_rate)
    with torch.no_grad():
        y, _ = feats(torch.from_numpy(np.ascontiguousarray(x)))
    return y.numpy().astype(np.float16)


def _build_shard(job) -> str:
    data_dir, out_dir, k, paths, fcfg_dict = job
    torch.set_num_threads(1)
    feats = LogMelFeatures(FeatureConfig(**fcfg_dict))
    arrays = [_features_of(Path(data_dir) / p, feats) for p in paths]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([a.shape[0] for a in arrays])
    out = Path(out_dir)
    data = np.concatenate(arrays) if arrays else np.zeros((0, fcfg_dict["n_mels"]), np.float16)
    for name, arr in ((f"shard_{k:03d}.idx.npy", offsets), (f"shard_{k:03d}.npy", data)):
        tmp = out / (name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, out / name)
    return f"shard_{k:03d}"


class FeatureSet:
    """The cached log-mel features of one manifest: `feats(i)` -> float16 [T, n_mels] (memory-mapped)."""

    def __init__(self, data_dir: str | Path, split: str, cache_dir: str | Path, fcfg: FeatureConfig,
                 jobs: int = 1, log=print):
        self.data_dir = Path(data_dir)
        self.split = split
        self.records = load_manifest(self.data_dir / f"{split}.jsonl")
        self.dir = Path(cache_dir) / split
        self.dir.mkdir(parents=True, exist_ok=True)
        key = _manifest_hash(self.records, fcfg)
        meta_file = self.dir / "meta.json"
        try:
            old_key = json.loads(meta_file.read_text()).get("key") if meta_file.exists() else None
        except (OSError, ValueError):  # being rewritten by another process: same data
            old_key = key
        if old_key is not None and old_key != key:
            for p in self.dir.glob("shard_*"):
                p.unlink()
            meta_file.unlink()
        n_shards = math.ceil(len(self.records) / SHARD)
        todo = [k for k in range(n_shards) if not (self.dir / f"shard_{k:03d}.npy").exists()
                or not (self.dir / f"shard_{k:03d}.idx.npy").exists()]
        if todo:
            log(f"[features] {split}: computing {len(todo)}/{n_shards} shards with {jobs} process(es)")
            jobsl = [(str(self.data_dir), str(self.dir), k,
                      [r["audio_filepath"] for r in self.records[k * SHARD:(k + 1) * SHARD]],
                      dataclasses.asdict(fcfg)) for k in todo]
            if jobs > 1 and len(jobsl) > 1:
                import multiprocessing as mp

                with mp.get_context("fork").Pool(jobs) as pool:
                    for i, name in enumerate(pool.imap_unordered(_build_shard, jobsl), 1):
                        if i % 5 == 0 or i == len(jobsl):
                            log(f"[features] {split}: {i}/{len(jobsl)} shards")
            else:
                for i, job in enumerate(jobsl, 1):
                    _build_shard(job)
                    if i % 5 == 0 or i == len(jobsl):
                        log(f"[features] {split}: {i}/{len(jobsl)} shards")
        meta = json.dumps({"key": key, "features": dataclasses.asdict(fcfg), "utterances": len(self.records)})
        if old_key != key or not meta_file.exists():
            tmp = meta_file.with_name(f"meta.json.tmp{os.getpid()}")
            tmp.write_text(meta)
            os.replace(tmp, meta_file)
        self._data = [np.load(self.dir / f"shard_{k:03d}.npy", mmap_mode="r") for k in range(n_shards)]
        self._idx = [np.load(self.dir / f"shard_{k:03d}.idx.npy") for k in range(n_shards)]
        self.lengths = np.concatenate([np.diff(ix) for ix in self._idx]).astype(np.int64)
        assert len(self.lengths) == len(self.records), (len(self.lengths), len(self.records))

    def __len__(self) -> int:
        return len(self.records)

    def feats(self, i: int) -> np.ndarray:
        k, j = divmod(i, SHARD)
        ix = self._idx[k]
        return self._data[k][ix[j]:ix[j + 1]]

    @property
    def hours(self) -> float:
        return float(sum(r["duration"] for r in self.records)) / 3600


class Subset:
    """Some utterances of one or more FeatureSets, renumbered from 0 (what `collate` and the
    trainer read): `picks` holds (feature set, index) pairs, an utterance may come more than once."""

    def __init__(self, picks: list[tuple[FeatureSet, int]]):
        self.picks = picks
        self.records = [fs.records[i] for fs, i in picks]
        self.lengths = np.array([fs.lengths[i] for fs, i in picks], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.picks)

    def feats(self, i: int) -> np.ndarray:
        fs, j = self.picks[i]
        return fs.feats(j)


# --------------------------------------------------------------------------
# Examples and batches
# --------------------------------------------------------------------------

@dataclass
class Example:
    """One training example: one utterance, or two joined by a pause (`parts` indices)."""

    parts: tuple[int, ...]
    frames: int  # approximate feature frames (for batching)


def plan_epoch(lengths: np.ndarray, rng: np.random.Generator, max_frames: int,
               pair_prob: float = 0.1, max_pair_frames: int = 2200) -> list[list[Example]]:
    """Shuffle, join a fraction of the utterances into pairs, and cut length-bucketed batches.

    A batch holds at most `max_frames` PADDED feature frames (batch size x longest example).
    Examples are sorted by length inside buckets of ~50 batches, then the batches are shuffled.
    """
    order = rng.permutation(len(lengths))
    examples: list[Example] = []
    i = 0
    while i < len(order):
        a = int(order[i])
        if pair_prob > 0 and i + 1 < len(order) and rng.random() < pair_prob:
            b = int(order[i + 1])
            total = int(lengths[a] + lengths[b]) + 75  # + the average added pause
            if total <= max_pair_frames:
                examples.append(Example((a, b), total))
                i += 2
                continue
        examples.append(Example((a,), int(lengths[a])))
        i += 1
    batches: list[list[Example]] = []
    bucket = max(1, 50 * max_frames // max(1, int(np.mean([e.frames for e in examples]))))
    for s in range(0, len(examples), bucket):
        chunk = sorted(examples[s:s + bucket], key=lambda e: e.frames)
        cur: list[Example] = []
        longest = 0
        for e in chunk:
            if cur and max(longest, e.frames) * (len(cur) + 1) > max_frames:
                batches.append(cur)
                cur, longest = [], 0
            cur.append(e)
            longest = max(longest, e.frames)
        if cur:
            batches.append(cur)
    perm = rng.permutation(len(batches))
    return [batches[j] for j in perm]


def _silence(prev: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n frames drawn from the last 15 (silent) frames of `prev`."""
    tail = prev[-min(15, len(prev)):]
    return tail[rng.integers(0, len(tail), n)]


def speech_end(x: np.ndarray, range_db: float = 40.0, floor_db: float = 6.0, shortest: int = 3) -> int:
    """The feature frame just after the last frame of speech in log-mel `x` [T, F].

    Speech: runs of at least `shortest` frames within `range_db` of the loudest (where
    `benchmarks.turns` puts the end of speech) and `floor_db` above the noise floor (the 10th
    percentile of the frames' power), so that the corpus's added noise (20-45 dB under the speech)
    and a synthesizer's click at the end are not speech.
    """
    power = np.logaddexp.reduce(np.asarray(x, np.float64), axis=1)  # log of each frame's mel power
    peak = power.max()
    level = min(max(peak - range_db * DB, np.percentile(power, 10) + floor_db * DB), peak - 10 * DB)
    loud = np.convolve(power > level, np.ones(shortest), "valid") == shortest  # run starts
    runs = np.flatnonzero(loud)
    return int(runs[-1]) + shortest if len(runs) else len(x)


def example_features(fs: FeatureSet, ex: Example, rng: np.random.Generator,
                     pause_range=(0.0, 1.5), end_silence: float = 0.0) -> tuple[np.ndarray, list[int]]:
    """float32 [T, n_mels] and, per part, the frame where its speech ends (`speech_end`).

    Pairs get an extra pause made of the first part's trailing (silent) frames.
    `end_silence` > 0: the example also ends with 0 to that many seconds more of its own trailing
    silence, so that the end of the audio does not tell where the <EOU> goes (a live stream's
    silence after a turn goes on)."""
    parts = [np.asarray(fs.feats(i), dtype=np.float32) for i in ex.parts]
    out, ends, start = [parts[0]], [speech_end(parts[0])], len(parts[0])
    for p in parts[1:]:
        n_extra = int(rng.uniform(*pause_range) * 100)
        if n_extra > 0:
            out.append(_silence(out[-1], n_extra, rng))
            start += n_extra
        out.append(p)
        ends.append(start + speech_end(p))
        start += len(p)
    if end_silence > 0:
        out.append(_silence(parts[-1], int(rng.uniform(0.0, end_silence) * 100), rng))
    return (out[0] if len(out) == 1 else np.concatenate(out)), ends


def spec_augment(x: np.ndarray, rng: np.random.Generator, freq_masks: int = 2, freq_width: int = 15,
                 time_masks: int = 5, time_width: float = 0.04, gain_db: float = 6.0) -> np.ndarray:
    """SpecAugment-style masks (filled with the utterance mean) and a random level shift, in place."""
    t, f = x.shape
    if gain_db:
        x += rng.uniform(-gain_db, gain_db) * math.log(10) / 10  # power gain in log-mel units
    fill = float(x.mean())
    for _ in range(freq_masks):
        w = int(rng.integers(0, freq_width + 1))
        s = int(rng.integers(0, max(1, f - w)))
        x[:, s:s + w] = fill
    max_w = max(1, int(time_width * t))
    for _ in range(time_masks):
        w = int(rng.integers(0, max_w + 1))
        s = int(rng.integers(0, max(1, t - w)))
        x[s:s + w] = fill
    return x


def warp_source_bins(n_bins: int, alpha: float, boundary: float = 0.8) -> np.ndarray:
    """Fractional source bin for each output bin of a frequency warp by `alpha`.

    Piecewise linear (as in VTLP): bins below `boundary` of the range read bin k / alpha,
    the rest are stretched so the top bin stays the top bin.  alpha > 1 moves the
    spectrum up (a shorter vocal tract), alpha < 1 down.
    """
    top = n_bins - 1
    b = boundary * top
    k = np.arange(n_bins, dtype=np.float64)
    high = b / alpha + (k - b) * (top - b / alpha) / (top - b)
    return np.clip(np.where(k <= b, k / alpha, high), 0, top)


def freq_warp(x: np.ndarray, alpha: float) -> np.ndarray:
    """Log-mel frames [T, F] as another speaker's (vocal tract length perturbation)."""
    src = warp_source_bins(x.shape[1], alpha)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, x.shape[1] - 1)
    w = (src - lo).astype(x.dtype)
    return x[:, lo] * (1 - w) + x[:, hi] * w


class Batch(NamedTuple):
    feats: torch.Tensor  # [B, T, F] float32
    lengths: torch.Tensor  # [B]
    targets: torch.Tensor  # [B, U] long, 0-padded
    target_lengths: torch.Tensor  # [B]
    eou_frames: torch.Tensor  # [B, U] long: at each <EOU>, the feature frame its speech ends; -1 elsewhere


def collate(fs: FeatureSet, targets: list[list[int]], batch: list[Example], rng: np.random.Generator,
            eou_id: int, augment: bool = True, end_frame_prob: float = 0.5, max_warp: float = 0.0,
            end_silence: float = 0.0) -> Batch:
    """The examples' features and targets (the words of each part, then <EOU>), padded.

    `max_warp`: with augmentation, each example's frequency axis is warped by a factor drawn
    from [1 - max_warp, 1 + max_warp] (new speakers out of the synthesizers' few voices).
    """
    xs, ys, es = [], [], []
    for ex in batch:
        x, ends = example_features(fs, ex, rng, end_silence=end_silence if augment else 0.0)
        if augment:
            if max_warp:
                x = freq_warp(x, rng.uniform(1 - max_warp, 1 + max_warp))
            x = spec_augment(x, rng)
            if rng.random() < end_frame_prob:
                # a streaming session ends with one all-zero feature frame (NeMo's zero-masked
                # STFT tail, see FeatureStream.flush / Sequence._next_chunk): train on it too
                x = np.concatenate([x, np.zeros((1, x.shape[1]), x.dtype)])
        xs.append(x)
        y: list[int] = []
        e: list[int] = []
        for i, end in zip(ex.parts, ends):
            y += targets[i] + [eou_id]
            e += [-1] * len(targets[i]) + [end]
        ys.append(y)
        es.append(e)
    b, t, f = len(xs), max(len(x) for x in xs), xs[0].shape[1]
    feats = np.zeros((b, t, f), np.float32)
    for k, x in enumerate(xs):
        feats[k, :len(x)] = x
    u = max(len(y) for y in ys)
    tg = np.zeros((b, max(u, 1)), np.int64)
    eou = np.full((b, max(u, 1)), -1, np.int64)
    for k, (y, e) in enumerate(zip(ys, es)):
        tg[k, :len(y)] = y
        eou[k, :len(e)] = e
    return Batch(torch.from_numpy(feats), torch.tensor([len(x) for x in xs]),
                 torch.from_numpy(tg), torch.tensor([len(y) for y in ys]), torch.from_numpy(eou))


# --------------------------------------------------------------------------
# WER
# --------------------------------------------------------------------------

def edit_distance(a: list[str], b: list[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def aligned_right(ref: list[str], hyp: list[str]) -> list[bool]:
    """For each hypothesis word: is it aligned to an equal reference word (a minimum edit alignment)?"""
    cost = np.zeros((len(ref) + 1, len(hyp) + 1), dtype=int)
    cost[:, 0], cost[0, :] = range(len(ref) + 1), range(len(hyp) + 1)
    for i in range(1, len(ref) + 1):
        for j in range(1, len(hyp) + 1):
            cost[i, j] = min(cost[i - 1, j] + 1, cost[i, j - 1] + 1, cost[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]))
    right, i, j = [False] * len(hyp), len(ref), len(hyp)
    while j > 0:
        if i > 0 and cost[i, j] == cost[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]):
            right[j - 1] = ref[i - 1] == hyp[j - 1]
            i, j = i - 1, j - 1
        elif cost[i, j] == cost[i, j - 1] + 1:
            j -= 1  # an inserted word: wrong
        else:
            i -= 1
    return right


def wer(refs: list[str], hyps: list[str]) -> float:
    """Corpus word error rate (total word edits / total reference words)."""
    errors = sum(edit_distance(r.split(), h.split()) for r, h in zip(refs, hyps))
    return errors / max(1, sum(len(r.split()) for r in refs))
