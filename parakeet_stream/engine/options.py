"""The engine's options as programs take them: command-line flags, and the slot count sized to memory.

Shared by parakeet-serve, parakeet-transcribe and the benchmarks; ASREngine itself takes plain
keyword arguments (`ASREngine(..., **engine_options(args))`).
"""

from __future__ import annotations

import argparse

import torch

from ..host import free_memory
from ..model.config import Lookahead, parse_lookahead
from ..model.conformer import EncoderCache
from ..model.parakeet import ParakeetModel
from ..model.precision import DTYPES, QUANTIZE
from .latency import DEFAULT_TARGET


def add_engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The engine's speed options."""
    ap.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                    help="encoder precision (default auto: the fastest reduced precision that keeps float32's tokens "
                         "in a check on this device at start-up, else float32; float32 is token-exact with NeMo)")
    ap.add_argument("--quantize", default=None, choices=QUANTIZE, help="dynamic int8 encoder matmuls (CPU only)")
    ap.add_argument("--threads", type=thread_count, default=None,
                    help="the encoder's intra-op threads on CPU (default: every usable core; with fewer, "
                         "pre-encode and decode get threads of their own)")
    ap.add_argument("--lookahead", "--att-context-size", type=_lookahead, default=None,
                    help="default lookahead mode L,R (attention context frames), e.g. 70,1 (default: the model's first; "
                         "for files, the longest)")
    ap.add_argument("--lookahead-modes", type=_modes, default=None,
                    help="the lookahead modes served, e.g. '70,1' or '70,1 70,13' (default: every mode of the "
                         "model); CUDA graphs are captured for these only (one of `large`'s four modes: 79 of its 196 "
                         "graphs, a shorter start-up), and a stream asking for another is refused")
    ap.add_argument("--latency-target", type=_seconds, default=DEFAULT_TARGET,
                    help=f"seconds, p95, from a chunk's last sample to its result reaching the client; steps are "
                         f"batched within what the rest of the path leaves (default {DEFAULT_TARGET:g}: a voice agent's "
                         "share for the transcript)")


def engine_options(args: argparse.Namespace) -> dict:
    """The parsed flags as ASREngine keyword arguments."""
    return {"dtype": args.dtype, "quantize": args.quantize, "threads": args.threads, "latency_target": args.latency_target,
            "lookahead": args.lookahead, "modes": args.lookahead_modes}


CPU_SLOTS = 64


def default_slots(device: str) -> int | str:
    """`--max-num-streams` where it is not given. On a GPU `auto`: the slots its memory holds
    (memory.py); admission by measured capacity (scheduler.py) keeps the streams beyond what the GPU
    serves in time waiting, and a fixed 64 was about a fortieth of what one H200's step time serves
    (docs/performance.md section 6). On a CPU 64: a few times what a CPU serves in real time (24 to
    32 streams of `small` on 2 cores), while `auto` there would set aside half the memory for slots
    the cores could never serve."""
    return "auto" if device.startswith("cuda") else CPU_SLOTS


def auto_num_streams(model: ParakeetModel, device: torch.device, dtype: torch.dtype, cap: int = 4096) -> int:
    """Slots whose encoder caches fit in half the free memory of the device, at most `cap`."""
    per_slot = max(EncoderCache.slot_bytes(model.cfg.encoder, dtype), 1)
    return max(1, min(cap, int(free_memory(device) * 0.5) // per_slot))


def whole_number(text: str, of: str = "", least: int = 1) -> int:
    """A flag's whole number of at least `least` (`of`: what it counts, for the message)."""
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number{of and ' of ' + of}, at least {least}, got {text!r}")
    return value


def thread_count(text: str) -> int:
    """--threads: a whole number of at least 1."""
    return whole_number(text, "threads")


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text!r}")
    return value


def _modes(text: str) -> tuple[Lookahead, ...]:
    modes = tuple(_lookahead(part) for part in text.replace(";", " ").split())
    if not modes:
        raise argparse.ArgumentTypeError(f"at least one mode L,R such as 70,1, got {text!r}")
    return modes


def _lookahead(text: str) -> Lookahead:
    try:
        return parse_lookahead(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None
