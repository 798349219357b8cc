"""Training augmentation: the vocal-tract-length frequency warp of log-mel frames."""

import numpy as np
import pytest

from parakeet_stream.training.data import freq_warp, warp_source_bins


def test_no_warp_is_the_identity():
    x = np.random.default_rng(0).normal(size=(7, 80)).astype(np.float32)
    np.testing.assert_allclose(freq_warp(x, 1.0), x, atol=1e-6)


@pytest.mark.parametrize("alpha, direction", [(1.1, +1), (0.9, -1)])
def test_a_formant_moves_with_the_warp_and_the_band_edges_stay(alpha, direction):
    x = np.full((3, 80), -10.0, np.float32)
    x[:, 30] = 0.0  # one spectral peak
    y = freq_warp(x, alpha)
    peak = float((np.arange(80) * (y[0] + 10)).sum() / (y[0] + 10).sum())
    assert peak == pytest.approx(30 * alpha, abs=0.5)
    assert np.sign(peak - 30) == direction
    src = warp_source_bins(80, alpha)
    assert src[0] == 0 and src[-1] == 79 and np.all(np.diff(src) > 0)
