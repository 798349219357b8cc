"""Log-mel features as NeMo's AudioToMelSpectrogramPreprocessor computes them at inference.

Pre-emphasis, a centred STFT (zero padding of n_fft // 2), magnitude squared, mel
filterbank, log(x + guard); no normalisation. NeMo reports floor(N / hop) valid frames for
N samples (one more STFT frame exists and is zero-masked). The same per-frame code serves
the whole-utterance pass and the incremental one, so both give the same frames.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .config import FeatureConfig


def slaney_mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Slaney-style mel filterbank with area normalisation (librosa's default), [n_mels, n_fft//2+1]."""

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        lin = f / (200.0 / 3)
        log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
        return np.where(f >= 1000.0, log, lin)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        lin = m * (200.0 / 3)
        log = 1000.0 * np.exp((math.log(6.4) / 27.0) * (m - 15.0))
        return np.where(m >= 15.0, log, lin)

    fft_freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mel_pts = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sample_rate / 2)), n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = mel_pts[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_pts[2:] - mel_pts[:-2]))[:, None]
    return weights.astype(np.float32)


class LogMelFeatures(nn.Module):
    """NeMo-equivalent log-mel features; `mel` turns emphasised sample frames into features."""

    def __init__(self, cfg: FeatureConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=False))
        fb = slaney_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels)
        self.register_buffer("fb", torch.from_numpy(fb))

    def _padded_window(self) -> torch.Tensor:
        left = (self.cfg.n_fft - self.cfg.win_length) // 2
        return nn.functional.pad(self.window, (left, self.cfg.n_fft - self.cfg.win_length - left))

    def mel(self, frames: torch.Tensor) -> torch.Tensor:
        """Emphasised sample frames [..., n_fft] -> log-mel [..., n_mels]."""
        cfg = self.cfg
        spec = torch.view_as_real(torch.fft.rfft(frames * self._padded_window(), n=cfg.n_fft))
        mag = torch.sqrt(spec.pow(2).sum(-1))
        if cfg.mag_power != 1.0:
            mag = mag.pow(cfg.mag_power)
        return torch.log(torch.matmul(mag, self.fb.t()) + cfg.log_guard)

    def emphasise(self, samples: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-emphasis y[n] = x[n] - a * x[n-1]; `previous` is the sample before `samples` ([B])."""
        a = self.cfg.preemph
        if a == 0.0:
            return samples
        prev = samples[..., :1] if previous is None else previous.reshape(samples.shape[:-1] + (1,))
        shifted = torch.cat((prev, samples[..., :-1]), dim=-1)
        out = samples - a * shifted
        if previous is None:
            out[..., 0] = samples[..., 0]
        return out

    def num_frames(self, n_samples: int) -> tuple[int, int]:
        """(valid frames, total frames incl. NeMo's zero-masked tail) for a whole utterance."""
        valid = n_samples // self.cfg.hop_length
        total = valid + 1
        if self.cfg.pad_to > 0 and total % self.cfg.pad_to:
            total += self.cfg.pad_to - total % self.cfg.pad_to
        return valid, total

    def forward(self, samples: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Whole utterance [N] -> (features [valid, n_mels], valid frame count)."""
        stream = FeatureStream(self)
        frames = torch.cat((stream.push(samples), stream.flush()))
        valid = stream.valid_frames
        return self.mel(frames[:valid].to(self.fb.dtype)), valid


class FeatureStream:
    """Incremental framing of one stream: push samples, get every complete emphasised frame.

    Frames come back as raw [F, n_fft] sample windows so that many streams' frames can go
    through `LogMelFeatures.mel` in one batch.
    """

    def __init__(self, features: LogMelFeatures):
        self.cfg = features.cfg
        self.emphasise = features.emphasise
        self.num_frames = features.num_frames
        self.buffer = torch.zeros(self.cfg.n_fft // 2)  # centred STFT: zero padding on the left
        self.last_sample: torch.Tensor | None = None
        self.n_samples = 0
        self.frames_done = 0

    @property
    def valid_frames(self) -> int:
        """Frames NeMo counts as valid for the samples pushed so far (final once the stream ends)."""
        return self.num_frames(self.n_samples)[0]

    def _take(self, n: int) -> torch.Tensor:
        cfg = self.cfg
        if n <= 0:
            return torch.zeros(0, cfg.n_fft)
        used = cfg.n_fft + cfg.hop_length * (n - 1)
        out = self.buffer[:used].unfold(0, cfg.n_fft, cfg.hop_length)
        self.buffer = self.buffer[n * cfg.hop_length :]
        self.frames_done += n
        return out

    def push(self, samples: torch.Tensor) -> torch.Tensor:
        """Append float32 samples [N]; returns the newly complete frames [F, n_fft]."""
        if samples.numel():
            self.buffer = torch.cat((self.buffer, self.emphasise(samples, self.last_sample)))
            self.last_sample = samples[-1:]
            self.n_samples += samples.numel()
        ready = 0
        if self.buffer.numel() >= self.cfg.n_fft:
            ready = (self.buffer.numel() - self.cfg.n_fft) // self.cfg.hop_length + 1
        return self._take(ready)

    def flush(self) -> torch.Tensor:
        """End of stream: the remaining frames up to NeMo's total count (zero-padded samples).

        Frames from index `valid_frames` on are zero-masked by NeMo; the caller zeroes their features.
        """
        cfg = self.cfg
        if self.n_samples == 0:  # no audio at all: nothing to transcribe
            return torch.zeros(0, cfg.n_fft)
        need = self.num_frames(self.n_samples)[1] - self.frames_done
        total = cfg.n_fft + cfg.hop_length * (need - 1)
        self.buffer = nn.functional.pad(self.buffer, (0, max(0, total - self.buffer.numel())))
        return self._take(need)
