"""Synthetic conversations for the demo speaker diarizer: espeak-ng voices taking turns, with pauses
and now and then an overlap, and who spoke when in 80 ms frames.

A pool of utterances is rendered once per split (`render_pool`): voices drawn from the demo corpus's
espeak-ng accents and variants (the held-out ones for `test`, never trained on), a few sentences
each. `Conversations` then mixes any number of conversations from the pool: two or three voices
(sometimes one), turns of one utterance, pauses of 0.1-1 s or an overlap of up to 0.8 s, levels
apart by up to 6 dB, background noise. Its labels: each voice's speech (its samples above a
fraction of its peak, gaps under 0.2 s closed) per 80 ms frame, speakers numbered by when they
first spoke, as Sortformer numbers them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from .data import HELDOUT_VARIANTS, PITCH_RANGE, SPEED_RANGE, espeak_combos, normalize, read_fortunes
from .speech import synth

RATE = 16000
FRAME = 1280  # samples per diarizer frame (80 ms: 10 ms mel hop x 8)
HOP = 160  # samples per activity decision (10 ms)
GAP_CLOSED = 20  # activity gaps this many HOPs or shorter are speech (a pause between words)


@dataclass
class Utterance:
    voice: int  # index of its voice in the pool
    samples: np.ndarray  # float32 at 16 kHz
    active: np.ndarray  # bool per HOP: speech


def draw_voices(split: str, n: int, seed: int) -> list[dict]:
    """`n` espeak-ng voices: accent, variant, speed, pitch ("test": held-out accents or variants)."""
    rng = random.Random(seed)
    combos = espeak_combos("test_voices" if split == "test" else "train")
    if split == "test":  # every held-out variant at least once
        combos = [c for c in combos if c[1] in HELDOUT_VARIANTS] + combos
    return [{"voice": a, "variant": v, "speed": rng.randint(*SPEED_RANGE), "pitch": rng.randint(*PITCH_RANGE)}
            for a, v in (combos[i] if split == "test" and i < len(HELDOUT_VARIANTS) else rng.choice(combos)
                         for i in range(n))]


def activity(samples: np.ndarray) -> np.ndarray:
    """Speech per 10 ms: RMS above 5% of the utterance's loudest 10 ms, gaps of <= 0.2 s closed."""
    n = samples.size // HOP
    rms = np.sqrt(np.mean(samples[: n * HOP].reshape(n, HOP) ** 2, axis=1))
    on = rms > 0.05 * rms.max(initial=1e-9)
    idx = np.flatnonzero(on)
    for a, b in zip(idx, idx[1:]):
        if 1 < b - a <= GAP_CLOSED:
            on[a:b] = True
    return on


def _render(job: tuple[int, dict, str, int]) -> Utterance:
    voice, spec, text, seed = job
    samples = synth({**spec, "text": text}, seed, lead=0.0, tail=0.0)
    return Utterance(voice, samples, activity(samples))


def render_pool(split: str, voices: int, per_voice: int, seed: int, jobs: int = 1) -> list[Utterance]:
    """`per_voice` sentences of the fortunes corpus by each of `voices` voices of `split`."""
    rng = random.Random(seed + 1)
    sentences = [" ".join(w) for s in read_fortunes() if (w := normalize(s)) and 4 <= len(w) <= 14]
    specs = draw_voices(split, voices, seed)
    work = [(v, spec, rng.choice(sentences), seed * 100_000 + v * 100 + k)
            for v, spec in enumerate(specs) for k in range(per_voice)]
    with Pool(jobs) as pool:
        return pool.map(_render, work, chunksize=8)


def save_pool(path: Path, pool: list[Utterance]) -> None:
    lengths = np.array([u.samples.size for u in pool])
    np.savez(path, voice=np.array([u.voice for u in pool]), lengths=lengths,
             samples=np.concatenate([np.round(u.samples * 32767).astype(np.int16) for u in pool]))


def load_pool(path: Path) -> list[Utterance]:
    data = np.load(path)
    ends = np.cumsum(data["lengths"])
    pieces = np.split(data["samples"].astype(np.float32) / 32767, ends[:-1])
    return [Utterance(int(v), x, activity(x)) for v, x in zip(data["voice"], pieces)]


class Conversations:
    """Conversations drawn from a pool of utterances: (samples, labels [frames, max_speakers])."""

    def __init__(self, pool: list[Utterance], max_speakers: int, seconds: float = 20.0):
        self.by_voice: dict[int, list[Utterance]] = {}
        for u in pool:
            self.by_voice.setdefault(u.voice, []).append(u)
        self.voices = sorted(self.by_voice)
        self.max_speakers = max_speakers
        self.seconds = seconds

    def draw(self, rng: random.Random, speakers: int | None = None, overlap: bool = True) -> tuple[np.ndarray, np.ndarray]:
        speakers = speakers or rng.choices([1, 2, 3], [0.1, 0.6, 0.3])[0]
        cast = rng.sample(self.voices, min(speakers, self.max_speakers))
        gains = [10 ** (rng.uniform(-6, 0) / 20) for _ in cast]
        placed, at, who, limit = [], int(rng.uniform(0.1, 0.8) * RATE), -1, int(self.seconds * RATE)
        while True:
            who = rng.choice([k for k in range(len(cast)) if k != who] or [0])
            u = rng.choice(self.by_voice[cast[who]])
            if placed and at + u.samples.size > limit:
                break
            placed.append((at, who, u))
            end = at + u.samples.size
            gap = rng.uniform(-0.8, -0.2) if overlap and rng.random() < 0.15 and len(cast) > 1 else rng.uniform(0.1, 1.0)
            at = max(end + int(gap * RATE), placed[-1][0] + u.samples.size // 2)
        total = max(a + u.samples.size for a, _, u in placed) + int(rng.uniform(0.2, 1.0) * RATE)
        audio, on = np.zeros(total, np.float32), np.zeros((total // HOP + 1, len(cast)), bool)
        for a, k, u in placed:
            audio[a : a + u.samples.size] += gains[k] * u.samples
            on[a // HOP : a // HOP + u.active.size, k] |= u.active
        audio += np.float32(10 ** (-rng.uniform(20, 40) / 20) * 0.3) * np.random.default_rng(rng.getrandbits(32)).standard_normal(total).astype(np.float32)
        audio *= np.float32(rng.uniform(0.2, 0.9) / max(np.abs(audio).max(), 1e-6))
        return audio, self._labels(on, total)

    def _labels(self, on: np.ndarray, total: int) -> np.ndarray:
        """Per 80 ms frame, a speaker active in at least half of it; columns in order of first speech."""
        frames = -(-total // FRAME)
        per = np.zeros((frames * (FRAME // HOP), on.shape[1]), np.float32)
        per[: min(on.shape[0], per.shape[0])] = on[: per.shape[0]]
        labels = per.reshape(frames, FRAME // HOP, -1).mean(1) >= 0.5
        first = [np.flatnonzero(labels[:, k])[0] if labels[:, k].any() else frames for k in range(labels.shape[1])]
        out = np.zeros((frames, self.max_speakers), np.float32)
        for rank, k in enumerate(sorted(range(labels.shape[1]), key=first.__getitem__)):
            out[:, rank] = labels[:, k]
        return out
