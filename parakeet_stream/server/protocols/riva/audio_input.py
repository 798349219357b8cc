"""One call's audio bytes -> float32 samples at the model rate.

The format is settled by the first bytes: a WAV header if they start with one (its format wins
over the config's; it may span several messages), else the config's encoding and rate. Riva's
audio is a byte stream cut into messages anywhere: a sample split across two messages is carried
over, never refused.
"""
from __future__ import annotations

import numpy as np

from .... import audio
from ...streams.wire import DECODERS, decode_bytes
from ...transport.codes import ProtocolError
from .errors import RivaError
from .options import Options
from .wav import is_wav, maybe_wav, parse_wav

EMPTY = np.zeros(0, np.float32)
UNKNOWN_SIZE = 0xFFFFFFFF  # what a WAV writer that does not know the length puts (some put 0)


class AudioInput:
    def __init__(self, options: Options) -> None:
        self._options = options
        self._encoding: str | None = None
        self._width = 1
        self._resampler: audio.StreamResampler | None = None
        self._carry = b""
        self._head = b""  # the first bytes, until they tell whether a WAV header comes
        self._left: int | None = None  # WAV: bytes of samples the header announced, not yet read

    def decode(self, data: bytes) -> np.ndarray:
        if self._resampler is None:
            self._head += data
            data = self._start(last=False)
            if data is None:
                return EMPTY
        if self._left is not None:
            data, self._left = data[: self._left], max(0, self._left - len(data))
        data = self._carry + data
        whole = len(data) - len(data) % self._width
        self._carry = data[whole:]
        try:
            samples = decode_bytes(data[:whole], self._encoding)
        except ProtocolError as exc:
            raise RivaError("invalid_message", exc.message) from None
        return self._resampler.push(samples)

    def finish(self) -> np.ndarray:
        """What is left at the end of the audio: the resampler's tail (a trailing half sample is
        dropped). Empty for a call that sent no audio."""
        if self._resampler is None:
            if not self._head:
                return EMPTY
            head = self.decode(self._start(last=True))
            return np.concatenate([head, self._resampler.push(EMPTY, last=True)])
        return self._resampler.push(EMPTY, last=True)

    def _start(self, last: bool) -> bytes | None:
        """Settle the format from the first bytes (None: a WAV header is still incomplete);
        returns the audio bytes after any header."""
        data, encoding, rate = self._head, self._options.encoding or "pcm16", self._options.sample_rate
        if is_wav(data):
            header = parse_wav(data)
            if header is None:  # it goes on in the next message
                if last:
                    raise RivaError("invalid_config", "WAV audio: the header ends before the 'data' chunk")
                return None
            if header.channels != 1:
                raise RivaError("invalid_config", f"WAV audio has {header.channels} channels: only mono is supported")
            encoding, rate, data = header.encoding, header.sample_rate, data[header.offset :]
            self._left = header.size if 0 < header.size < UNKNOWN_SIZE else None
        elif maybe_wav(data) and not last:
            return None  # too short to tell
        if rate is None:
            raise RivaError("invalid_config", "sample_rate_hertz is required for audio without a WAV header")
        try:
            self._resampler = audio.StreamResampler(rate)
        except audio.AudioError as exc:
            raise RivaError("invalid_config", f"sample rate: {exc}") from None
        self._encoding, self._width = encoding, DECODERS[encoding][0]
        self._head = b""
        return data
