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


Segment = tuple[tuple[np.ndarray, ...], int]  # FeatureStream's: raw sample pieces, frames


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

    def frames(self, segments: list[Segment]) -> torch.Tensor:
        """FeatureStream segments -> their emphasised frames [F, n_fft] where the features are
        computed. The raw samples cross to the device in one copy (pinned on CUDA, not blocking)
        with the frames' places; pre-emphasis and the frames are made there: frames on the host
        would weigh up to 3x the samples."""
        packed, total = self.pack(segments)
        if total == 0:
            return torch.zeros(0, self.cfg.n_fft, device=self.fb.device)
        packed = to_device(packed, self.fb.device)
        x, rows = packed[: packed.numel() - total], packed[packed.numel() - total :].view(torch.int32)
        a = self.cfg.preemph
        if a:  # y[n] = x[n] - a x[n-1]: each segment's first sample follows its stream's previous one
            x = torch.cat((x[:1], x[1:] - a * x[:-1]))
        return x.unfold(0, self.cfg.n_fft, 1).index_select(0, rows.long())

    def pack(self, segments: list[Segment]) -> tuple[np.ndarray, int]:
        """The host's part of `frames`: every segment's raw samples end to end, then where each
        frame starts among them (int32 bits): segment k's frame j at its start + 1 + j * hop, a row
        of one stride-1 view. Returns (packed, number of frames)."""
        pieces, starts, counts, at = [], [], [], 0
        for parts, count in segments:
            if count:
                starts.append(at)
                counts.append(count)
                for piece in parts:
                    pieces.append(piece)
                    at += piece.size
        if not counts:
            return np.zeros(0, np.float32), 0
        counts = np.array(counts, np.int64)
        total = int(counts.sum())
        first = np.cumsum(counts) - counts
        rows = np.repeat(np.array(starts, np.int64) + 1 - first * self.cfg.hop_length, counts) + \
            np.arange(total) * self.cfg.hop_length
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
    """Incremental framing of one stream, on the host: push raw samples, get back the segment that
    holds every newly complete frame, so that many streams' frames go through
    `LogMelFeatures.frames` and `mel` in one batch. A segment is (pieces, frames): raw samples
    whose concatenation is the sample before the frames' first one (pre-emphasis reads it), then
    the samples their frames cover (at least n_fft + hop * (frames - 1) of them).
    """

    def __init__(self, features: LogMelFeatures):
        self.cfg = features.cfg
        self.num_frames = features.num_frames
        # the sample before the first frame not computed yet, then the samples from there on; at
        # the start: a zero (pre-emphasis keeps the first sample as it is) and the centred STFT's
        # n_fft // 2 zeros of padding
        self.raw = np.zeros(1 + self.cfg.n_fft // 2, np.float32)
        self.n_samples = 0
        self.frames_done = 0

    @property
    def valid_frames(self) -> int:
        """Frames NeMo counts as valid for the samples pushed so far (final once the stream ends)."""
        return self.num_frames(self.n_samples)[0]

    def push(self, samples: np.ndarray) -> Segment:
        """Append float32 samples [N]; returns the segment of the newly complete frames."""
        cfg, raw = self.cfg, self.raw
        have = raw.size - 1 + samples.size
        ready = (have - cfg.n_fft) // cfg.hop_length + 1 if have >= cfg.n_fft else 0
        self.n_samples += samples.size
        self.frames_done += ready
        keep = ready * cfg.hop_length  # where the sample before the next frame is, in raw + samples
        self.raw = samples[keep - raw.size :] if keep >= raw.size else np.concatenate((raw[keep:], samples))
        return ((raw, samples), ready) if ready else ((), 0)

    def flush(self) -> Segment:
        """End of stream: the remaining frames up to NeMo's total count (zero-padded samples).

        Frames from index `valid_frames` on are zero-masked by NeMo; the caller zeroes their features.
        """
        cfg = self.cfg
        if self.n_samples == 0:  # no audio at all: nothing to transcribe
            return (), 0
        need = self.num_frames(self.n_samples)[1] - self.frames_done
        pad = max(0, cfg.n_fft + cfg.hop_length * (need - 1) - (self.raw.size - 1))
        self.frames_done += need
        return (self.raw, self._silence(pad)), need

    def _silence(self, n: int) -> np.ndarray:
        """`n` raw samples that pre-emphasis turns into zeros after the last one: NeMo pads the
        emphasised signal (the STFT's centring), so each is a times the one before (float32, as
        `frames` multiplies: exactly zero after emphasis)."""
        factors = np.full(n + 1, self.cfg.preemph, np.float32)
        factors[0] = self.raw[-1]
        return np.multiply.accumulate(factors)[1:]  # float32 products in order, as a loop would make them
