"""A WAV header at the start of a call's audio, as NVIDIA's own clients send it.

`riva.client.AudioChunkFileIterator` (transcribe_file.py) and the offline examples send the
file's bytes, header included, and often leave `encoding` and `sample_rate_hertz` unset: the
header says what the audio is.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import RivaError

PCM, FLOAT, ALAW, MULAW, EXTENSIBLE = 1, 3, 6, 7, 0xFFFE
MAX_HEADER_BYTES = 65536  # metadata chunks before the samples, at most
ENCODINGS = {(PCM, 16): "pcm16", (FLOAT, 32): "f32", (ALAW, 8): "alaw", (MULAW, 8): "mulaw"}


@dataclass(frozen=True)
class WavHeader:
    encoding: str  # a server/streams/wire.py decoder name
    sample_rate: int
    channels: int
    offset: int  # where the samples start
    size: int  # bytes of samples the header announces (streamed files may announce more)


def is_wav(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def maybe_wav(data: bytes) -> bool:
    """`data` is the start of a WAV file, or too short to tell."""
    return is_wav(data) or (len(data) < 12 and b"RIFF".startswith(data[:4]) and b"WAVE".startswith(data[8:]))


def parse_wav(data: bytes) -> WavHeader | None:
    """The header of the RIFF/WAVE file `data` starts, or None while it is incomplete."""
    at, fmt = 12, None
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"data":
            if fmt is None:
                raise RivaError("invalid_config", "WAV audio: no 'fmt ' chunk before the 'data' chunk")
            return WavHeader(*fmt, offset=at + 8, size=size)
        if at + 8 + size > len(data):
            break
        if chunk == b"fmt ":
            fmt = _format(data[at + 8 : at + 8 + size])
        at += 8 + size + size % 2  # chunks are padded to an even size
    if len(data) > MAX_HEADER_BYTES:
        raise RivaError("invalid_config", f"WAV audio: no 'data' chunk in the first {MAX_HEADER_BYTES} bytes")
    return None


def _format(body: bytes) -> tuple[str, int, int]:
    if len(body) < 16:
        raise RivaError("invalid_config", "WAV audio: the 'fmt ' chunk is too short")
    tag, channels, rate = struct.unpack_from("<HHI", body)
    bits = struct.unpack_from("<H", body, 14)[0]
    if tag == EXTENSIBLE and len(body) >= 26:
        tag = struct.unpack_from("<H", body, 24)[0]  # the sub-format GUID starts with the tag
    encoding = ENCODINGS.get((tag, bits))
    if encoding is None:
        raise RivaError(
            "invalid_config", f"WAV audio: format {tag} with {bits}-bit samples is not supported "
            "(16-bit PCM, 32-bit float, 8-bit A-law or mu-law)"
        )
    return encoding, rate, channels
