"""The measured check behind `--dtype auto`: which reduced precision, if any, the encoder runs in here.

Decided on the loaded model and the device at hand, not from a table of CPU or GPU names: each
candidate (bfloat16 on a CPU; bfloat16, where supported, and float16 on a GPU) is a copy of the
encoder in that precision, which must
- keep float32's decisions on a fixed input (a few seconds of deterministic speech-like audio per
  stream): the joint's argmax at every encoder frame (the prediction network at its start state,
  float32 as always) agrees with float32's at least MIN_AGREEMENT of the time, and the encoder
  output stays finite and within MAX_ERROR of float32's (relative root mean square). Rounding
  flips an argmax only where float32's own top two are within rounding of each other: bfloat16
  flipped 1 frame in 156 on the demo model and on the random-weight `small` (whose margins are
  all under 0.5 nats), none where float32's margin exceeded 0.25 nats, at an output error of
  1.6-2.2%; a mode that overflows or has broken kernels changes most frames or is off by its
  whole magnitude. Frames are compared one by one, not greedy token sequences: one flipped label
  changes the prediction network's state and every label after it, which on an input of
  near-ties (a random-weight model, or anything not speech) says more about the input than about
  the precision;
- and be measurably faster: an encoder step (pre-encode + layers) of BATCH streams at most
  FASTER of float32's (median of a few steps, at the calling thread's intra-op threads). A
  candidate without native kernels (emulated bfloat16 is several times slower) is dropped after
  its first timed step.
float32 stays what `--dtype float32` asks for, and what the parity tests run.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from .conformer import EncoderCache
from .packed import can_pack, pack_linears

MIN_AGREEMENT = 0.98  # share of frames whose argmax is float32's
MAX_ERROR = 0.1  # relative RMS difference of the encoder output from float32's
FASTER = 0.9  # most of float32's step time a candidate may take
BATCH = 8  # streams in a timed step: a loaded server's batch
STEPS = 3  # timed steps per mode, after one to warm up
STREAMS, SECONDS = 4, 2.5  # the agreement input: some 130 encoder frames (their encoding is most of the cost)


@dataclass(frozen=True)
class Trial:
    """One candidate precision measured against float32."""

    dtype: str
    agreement: float  # share of encoder frames whose argmax label is float32's
    error: float  # relative RMS difference of its encoder output from float32's (inf: not finite)
    seconds: float  # its encoder step at BATCH streams (median)

    def keeps_decisions(self) -> bool:
        return self.agreement >= MIN_AGREEMENT and self.error <= MAX_ERROR


@dataclass(frozen=True)
class PrecisionChoice:
    """The encoder's precision and why: asked for, or measured (`--dtype auto`)."""

    dtype: str
    reason: str
    float32_seconds: float | None = None  # float32's encoder step at BATCH streams, when measured
    trials: tuple[Trial, ...] = ()
    check_seconds: float = 0.0  # what the check cost at start-up

    def summary(self) -> dict:
        return {"dtype": self.dtype, "reason": self.reason, "check_seconds": round(self.check_seconds, 3),
                "float32_step_ms": None if self.float32_seconds is None else round(self.float32_seconds * 1000, 2),
                "trials": [{"dtype": t.dtype, "agreement": round(t.agreement, 4), "error": round(t.error, 5),
                            "step_ms": round(t.seconds * 1000, 2)} for t in self.trials]}


def choose(float32_seconds: float, trials: list[Trial]) -> tuple[str, str]:
    """The precision to run and why, from the measured figures; trials in order of preference (a
    later one wins only where it is measurably faster than the one before it)."""
    best, why_not = None, []
    for t in trials:
        if not t.keeps_decisions():
            why_not.append(f"{t.dtype} changes decisions ({t.agreement:.1%} of frames agree, output error {t.error:.1%})")
        elif t.seconds > FASTER * float32_seconds:
            why_not.append(f"{t.dtype} is not faster (its step takes {t.seconds / float32_seconds:.0%} of float32's, "
                           f"more than {FASTER:.0%})")
        elif best is None or t.seconds <= FASTER * best.seconds:
            best = t
    if best is None:
        return "float32", "; ".join(why_not) or "no reduced precision to try on this device"
    return best.dtype, (f"{best.dtype} keeps decisions ({best.agreement:.1%} of frames agree, output error "
                        f"{best.error:.1%}) and its encoder step is {float32_seconds / best.seconds:.1f}x faster "
                        f"than float32's at batch {BATCH}")


