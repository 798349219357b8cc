"""What every protocol reads off the wire: JSON (orjson on the hot path), audio payloads
(PCM16, float32, G.711 mu-law / A-law) and the numeric fields they declare, each failure
mapped to a stable error code.

Float samples outside -1..1 (f32 bytes, `samples` lists) are clipped to -1..1, as a sound card
would: finite but huge values (3e38) would otherwise overflow the features to infinity.
"""
from __future__ import annotations

import binascii
import json
from typing import Any

import numpy as np
import orjson

from .. import audio
from .codes import ProtocolError


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


def decode_base64(data: Any) -> bytes:
    if not isinstance(data, str):
        raise ProtocolError("invalid_field", "'data' must be a base64 string")
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_base64", "'data' is not valid base64") from None


def decode_bytes(raw: bytes, encoding: Any) -> np.ndarray:
    """Bytes in one of ENCODINGS (little-endian) -> float32 samples."""
    width, decode = DECODERS.get(encoding, (None, None)) if isinstance(encoding, str) else (None, None)
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


def decode_samples(samples: Any) -> np.ndarray:
    """A JSON list of numbers -> float32 samples (strings, nesting, NaN/inf rejected)."""
    try:
        array = np.asarray(samples) if isinstance(samples, list) else None
    except ValueError:  # ragged nesting
        array = None
    if array is None or array.ndim != 1 or (array.size and array.dtype.kind not in "fiu"):
        raise ProtocolError("invalid_field", "'samples' must be a flat list of numbers")
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    try:
        return _clip(audio.check_samples(array))
    except audio.AudioError:
        raise ProtocolError("invalid_samples", "audio contains NaN or infinite samples") from None


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def loads(data: bytes | str) -> Any:
    """Parse one message; raises ProtocolError(invalid_utf8 | invalid_json)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _loads_slow(data)


def _loads_slow(data: bytes | str) -> Any:
    # Error path only: tell bad UTF-8 from bad JSON, and accept the NaN/Infinity
    # literals Python's json module writes so that they are reported as bad samples.
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("invalid_utf8", "message is not valid UTF-8") from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_json", "message is not valid JSON") from None


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
