"""Audio input: file reading, resampling to the model rate, wire-format decoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16000
MIN_RATE = 4000
MAX_RATE = 192000
QUALITY = "HQ"
# the same words from every reader (read_audio, uploads, parakeet-transcribe, the examples)
EMPTY = "the file is empty"
NO_AUDIO = "the file contains no audio"  # a header without samples


class AudioError(ValueError):
    """Audio that cannot be used: unreadable file, bad encoding, bad samples or rate."""


def check_rate(rate: int) -> int:
    """Validate a client-declared sample rate and return it as an int."""
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)):
        raise AudioError(f"sample rate must be an integer, got {rate!r}")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"sample rate {rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz")
    return int(rate)


def check_samples(samples: object) -> np.ndarray:
    """Return `samples` as a float32 1-D array; reject other shapes and NaN/inf."""
    try:
        array = np.asarray(samples, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise AudioError(f"samples are not numbers: {exc}") from None
    if array.ndim != 1:
        raise AudioError(f"samples must be a 1-D sequence, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise AudioError("samples contain NaN or infinity")
    return array


def decode_pcm16(data: bytes) -> np.ndarray:
    """Little-endian signed 16-bit PCM -> float32 in [-1, 1)."""
    if len(data) % 2:
        raise AudioError(f"pcm16 audio has an odd byte count ({len(data)})")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def decode_f32(data: bytes) -> np.ndarray:
    """Little-endian float32 samples -> float32 array (finite values only)."""
    if len(data) % 4:
        raise AudioError(f"f32 audio byte count {len(data)} is not a multiple of 4")
    return check_samples(np.frombuffer(data, dtype="<f4").astype(np.float32))


def resample(samples: np.ndarray, from_rate: int, to_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Resample a whole mono signal."""
    samples = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return samples
    return soxr.resample(samples, from_rate, to_rate, quality=QUALITY)


def check_file(path: str | Path) -> Path:
    """`path` as a Path when it names a file; else AudioError saying what it names."""
    path = Path(path)
    if path.is_dir():
        raise AudioError(f"cannot read audio file {path}: it is a directory (pass the files in it, e.g. {path}/*.wav)")
    if not path.is_file():
        raise AudioError(f"cannot read audio file {path}: no such file")
    return path


def read_file(path: str | Path, dtype: str = "float32") -> tuple[np.ndarray, int]:
    """An audio file's frames as stored (frames x channels, `dtype`) and its rate; AudioError says
    in one line, naming the file, why it cannot be used."""
    path = check_file(path)
    if path.stat().st_size == 0:  # libsndfile would say "format not recognised"
        raise AudioError(f"cannot read audio file {path}: {EMPTY}")
    try:
        data, rate = sf.read(path, dtype=dtype, always_2d=True)
    except sf.LibsndfileError as exc:  # (its message repeats the path)
        raise AudioError(f"cannot read audio file {path}: {exc.error_string.rstrip('.').lower()}") from None
    except (RuntimeError, OSError) as exc:
        raise AudioError(f"cannot read audio file {path}: {exc}") from None
    if data.shape[0] == 0:
        raise AudioError(f"cannot read audio file {path}: {NO_AUDIO}")
    return data, rate


def read_audio(path: str | Path) -> np.ndarray:
    """Read an audio file as float32 mono at 16 kHz (channels are averaged)."""
    data, rate = read_file(path)
    try:
        mono = check_samples(data.mean(axis=1, dtype=np.float32))
    except AudioError as exc:
        raise AudioError(f"audio file {path}: {exc}") from None
    return resample(mono, rate)


class StreamResampler:
    """Resamples packets of one stream from its declared rate to 16 kHz.

    The filter state carries across packets, so the output over a stream equals
    `resample()` of the whole signal.
    """

    def __init__(self, rate: int) -> None:
        self.rate = check_rate(rate)
        self._stream = None
        if self.rate != SAMPLE_RATE:
            self._stream = soxr.ResampleStream(
                self.rate, SAMPLE_RATE, 1, dtype="float32", quality=QUALITY
            )
        self._finished = False

    def push(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample one packet; `last=True` flushes the filter tail and ends the stream."""
        if self._finished:
            raise AudioError("audio pushed after the last packet of the stream")
        self._finished = last
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples, last=last)
