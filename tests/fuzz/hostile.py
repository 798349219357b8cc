"""Hypothesis strategies for what an attacker sends: any JSON value (integers beyond 64 bits,
NaN, lone surrogates, nesting up to 1,500 levels), a door's valid messages mutated (a field
replaced, dropped, retyped, added), JSON text corrupted, random bytes, malformed WebSocket frames,
oversized messages, and the order, pace and end of a connection (probe, reset, close, silence)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import quote

from hypothesis import strategies as st

from .clients import RawFrame

MAX_MESSAGE = 65536  # the fuzzed server's --max-message-bytes
MAX_UPLOAD = 2 << 20  # and its --max-upload-mb (2), in bytes
ENDINGS = ("probe", "probe", "probe", "reset", "close", "silent")
# frames RFC 6455 forbids: unmasked, reserved bits, a reserved opcode, a 256-byte ping
BAD_FRAMES = (b"\x82\x02\x01\x00", b"\xf2\x80abcd", b"\x8f\x80abcd", b"\x89\xfe\x01\x00abcd" + b"\x00" * 256)


@dataclass(frozen=True)
class Deep:
    """JSON nested `levels` deep, spliced where a value goes."""

    levels: int
    brackets: str = "[]"

    def text(self) -> str:
        if self.brackets == "[]":
            return "[" * self.levels + "]" * self.levels
        return '{"a":' * self.levels + "0" + "}" * self.levels


@dataclass(frozen=True)
class Attack:
    """One hostile connection: its handshake query, what it sends, how fast, how it ends."""

    frames: list[str | bytes] = field(default_factory=list)
    query: str = ""
    pace: float = 0.0  # seconds between frames
    ending: str = "probe"  # probe: read to its answer; reset; close; silent: stop reading, then leave
    copies: int = 1  # request/response doors: the same request made this many times at once


def to_json(value: object) -> str:
    """JSON text of any value the strategies make (json.dumps escapes lone surrogates, writes NaN)."""
    if isinstance(value, Deep):
        return value.text()
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**200), 2**200), st.floats(), st.text(max_size=40),
    st.sampled_from(["", "²", "16000", "١٦٠٠٠", "pcm16", "70,1", "\ud800", "x" * 5000, 10**400]),
)
VALUES = st.one_of(
    st.recursive(LEAVES, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                 max_leaves=8),
    st.builds(Deep, st.integers(1, 1500), st.sampled_from(["[]", "{}"])),
)


@st.composite
def mutated(draw, messages: st.SearchStrategy[dict]) -> dict:
    """A valid message with one or two fields replaced, dropped, retyped or added."""
    message = dict(draw(messages))
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from([*message, "type", "x", "event_id"]))
        if draw(st.booleans()) and key in message:
            del message[key]
        else:
            message[key] = draw(VALUES)
    return message


@st.composite
def corrupted(draw, messages: st.SearchStrategy[dict]) -> str:
    """The JSON text of a valid message, cut, spliced or doubled."""
    text = to_json(draw(messages))
    at = draw(st.integers(0, len(text)))
    how = draw(st.sampled_from(["cut", "insert", "double", "nan"]))
    if how == "cut":
        return text[:at]
    if how == "insert":
        return text[:at] + draw(st.sampled_from(["\x00", "{", "]", '"', "\\", "NaN", ",", "\ud800"])) + text[at:]
    if how == "nan":
        return text.replace(":", ": NaN, \"y\":", 1)
    return text + text


def frames(messages: st.SearchStrategy[dict], binary: st.SearchStrategy[bytes] | None = None,
           raw: bool = False) -> st.SearchStrategy[str | bytes]:
    """One frame: mostly messages (valid or mutated), else corrupted text, any JSON value,
    random bytes, an oversized message; `binary`: the door's binary frames; `raw`: malformed
    WebSocket frames too."""
    options = [messages.map(to_json)] * 3 + [mutated(messages).map(to_json)] * 3 + [
        corrupted(messages), VALUES.map(to_json), st.binary(max_size=300),
        st.integers(1, 64).map(lambda extra: '{"type":"' + "x" * (MAX_MESSAGE + extra) + '"}'),
    ]
    if binary is not None:
        options += [binary] * 2
    if raw:  # rarer: they end the connection
        options.append(st.one_of(st.sampled_from(BAD_FRAMES), st.binary(min_size=1, max_size=64)).map(RawFrame))
    return st.one_of(options)


def queries(base: str, keys: list[str]) -> st.SearchStrategy[str]:
    """The door's own query, or with hostile parameters added (old and new names, odd values)."""
    values = st.sampled_from(["²", "16000", "1" * 3000, "%ff", "pcm16", "linear16", "70,1", "[", "", "true", "-1"])
    extra = st.lists(st.tuples(st.sampled_from(keys), values), max_size=3).map(
        lambda pairs: "&".join(f"{k}={quote(v, safe='%')}" for k, v in pairs)
    )
    return st.one_of(st.just(base), st.just(base), extra.map(lambda e: "&".join(filter(None, (base, e)))))


def attacks(frame: st.SearchStrategy[str | bytes], query: st.SearchStrategy[str] = st.just("")
            ) -> st.SearchStrategy[Attack]:
    return st.builds(
        Attack, frames=st.lists(frame, min_size=1, max_size=10), query=query,
        pace=st.sampled_from([0.0, 0.0, 0.002, 0.02]), ending=st.sampled_from(ENDINGS),
    )


def audio_pieces(audio: bytes, width: int) -> st.SearchStrategy[bytes]:
    """Slices of real audio bytes (any length, odd ones included)."""
    return st.tuples(st.integers(0, len(audio)), st.integers(0, 16000 * width)).map(
        lambda ends: audio[ends[0] : ends[0] + ends[1]]
    )

