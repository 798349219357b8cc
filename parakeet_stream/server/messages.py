"""Native protocol: client messages parsed and validated, server messages built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import audio
from .codes import ProtocolError
from .pcm import ENCODINGS, decode_base64, decode_bytes, decode_samples

START_TYPES = ("start", "config")


@dataclass
class StreamConfig:
    """What a client declared about its audio (all optional; defaults = original protocol)."""

    sample_rate: int | None = None
    encoding: str | None = None
    lookahead: tuple[int, int] | None = None


@dataclass
class Start:
    config: StreamConfig


@dataclass
class Audio:
    samples: np.ndarray | None  # None: a bare final marker
    final: bool


@dataclass
class Close:
    pass


@dataclass
class Ping:
    pass


ClientMessage = Start | Audio | Close | Ping


def parse(obj: Any, encoding: str) -> ClientMessage:
    """One decoded JSON value -> a client message; `encoding` is the stream's default."""
    if not isinstance(obj, dict):
        raise ProtocolError("invalid_message", "a message must be a JSON object")
    kind = obj.get("type")
    if kind is None:
        raise ProtocolError("missing_field", "'type' is required")
    if kind == "audio":
        return parse_audio(obj, encoding)
    if kind == "close":
        return Close()
    if kind == "ping":
        return Ping()
    if kind in START_TYPES:
        return Start(parse_config(obj))
    raise ProtocolError("unknown_type", f"unknown message type {str(kind)[:40]!r}")


def parse_audio(obj: dict, encoding: str) -> Audio:
    final = obj.get("final", False)
    if not isinstance(final, bool):
        raise ProtocolError("invalid_field", "'final' must be a boolean")
    has_data, has_samples = obj.get("data") is not None, obj.get("samples") is not None
    if has_data and has_samples:
        raise ProtocolError("invalid_field", "send either 'data' or 'samples', not both")
    if has_samples:
        return Audio(decode_samples(obj["samples"]), final)
    if has_data:
        raw = decode_base64(obj["data"])
        return Audio(decode_bytes(raw, parse_encoding(obj.get("encoding") or encoding)), final)
    if not final:
        raise ProtocolError("missing_field", "audio needs 'data' or 'samples'")
    return Audio(None, True)


def parse_config(obj: dict, from_url: bool = False) -> StreamConfig:
    """Fields of a start/config message or (`from_url`) of WebSocket query parameters."""
    config = StreamConfig()
    if obj.get("sample_rate") is not None:
        config.sample_rate = parse_sample_rate(obj["sample_rate"], from_url)
    if obj.get("encoding") is not None:
        config.encoding = parse_encoding(obj["encoding"], "invalid_config")
    if obj.get("lookahead") is not None:
        config.lookahead = parse_lookahead(obj["lookahead"])
    return config


def parse_encoding(value: Any, code: str = "invalid_field") -> str:
    if value not in ENCODINGS:
        raise ProtocolError(code, f"'encoding' must be one of {', '.join(ENCODINGS)}")
    return value


def parse_sample_rate(value: Any, from_url: bool = False) -> int:
    """A JSON integer; in a URL query (text by nature) ASCII decimal digits. A string in
    JSON is refused like any other wrong type."""
    if from_url:
        value = _decimal(value)
    try:
        return audio.check_rate(value)
    except audio.AudioError:
        raise ProtocolError(
            "invalid_config", f"'sample_rate' must be an integer from {audio.MIN_RATE} to {audio.MAX_RATE}"
        ) from None


def parse_lookahead(value: Any) -> tuple[int, int]:
    """'L,R' or [L, R] -> (L, R): attention context frames left and right."""
    parts = [_decimal(p.strip()) for p in value.split(",")] if isinstance(value, str) else value
    if not isinstance(parts, list) or len(parts) != 2 or not all(_is_int(p) for p in parts):
        raise ProtocolError("invalid_config", "'lookahead' must look like \"70,1\" or [70, 1]")
    return int(parts[0]), int(parts[1])


def _decimal(text: Any, max_digits: int = 9) -> int | None:
    """ASCII decimal digits (not '²', not Unicode digits, not thousands of them) -> int."""
    if isinstance(text, str) and 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def queued(position: int, estimated_wait_s: float | None) -> dict:
    return {"type": "queued", "position": position, "estimated_wait_s": estimated_wait_s}


def error(code: str, message: str) -> dict:
    return {"type": "error", "code": code, "message": message}


def closed(reason: str) -> dict:
    return {"type": "closed", "reason": reason}


PONG = {"type": "pong"}
