"""Audio files decoded block by block to float32 mono at 16 kHz, never whole in memory.

Containers are decoded by libsndfile (through soundfile): WAV (PCM, float, mu-law/A-law),
FLAC, Ogg Vorbis, Ogg Opus, MP3, and the rest of libsndfile's list (AIFF, CAF, W64, ...).
MP4/M4A (AAC) and WebM/Matroska are recognised and refused with a clear message: no decoder
for them is among our dependencies. Headerless audio (Deepgram's `encoding` parameter) is
decoded with the wire module's decoders. Channels are averaged; other rates are resampled
with state carried across blocks. Every method runs in a worker thread.
"""
from __future__ import annotations

import math
from typing import BinaryIO

import numpy as np
import soundfile as sf

from .... import audio
from ...streams.wire import DECODERS, decode_bytes
from ...transport.codes import ProtocolError

SUPPORTED = "wav, flac, ogg (vorbis, opus) or mp3"
# leading bytes of containers libsndfile cannot read, for a message better than "format not recognised"
REFUSED = (
    (4, b"ftyp", "MP4/M4A (AAC)"),
    (0, b"\x1aE\xdf\xa3", "WebM/Matroska"),
)


class AudioReader:
    """Reads `n` model-rate samples at a time from a seekable file object or path."""

    def __init__(self, file: BinaryIO | str, encoding: str | None = None, rate: int | None = None) -> None:
        """`encoding` (pcm16, mulaw, alaw, f32) and `rate` for headerless audio; None: a container."""
        self._raw = encoding
        if encoding is None:
            self._file = _open_container(file)
            self.rate, self.frames = self._file.samplerate, self._file.frames
        else:
            self._file = file
            self.rate = rate
            self.frames = _size(file) // DECODERS[encoding][0]
        if self.frames == 0:
            raise audio.AudioError(audio.NO_AUDIO)
        self._resampler = audio.StreamResampler(audio.check_rate(self.rate))
        self._done = False

    @property
    def duration(self) -> float:
        """Seconds of audio, from the header (MP3: libsndfile's count)."""
        return self.frames / self.rate

    def read(self, n: int) -> np.ndarray:
        """Up to about `n` samples at 16 kHz; an empty array once the audio has ended."""
        if self._done:
            return np.zeros(0, np.float32)
        frames = max(1, math.ceil(n * self.rate / audio.SAMPLE_RATE))
        block = self._read_raw(frames) if self._raw else self._read_container(frames)
        self._done = len(block) < frames
        return self._resampler.push(block, last=self._done)

    def close(self) -> None:
        if self._raw is None:
            self._file.close()

    def _read_container(self, frames: int) -> np.ndarray:
        """`frames` frames, fewer only at the end (a decoder may return less before it: Opus)."""
        parts, got = [], 0
        try:
            while got < frames and len(data := self._file.read(frames - got, dtype="float32", always_2d=True)):
                parts.append(data.mean(axis=1, dtype=np.float32))
                got += len(data)
        except (sf.LibsndfileError, RuntimeError) as exc:
            raise audio.AudioError(f"the audio cannot be decoded: {_reason(exc)}") from None
        try:
            return audio.check_samples(np.concatenate(parts) if parts else np.zeros(0, np.float32))
        except audio.AudioError as exc:
            raise audio.AudioError(f"the audio {exc}") from None

    def _read_raw(self, frames: int) -> np.ndarray:
        width = DECODERS[self._raw][0]
        data = self._file.read(frames * width)
        try:
            return decode_bytes(data, self._raw)
        except ProtocolError as exc:
            raise audio.AudioError(exc.message) from None


def _open_container(file: BinaryIO | str) -> sf.SoundFile:
    head = _head(file)
    if not head:
        raise audio.AudioError(audio.EMPTY)
    for offset, magic, name in REFUSED:
        if head[offset : offset + len(magic)] == magic:
            raise audio.AudioError(f"{name} audio is not supported: send {SUPPORTED}")
    try:
        return sf.SoundFile(file)
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise audio.AudioError(f"not an audio file parakeet-stream reads ({_reason(exc)}): send {SUPPORTED}") from None


def _head(file: BinaryIO | str) -> bytes:
    if isinstance(file, str):
        try:
            with open(file, "rb") as f:
                return f.read(16)
        except OSError as exc:
            raise audio.AudioError(exc.strerror or str(exc)) from None
    head = file.read(16)
    file.seek(0)
    return head


def _size(file: BinaryIO) -> int:
    size = file.seek(0, 2)
    file.seek(0)
    return size


def _reason(exc: Exception) -> str:
    """libsndfile's own words, without the file object's repr that soundfile puts in front."""
    return str(getattr(exc, "error_string", None) or exc).rstrip(".").lower()
