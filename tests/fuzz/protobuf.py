"""Protobuf written by hand, field by field, so that a hostile request can say anything the wire
format can: absurd numbers where a valid message has an int32, an enum value no proto names, a
known field with the wrong wire type, invalid UTF-8 in a string, a field number nobody defined.
Parsers keep the last value of a repeated scalar field, so a field appended to a valid message
overrides it."""
from __future__ import annotations

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


def varint(number: int) -> bytes:
    """Base-128 varint; a negative number as its 64-bit two's complement (as int32 fields write it)."""
    number &= (1 << 64) - 1
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    return bytes(out) + bytes([number])


def field(number: int, kind: int, value: int | bytes) -> bytes:
    """One field: a varint takes an int, a length-delimited field bytes, a fixed one its 8 or 4 bytes."""
    tag = varint(number << 3 | kind)
    if kind == VARINT:
        return tag + varint(value)
    if kind == LENGTH:
        return tag + varint(len(value)) + value
    return tag + value


def number(message_type, name: str) -> int:
    """The field number of `name` in a generated message class."""
    return message_type.DESCRIPTOR.fields_by_name[name].number
