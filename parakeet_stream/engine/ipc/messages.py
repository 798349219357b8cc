"""What an engine process and its clients (server workers) say to each other over one local
socket (service.py, engine_client.py): msgpack frames, each a 4-byte length then one tagged message.

Client -> engine: Open (a stream; answered by Opened or Refused), Audio (packets of many
streams), Final, Cancel, Ask (a figure; answered by Answer). Engine -> client: Hello (the
model's facts, first), Opened, Refused, News (a stream's queue position, and results the engine built: errors), Rows (a
step's results for the client's streams, as columns; result_rows.py), Answer.
Audio travels as raw float32 bytes at the engine's rate: 80 ms of a stream is about 5 KiB and
costs a copy, not a parse.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Union

import msgspec
import numpy as np

from ...model.precision_check import PrecisionChoice
from ..results import StreamResult

HEADER = struct.Struct("<I")
MAX_FRAME = 64 << 20  # a frame larger than this is a broken peer, not a message
# bytes one read may take: read into a buffer kept for it (recv(1 MiB) would allocate a fresh
# 1 MiB object, memory the kernel maps and unmaps, per read: 14 us for a 5 KiB message)
READ_BYTES = 1 << 20


class Open(msgspec.Struct, tag=1, array_like=True):
    ref: int
    lookahead: tuple[int, int] | None
    bulk: bool
    phrases: list[tuple[str, float, bool]]  # (text, weight, hint)
    language: str | None = None
    diarize: bool = False  # its results come as News (the engine holds them for the diarizer), not as Rows


class Audio(msgspec.Struct, tag=2, array_like=True):
    """Packets of one or more streams: stream `sids[i]`'s are the next `sizes[i]` samples."""
    sids: list[int]
    sizes: list[int]
    samples: bytes  # float32, native byte order, every packet one after the other


class Final(msgspec.Struct, tag=3, array_like=True):
    sid: int


class Cancel(msgspec.Struct, tag=4, array_like=True):
    sid: int


class Ask(msgspec.Struct, tag=5, array_like=True):
    ref: int
    what: str  # stats | totals | latency | healthy


class Hello(msgspec.Struct, tag=10, array_like=True):
    sample_rate: int
    frame_seconds: float
    tokenizer: bytes | None  # the sentencepiece model
    lookahead_modes: list[tuple[int, int]]
    default_lookahead: tuple[int, int]
    bulk_lookahead: tuple[int, int]
    chunk_seconds: list[tuple[tuple[int, int], float]]
    ready_samples: list[tuple[tuple[int, int], int, int]]  # per mode: (mode, first, each more)
    precision: PrecisionChoice
    start_seconds: float
    cuda_graphs: int
    start_phases: dict[str, float] = {}
    languages: list[str] = []
    default_language: str | None = None
    endpoint_frames: int = 1  # ResultBuilder's, for the results a client builds from Rows
    speakers: int = 0  # the diarizer's (0: none)
    speaker_frame_seconds: float = 0.0


class Opened(msgspec.Struct, tag=11, array_like=True):
    ref: int
    sid: int
    position: int  # in the waiting queue (0: admitted)


class Refused(msgspec.Struct, tag=12, array_like=True):
    ref: int
    code: str  # queue_full | invalid_phrases | bad_lookahead | unsupported_language | ...
    message: str


class News(msgspec.Struct, tag=13, array_like=True):
    sid: int
    position: int
    results: list[StreamResult]


class Rows(msgspec.Struct, tag=15, array_like=True):
    """A step's results for the client's streams, before their text (result_rows.py): each field
    one column's bytes in native byte order."""
    sids: bytes
    frames: bytes
    final: bytes
    latency: bytes
    eou: bytes
    counts: bytes
    ids: bytes
    at: bytes
    probs: bytes


class Answer(msgspec.Struct, tag=14, array_like=True):
    ref: int
    value: Any


ToEngine = Union[Open, Audio, Final, Cancel, Ask]
FromEngine = Union[Hello, Opened, Refused, News, Rows, Answer]


class Framer:
    """Encodes messages into frames and splits received bytes into messages of one direction."""

    def __init__(self, incoming: type) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_encode_array)
        self._decoder = msgspec.msgpack.Decoder(incoming, dec_hook=_decode_array)
        self._buffer = bytearray()
        self._read = memoryview(bytearray(READ_BYTES))

    def receive(self, sock: socket.socket) -> list | None:
        """The messages completed by one read from `sock`, in order; None once the peer has closed."""
        size = sock.recv_into(self._read)
        return self.feed(self._read[:size]) if size else None

    def frame(self, message: msgspec.Struct) -> bytes:
        body = self._encoder.encode(message)
        return HEADER.pack(len(body)) + body

    def feed(self, data: bytes | memoryview) -> list:
        """The messages completed by `data` (bytes read from the socket), in order. The whole frames
        of a read that starts on a frame are decoded where they were read (the decoder copies what
        it keeps): only a frame split across reads is gathered in the buffer."""
        if self._buffer:
            self._buffer += data
            data = self._buffer
        out, start = [], 0
        with memoryview(data) as view:
            while len(view) - start >= HEADER.size:
                (size,) = HEADER.unpack_from(view, start)
                if size > MAX_FRAME:
                    raise ValueError(f"a frame of {size} bytes")
                end = start + HEADER.size + size
                if end > len(view):
                    break
                out.append(self._decoder.decode(view[start + HEADER.size:end]))
                start = end
            if data is not self._buffer and start < len(view):
                self._buffer += view[start:]
        if data is self._buffer:
            del self._buffer[:start]
        return out


def _encode_array(value: Any) -> Any:
    """A result's speaker probabilities (StreamResult.speakers): shape, then float32 bytes."""
    if isinstance(value, np.ndarray):
        return (list(value.shape), np.ascontiguousarray(value, np.float32).tobytes())
    raise NotImplementedError(f"no msgpack form for {type(value).__name__}")


def _decode_array(kind: type, value: Any) -> Any:
    if kind is np.ndarray:
        shape, data = value
        return np.frombuffer(data, np.float32).reshape(shape)
    raise NotImplementedError(f"no msgpack form for {kind.__name__}")
