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

from .device import padded_size, to_device
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
        """Emphasised sample frames [..., n_fft] -> log-mel [..., n_mels]. On a GPU, frames [F, n_fft]
        are padded to a fixed count first: cuFFT and cuBLAS make a plan per new shape, which costs
        milliseconds, and a step's frame count is new at almost every step."""
        cfg, n = self.cfg, frames.size(0)
        if frames.is_cuda and frames.dim() == 2 and padded_size(n) != n:
            frames = torch.cat((frames, frames.new_zeros(padded_size(n) - n, frames.size(1))))
        spec = torch.view_as_real(torch.fft.rfft(frames * self._padded_window(), n=cfg.n_fft))
        mag = torch.sqrt(spec.pow(2).sum(-1))
        if cfg.mag_power != 1.0:
            mag = mag.pow(cfg.mag_power)
        return torch.log(torch.matmul(mag, self.fb.t()) + cfg.log_guard)[:n]

    def emphasise(self, samples: np.ndarray, previous: float | None = None) -> np.ndarray:
        """Pre-emphasis y[n] = x[n] - a * x[n-1] (float32, on the host); `previous` is the sample before
        `samples` (None: the first one is kept as it is)."""
        a = self.cfg.preemph
        if a == 0.0 or not samples.size:
            return samples
        a = np.float32(a)
        out = samples.copy()
        out[1:] -= a * samples[:-1]
        if previous is not None:
            out[0] -= a * previous
        return out

    def frames(self, segments: list[tuple[np.ndarray, int]]) -> torch.Tensor:
        """FeatureStream segments -> their frames [F, n_fft] where the features are computed. The
        samples cross to the device in one copy (pinned on CUDA, not blocking) with the frames'
        places, and frames are cut there: on the host they would weigh up to 3x the samples."""
        packed, total = self.pack(segments)
        if total == 0:
            return torch.zeros(0, self.cfg.n_fft, device=self.fb.device)
        packed = to_device(packed, self.fb.device)
        samples, rows = packed[: packed.numel() - total], packed[packed.numel() - total :].view(torch.int32)
        return samples.unfold(0, self.cfg.n_fft, self.cfg.hop_length).index_select(0, rows.long())

    def pack(self, segments: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
        """The host's part of `frames`: every segment's samples, each padded to whole hops so that
        every frame is a row of one strided view, then the frames' rows in that view (int32 bits);
        and the number of frames."""
        hop = self.cfg.hop_length
        counts = np.array([count for _, count in segments], dtype=np.int64)
        total = int(counts.sum())
        spans = np.array([-(-seg.size // hop) for seg, _ in segments], dtype=np.int64)  # in hops
        first = np.cumsum(spans) - spans
        rows = np.repeat(first, counts) + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        zeros = np.zeros(hop, np.float32)
        pieces = [part for (seg, _), span in zip(segments, spans.tolist()) for part in (seg, zeros[: span * hop - seg.size])]
        return np.concatenate((*pieces, rows.astype(np.int32).view(np.float32))), total

    def num_frames(self, n_samples: int) -> tuple[int, int]:
        """(valid frames, total frames incl. NeMo's zero-masked tail) for a whole utterance."""
        valid = n_samples // self.cfg.hop_length
        total = valid + 1
        if self.cfg.pad_to > 0 and total % self.cfg.pad_to:
            total += self.cfg.pad_to - total % self.cfg.pad_to
        return valid, total

    def forward(self, samples: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Whole utterance [N] (on the host) -> (features [valid, n_mels], valid frame count)."""
        stream = FeatureStream(self)
        frames = self.frames([stream.push(samples.numpy()), stream.flush()])
        valid = stream.valid_frames
        return self.mel(frames[:valid].to(self.fb.dtype)), valid


class FeatureStream:
    """Incremental framing of one stream, on the host: push samples, get back the emphasised samples
    that hold every newly complete frame (a segment), so that many streams' frames go through
    `LogMelFeatures.frames` and `mel` in one batch.
    """

    def __init__(self, features: LogMelFeatures):
        self.cfg = features.cfg
        self.emphasise = features.emphasise
        self.num_frames = features.num_frames
        self.buffer = np.zeros(self.cfg.n_fft // 2, np.float32)  # centred STFT: zero padding on the left
        self.last_sample: float | None = None
        self.n_samples = 0
        self.frames_done = 0

    @property
    def valid_frames(self) -> int:
        """Frames NeMo counts as valid for the samples pushed so far (final once the stream ends)."""
        return self.num_frames(self.n_samples)[0]

    def _take(self, n: int) -> tuple[np.ndarray, int]:
        """The next n frames as (segment, n): frame j of them is segment[j * hop : j * hop + n_fft]."""
        cfg = self.cfg
        if n <= 0:
            return np.zeros(0, np.float32), 0
        segment = self.buffer[: cfg.n_fft + cfg.hop_length * (n - 1)]
        self.buffer = self.buffer[n * cfg.hop_length :]
        self.frames_done += n
        return segment, n

    def push(self, samples: np.ndarray) -> tuple[np.ndarray, int]:
        """Append float32 samples [N]; returns the segment of the newly complete frames and their count."""
        if samples.size:
            self.buffer = np.concatenate((self.buffer, self.emphasise(samples, self.last_sample)))
            self.last_sample = samples[-1]
            self.n_samples += samples.size
        ready = 0
        if self.buffer.size >= self.cfg.n_fft:
            ready = (self.buffer.size - self.cfg.n_fft) // self.cfg.hop_length + 1
        return self._take(ready)

    def flush(self) -> tuple[np.ndarray, int]:
        """End of stream: the remaining frames up to NeMo's total count (zero-padded samples).

        Frames from index `valid_frames` on are zero-masked by NeMo; the caller zeroes their features.
        """
        cfg = self.cfg
        if self.n_samples == 0:  # no audio at all: nothing to transcribe
            return np.zeros(0, np.float32), 0
        need = self.num_frames(self.n_samples)[1] - self.frames_done
        total = cfg.n_fft + cfg.hop_length * (need - 1)
        self.buffer = np.pad(self.buffer, (0, max(0, total - self.buffer.size)))
        return self._take(need)
