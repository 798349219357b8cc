"""Estimated waiting time for queued streams."""
from __future__ import annotations


class WaitEstimator:
    """Expected wait = how long a slot is typically held x streams ahead / slots."""

    def __init__(self, default_hold_s: float = 10.0, smoothing: float = 0.2) -> None:
        self._hold_s = default_hold_s
        self._smoothing = smoothing

    def record_hold(self, seconds: float) -> None:
        self._hold_s += self._smoothing * (seconds - self._hold_s)

    def estimate(self, position: int, slots: int) -> float:
        return round(self._hold_s * position / max(1, slots), 1)
