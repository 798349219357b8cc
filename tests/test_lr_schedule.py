"""The demo trainer's learning-rate schedule: warm-up, inverse-sqrt decay to a floor, cooldown."""
from __future__ import annotations

import pytest

from parakeet_stream.training.schedule import learning_rate

SCHEDULE = {"peak": 1e-3, "warmup": 100, "floor": 1e-4}


def test_warm_up_rises_linearly_to_the_peak_then_decays_to_the_floor():
    assert learning_rate(0, **SCHEDULE) == pytest.approx(1e-5)
    assert learning_rate(49, **SCHEDULE) == pytest.approx(5e-4)
    assert learning_rate(99, **SCHEDULE) == pytest.approx(1e-3)
    assert learning_rate(399, **SCHEDULE) == pytest.approx(5e-4)  # sqrt(100 / 400)
    assert learning_rate(100_000, **SCHEDULE) == 1e-4


def test_cooldown_anneals_the_budget_s_last_minutes_linearly_to_zero():
    late = 100_000  # on the floor
    assert learning_rate(late, **SCHEDULE, cooldown_s=600, seconds_left=1200) == 1e-4
    assert learning_rate(late, **SCHEDULE, cooldown_s=600, seconds_left=600) == pytest.approx(1e-4)
    assert learning_rate(late, **SCHEDULE, cooldown_s=600, seconds_left=150) == pytest.approx(2.5e-5)
    assert learning_rate(late, **SCHEDULE, cooldown_s=600, seconds_left=0) == 0
    assert learning_rate(late, **SCHEDULE, cooldown_s=600, seconds_left=-5) == 0  # the last step runs over


def test_no_cooldown_keeps_the_floor_to_the_end():
    assert learning_rate(100_000, **SCHEDULE, seconds_left=0) == 1e-4