def candidates(device: torch.device) -> list[torch.dtype]:
    """The reduced precisions worth trying on `device`, in order of preference."""
    if device.type == "cuda":
        return ([torch.bfloat16] if torch.cuda.is_bf16_supported() else []) + [torch.float16]
    return [torch.bfloat16] if device.type == "cpu" else []


@torch.inference_mode()
def check(model) -> PrecisionChoice:
    """Measure every candidate against float32 on `model` (float32, any device); changes nothing."""
    began = time.perf_counter()
    device = model.features.fb.device
    feats, frames = _input(model, device)
    reference = model.encoder(feats, frames)[0]
    labels = _labels(model, reference)
    float32_seconds = _step_seconds(model.encoder, torch.float32, device)
    trials = []
    for dtype in candidates(device):
        trials.append(_trial(model, dtype, feats, frames, reference, labels, float32_seconds))
    chosen, reason = choose(float32_seconds, trials)
    return PrecisionChoice(chosen, reason, float32_seconds, tuple(trials), time.perf_counter() - began)


def _trial(model, dtype: torch.dtype, feats: torch.Tensor, frames: torch.Tensor, reference: torch.Tensor,
           labels: torch.Tensor, float32_seconds: float) -> Trial:
    """A copy of the encoder in `dtype`, measured against float32's figures; one that fails to run
    (a kernel this device lacks in it) keeps nothing."""
    encoder = copy.deepcopy(model.encoder).to(dtype)
    if can_pack(feats.device, dtype):  # as set_precision will run it
        pack_linears(encoder)
    try:
        seconds = _step_seconds(encoder, dtype, feats.device, give_up=float32_seconds)
        out = encoder(feats.to(dtype), frames)[0].float()
    except RuntimeError:
        return Trial(_name(dtype), 0.0, float("inf"), float("inf"))
    agreement = float((_labels(model, out) == labels).float().mean())
    return Trial(_name(dtype), agreement, _error(out, reference), seconds)


def _input(model, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-mel features of STREAMS streams of deterministic speech-like audio: voiced harmonics
    whose pitch and loudness glide, with a little noise (features like speech's, so that a trained
    model's decisions are not all blank)."""
    rate = model.cfg.features.sample_rate
    t = np.arange(int(SECONDS * rate)) / rate
    rng = np.random.default_rng(0)
    feats = []
    for s in range(STREAMS):
        pitch = 110 + 40 * s + 30 * np.sin(2 * np.pi * (0.7 + 0.2 * s) * t)
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        voice = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t + s)) ** 2
        audio = (0.1 * voice + 0.003 * rng.standard_normal(t.size)).astype(np.float32)
        feats.append(model.features(torch.from_numpy(audio))[0])
    frames = min(f.size(0) for f in feats)
    lengths = torch.full((STREAMS,), frames, dtype=torch.long, device=device)
    return torch.stack([f[:frames] for f in feats]).to(device), lengths


def _labels(model, encoded: torch.Tensor) -> torch.Tensor:
    """The joint's argmax at every frame of `encoded` [B, T, D], the prediction network at its start."""
    joint = model.decoder.joint
    start = model.decoder.initial_state(1, encoded.device).g[:, None, :]
    return joint(joint.enc(encoded.float()), start).argmax(-1)


def _error(out: torch.Tensor, reference: torch.Tensor) -> float:
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float(torch.linalg.vector_norm(out - reference) / torch.linalg.vector_norm(reference).clamp(min=1e-12))


def _step_seconds(encoder, dtype: torch.dtype, device: torch.device, give_up: float | None = None) -> float:
    """Median seconds of an encoder step (pre-encode + layers) of BATCH streams at a full cache, in
    the first lookahead mode; with `give_up`, stops at the first timed step slower than that."""
    lookahead = encoder.cfg.att_context_sizes[0]
    spec = encoder.chunk_spec(lookahead)
    feats = torch.randn(BATCH, spec.window, encoder.cfg.feat_in, generator=torch.Generator().manual_seed(0))
    feats = feats.to(device, dtype)
    lengths = torch.full((BATCH,), spec.window, device=device)
    start = torch.zeros(BATCH, dtype=torch.long, device=device)
    cache = EncoderCache.zeros(encoder.cfg, BATCH, device, dtype)
    cache.length.fill_(lookahead[0])
    slots = torch.arange(BATCH, device=device)
    times = []
    for i in range(STEPS + 1):
        _sync(device)
        t0 = time.perf_counter()
        x, lens = encoder.stream_pre_encode(feats, lengths, start, lookahead)
        encoder.stream_layers(x, lens, cache, slots, lookahead)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
            if give_up is not None and times[-1] > give_up:
                break
    return float(np.median(times))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
