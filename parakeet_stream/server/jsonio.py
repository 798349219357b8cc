"""JSON encoding for the hot path (orjson); see docs/protocol.md for the measurements."""
from __future__ import annotations

import json
from typing import Any

import orjson

from .codes import ProtocolError


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
