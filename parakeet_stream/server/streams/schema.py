"""Client messages as types: each protocol declares its messages as msgspec Structs (a union
tagged on `type`), and a `Schema` decodes one message straight from its JSON text into them.

A value of another type than its field's is refused while parsing, so nothing of an unexpected
type, size or depth reaches a protocol: a field typed `str` never holds a list a thousand levels
deep, an echoed integer is bounded, a base64 field arrives as bytes. Unknown fields are skipped
without building objects. JSON nested deeper than the interpreter's recursion limit (about
1,000 levels, checked by msgspec) is refused as `invalid_json`.

A message that does not fit becomes an `InvalidField` with the error code its protocol
documents: `missing_field`, `unknown_type`, `invalid_message`, `invalid_base64`, or the code a
message type declares for a field (`codes`, by dotted path; default `invalid_field`). The text
is msgspec's, with the JSON path where it helps (e.g. "Expected `str`, got `int` - at
`$.audio`"), or a protocol's own hint for that path; it never quotes a value of the client's.
"""
from __future__ import annotations

import json
import re
from typing import ClassVar, Union

import msgspec

from ..transport.codes import ProtocolError

TOO_DEEP = "JSON nested too deeply"
_AT = re.compile(r"(.*) - at `\$\.?([^`]*)`\Z", re.S)  # msgspec's "<what> - at `$.<path>`"
_INDEX = re.compile(r"\[[^\]]*\]")


class InvalidField(ProtocolError):
    """A refused message: `path` is the field it concerns ("session.audio.input.format.rate"),
    None for the message as a whole."""

    def __init__(self, code: str, message: str, path: str | None = None) -> None:
        super().__init__(code, message)
        self.path = path


class Message(msgspec.Struct, tag_field="type"):
    """A client message; its `tag` is its `type`."""

    codes: ClassVar[dict[str, str]] = {}  # dotted field path -> the code of its mistakes


class _Tagged(msgspec.Struct):
    type: str | None = None


_TAGGED = msgspec.json.Decoder(_Tagged)


class Schema:
    """Decodes the messages of one protocol (`messages`: Message subclasses, or one Struct)."""

    def __init__(self, *messages: type[msgspec.Struct], unknown: str = "unknown message type",
                 hints: dict[str, str] | None = None) -> None:
        self.type = Union[messages] if len(messages) > 1 else messages[0]  # noqa: UP007 - a runtime union
        self._decoder = msgspec.json.Decoder(self.type)
        self._codes = {m.__struct_config__.tag: getattr(m, "codes", {}) for m in messages}
        self._unknown = unknown  # how a message of an unknown type is answered, before its name
        self._hints = hints or {}  # path -> a message of the protocol's own for mistakes there

    def decode(self, data: str | bytes) -> msgspec.Struct:
        """One message; raises InvalidField, or ProtocolError(invalid_json | invalid_utf8)."""
        try:
            return self._decoder.decode(data)
        except msgspec.ValidationError as exc:
            if "out of range" not in str(exc):  # 1e999: see _decode_lenient
                raise self._refusal(str(exc), _tag_of(data)) from None
        except (msgspec.DecodeError, UnicodeDecodeError):
            pass
        except RecursionError:
            raise ProtocolError("invalid_json", TOO_DEEP) from None
        return self._decode_lenient(data)

    def _decode_lenient(self, data: str | bytes) -> msgspec.Struct:
        """Error path only: JSON that msgspec refuses but Python's json reads (the NaN and Infinity
        literals it writes, 1e999) is validated as values, so that such samples are reported as
        `invalid_samples`, a sample rate of 1e999 as that field's mistake; anything else is told
        apart as bad UTF-8 or bad JSON."""
        obj = loads_lenient(data)
        try:
            return msgspec.convert(obj, self.type)
        except msgspec.ValidationError as exc:
            tag = obj.get("type") if isinstance(obj, dict) else None
            raise self._refusal(str(exc), tag if isinstance(tag, str) else None) from None

    def _refusal(self, error: str, tag: str | None) -> ProtocolError:
        match = _AT.match(error)
        what, path = (match[1], match[2]) if match else (error, "")
        if what.startswith("Object missing required field"):
            path = ".".join(filter(None, (path, what.split("`")[1])))
            if path != "type":
                return self._invalid(tag, path, "missing_field", f"'{path}' is required")
        if path == "type":
            return self._untyped(tag)
        if not path and what.startswith("Expected `object`"):
            return InvalidField("invalid_message", "a message must be a JSON object")
        default = "invalid_base64" if what.startswith("Invalid base64") else "invalid_field"
        return self._invalid(tag, path, default, f"{_without_value(what)} - at `$.{path}`")

    def _invalid(self, tag: str | None, path: str, default: str, message: str) -> InvalidField:
        codes = self._codes.get(tag, {})
        key = _INDEX.sub("", path)
        while key and key not in codes:
            key = key.rpartition(".")[0]
        return InvalidField(codes.get(key, default), self._hints.get(path, message), path)

    def _untyped(self, tag: str | None) -> InvalidField:
        if tag is None:
            return InvalidField("missing_field", "'type' is required (a string)", "type")
        return InvalidField("unknown_type", f"{self._unknown} {tag[:40]!r}", "type")


def _tag_of(data: str | bytes) -> str | None:
    try:
        return _TAGGED.decode(data).type
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return None


def _without_value(what: str) -> str:
    """msgspec quotes the value of an unknown tag or enum member: the client's, not ours to echo."""
    return re.sub(r"\AInvalid (enum )?value .*", r"Invalid \1value", what, flags=re.S)


def loads_lenient(data: str | bytes) -> object:
    """Python's json, which reads NaN, Infinity and 1e999; raises ProtocolError(invalid_utf8 |
    invalid_json). A lone surrogate ("\\ud800") is refused as msgspec and orjson refuse it: it
    could not be sent back."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("invalid_utf8", "message is not valid UTF-8") from None
    try:
        obj = json.loads(data)
        msgspec.json.encode(obj)
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        raise ProtocolError("invalid_json", "message is not valid JSON") from None
    return obj
