"""What every benchmark shares: percentiles, the speech streams are fed, the machine's facts.

One way to compute a percentile for every figure the benchmarks print: linear interpolation between
the two nearest ranks (numpy's default, which `parakeet-bench` uses too). Importing this module
needs the standard library only (the load client, vs_parakeet_streaming/loadgen.py, is stdlib-only);
numpy and torch are imported by the functions that need them.
"""
from __future__ import annotations

import math
import os
import platform
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
FIXTURE_AUDIO = ROOT / "tests" / "fixtures" / "audio"
SAMPLE_RATE = 16000
# the TCP load client (real-time streams, 80 ms packets): `[sys.executable, *LOAD_CLIENT, ...]`, cwd=ROOT
LOAD_CLIENT = ("-m", "benchmarks.vs_parakeet_streaming.loadgen")


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) of `values`, linearly interpolated; None when there are none."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentiles(values: Iterable[float], qs: Iterable[float] = (50, 95, 99), scale: float = 1.0,
                digits: int | None = None) -> dict[str, float | None]:
    """{"p50": ..., "p95": ..., ...} of `values` times `scale` (1000: seconds -> ms), rounded to `digits`
    (0: whole numbers; None: not rounded); None where there are no values."""
    xs = sorted(float(v) * scale for v in values)
    out = {}
    for q in qs:
        p = percentile(xs, q)
        out[f"p{q:g}"] = p if p is None or digits is None else round(p, digits) if digits else round(p)
    return out


def speech(seconds: float, seed: int):
    """Real speech (the test fixtures' clips), looped in an order and from an offset drawn per `seed`:
    what the benchmarks' streams are fed (16 kHz float32)."""
    import numpy as np

    from parakeet_stream.audio import read_audio

    clips = [read_audio(p) for p in sorted(FIXTURE_AUDIO.glob("*.wav"))]
    rng = np.random.default_rng(seed)
    out, n = [], int(seconds * SAMPLE_RATE)
    while sum(len(c) for c in out) < n:
        out.append(clips[rng.integers(len(clips))])
    audio = np.concatenate(out)
    start = int(rng.integers(0, SAMPLE_RATE))
    return np.roll(audio, -start)[:n]


def write_wav(path: Path, audio, rate: int = SAMPLE_RATE) -> Path:
    """`audio` (float in [-1, 1]) as 16-bit PCM WAV."""
    import soundfile as sf

    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), audio, rate, subtype="PCM_16")
    return path


def machine(device: str = "cpu") -> dict:
    """What ran it: the platform, CPUs, torch and CUDA versions, and the GPU when `device` is cuda."""
    out = {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
           "device": device}
    try:
        import torch
    except ImportError:
        return out
    out |= {"torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}", "bf16": torch.cuda.is_bf16_supported()}
    return out
