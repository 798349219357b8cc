"""What every protocol reads and writes on the wire besides its message schema (schema.py):
audio payloads (PCM16, float32, G.711 mu-law / A-law), sample rates, and the JSON the server
sends (orjson), each failure mapped to a stable error code.

Float samples outside -1..1 (f32 bytes, `samples` lists) are clipped to -1..1, as a sound card
would: finite but huge values (3e38) would otherwise overflow the features to infinity.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ... import audio
from ..transport.codes import ProtocolError


def _mulaw_table() -> np.ndarray:
    """G.711 mu-law: the 256 codes as PCM16 values (codes are stored bit-inverted)."""
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (code >> 4) & 7, code & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.float32) / 32768.0


def _alaw_table() -> np.ndarray:
    """G.711 A-law: the 256 codes as PCM16 values (even bits are stored inverted)."""
    code = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (code >> 4) & 7, code & 0x0F
    shifted = ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, shifted)
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.float32) / 32768.0


MULAW, ALAW = _mulaw_table(), _alaw_table()


def _table_decoder(table: np.ndarray):
    return lambda data: table[np.frombuffer(data, np.uint8)]


def _clip(samples: np.ndarray) -> np.ndarray:
    if samples.size and (samples.max() > 1.0 or samples.min() < -1.0):
        samples = np.clip(samples, -1.0, 1.0)
    return samples


DECODERS = {  # encoding: (bytes per sample, decoder); only float samples can leave -1..1
    "pcm16": (2, audio.decode_pcm16),
    "f32": (4, lambda data: _clip(audio.decode_f32(data))),
    "mulaw": (1, _table_decoder(MULAW)),  # G.711, telephony (usually 8 kHz)
    "alaw": (1, _table_decoder(ALAW)),
}
ENCODINGS = tuple(DECODERS)


def decode_bytes(raw: bytes, encoding: str) -> np.ndarray:
    """Bytes in one of ENCODINGS (little-endian) -> float32 samples."""
    width, decode = DECODERS.get(encoding, (None, None))
    if decode is None:
        raise ProtocolError("invalid_field", f"'encoding' must be one of {', '.join(ENCODINGS)}")
    if len(raw) % width:
        raise ProtocolError(
            "invalid_audio_length", f"{encoding} audio needs a multiple of {width} bytes"
        )
    try:
        return decode(raw)
    except audio.AudioError:
        raise ProtocolError("invalid_samples", "audio contains NaN or infinite samples") from None


def decode_samples(samples: list[float]) -> np.ndarray:
    """A JSON list of numbers (typed by the message's schema) -> float32 samples (NaN/inf rejected)."""
    with np.errstate(over="ignore"):
        array = np.asarray(samples, np.float32)
    try:
        return _clip(audio.check_samples(array))
    except audio.AudioError:
        raise ProtocolError("invalid_samples", "audio contains NaN or infinite samples") from None


dumps = orjson.dumps  # (obj) -> bytes: the JSON the server sends (orjson itself: no call of ours per message)


def parse_sample_rate(value: Any, from_url: bool = False) -> int:
    """A JSON integer; in a URL query (text by nature) ASCII decimal digits. A string in
    JSON is refused like any other wrong type."""
    if from_url:
        value = decimal(value)
    try:
        return audio.check_rate(value)
    except audio.AudioError:
        raise ProtocolError(
            "invalid_config", f"'sample_rate' must be an integer from {audio.MIN_RATE} to {audio.MAX_RATE}"
        ) from None


def decimal(text: Any, max_digits: int = 9) -> int | None:
    """ASCII decimal digits (not '²', not Unicode digits, not thousands of them) -> int."""
    if isinstance(text, str) and 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None
