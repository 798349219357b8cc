"""Log-mel features: incremental framing equals the whole-utterance pass, which equals NeMo's formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parakeet_stream.model.config import FeatureConfig
from parakeet_stream.model.features import FeatureStream, LogMelFeatures


@pytest.fixture(scope="module")
def features() -> LogMelFeatures:
    return LogMelFeatures(FeatureConfig())


def nemo_formula(x: torch.Tensor, f: LogMelFeatures) -> torch.Tensor:
    """NeMo's preprocessor at inference, written with torch.stft (centred, constant padding)."""
    emph = torch.cat((x[:1], x[1:] - 0.97 * x[:-1]))
    spec = torch.stft(emph, 512, 160, 400, window=f.window, center=True, pad_mode="constant", return_complex=True)
    power = torch.view_as_real(spec).pow(2).sum(-1).sqrt().pow(2)
    mel = torch.log(torch.matmul(f.fb, power) + 2**-24)
    return mel[:, : x.numel() // 160].T


@pytest.mark.parametrize("n", [400, 16000, 16000 * 2 + 77, 12345])
def test_offline_matches_nemo_formula(features, n):
    x = torch.from_numpy(np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.1)
    ours, valid = features(x)
    assert valid == n // 160
    torch.testing.assert_close(ours, nemo_formula(x, features), atol=1e-5, rtol=1e-5)


def test_incremental_equals_offline(features, wavs):
    x = torch.from_numpy(wavs["pause"])
    offline, valid = features(x)
    stream = FeatureStream(features)
    rng = np.random.default_rng(3)
    segments, i = [], 0
    while i < x.numel():
        n = int(rng.integers(1, 4000))
        segments.append(stream.push(x[i : i + n].numpy()))
        i += n
    segments.append(stream.flush())
    incremental = features.mel(features.frames(segments))
    assert incremental.size(0) == features.num_frames(x.numel())[1]
    torch.testing.assert_close(incremental[:valid], offline, atol=0, rtol=0)


def test_features_match_nemo_fixture(features, wavs, reference_tensors):
    for name, audio in wavs.items():
        nemo = reference_tensors[f"features/{name}"]  # [n_mels, samples // 160 + 1], last frame zero
        ours, valid = features(torch.from_numpy(audio))
        assert valid == nemo.shape[1] - 1
        torch.testing.assert_close(ours, nemo.T[:valid], atol=2e-4, rtol=1e-4)


def test_slaney_filterbank_matches_checkpoint_buffer(features, reference_fb):
    torch.testing.assert_close(features.fb, reference_fb, atol=1e-6, rtol=1e-5)
