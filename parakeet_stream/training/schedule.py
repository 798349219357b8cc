"""The demo trainer's learning-rate schedule."""
from __future__ import annotations

import math


def learning_rate(step: int, *, peak: float, warmup: int, floor: float,
                  cooldown_s: float = 0.0, seconds_left: float = math.inf) -> float:
    """Linear warm-up to `peak`, inverse-sqrt decay down to `floor`, then, when `cooldown_s` is
    set, a linear fall to 0 over the budget's last `cooldown_s` seconds: a model that plateaus at a
    constant lr usually improves again once the lr is annealed (the "decay" phase of
    warmup-stable-decay schedules)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    lr = max(floor, peak * math.sqrt(warmup / (step + 1)))
    if cooldown_s:
        lr *= min(1.0, max(0.0, seconds_left / cooldown_s))
    return lr
