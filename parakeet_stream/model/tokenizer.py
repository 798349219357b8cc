"""SentencePiece tokenizer of an RNN-T model and a per-stream incremental detokenizer."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import sentencepiece as spm

SPACE = "\u2581"  # sentencepiece's word-boundary marker '▁'
EOU_PIECE = "<EOU>"
# A language tag such as <en-US>, which a multilingual model (nemotron-3.5-asr) writes after a
# sentence; with the white space before it, NeMo's default strip_lang_tags pattern.
_TAG = r"<[a-z]{2}-[A-Z]{2}>"
LANGUAGE_TAG = re.compile(r"\s*" + _TAG)

# ModelProto.SentencePiece.Type values and NormalizerSpec field numbers
# (sentencepiece_model.proto).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6
_ADD_DUMMY_PREFIX, _REMOVE_EXTRA_WHITESPACES = 3, 4


class _Piece(NamedTuple):
    text: str = ""  # surface, '▁' shown as ' '
    byte: int = -1  # value of a byte-fallback piece such as <0xE2>
    lead_space: bool = False  # starts with '▁', dropped at the start of a transcript
    special: bool = False  # control, user-defined (<EOU>) or blank: never text


class Tokenizer:
    """A sentencepiece model plus the RNN-T blank, which is the id after the last piece."""

    def __init__(self, model_path: str | Path | None = None, proto: bytes | None = None) -> None:
        """From a .model file, or from its bytes (`proto`, as `Tokenizer.proto` gives them)."""
        if proto is not None:
            self._sp = spm.SentencePieceProcessor(model_proto=proto)
        else:
            self._sp = spm.SentencePieceProcessor(model_file=str(model_path))
        types, norm = _read_model_proto(self.proto)
        if len(types) != self._sp.get_piece_size():
            raise ValueError(f"cannot read the piece types of {model_path or 'the tokenizer'}")
        # Leading-space rules of sentencepiece's decoder, from the normalizer spec.
        remove_extra_whitespaces = norm.get(_REMOVE_EXTRA_WHITESPACES, 1) == 1
        self._strip_leading = remove_extra_whitespaces or norm.get(_ADD_DUMMY_PREFIX, 1) == 1
        self._strip_once = not remove_extra_whitespaces
        # language tag pieces are never text either, whatever their type: the language is in the ids
        self._language_tags = {i: p[1:-1] for i in range(len(types)) if re.fullmatch(_TAG, p := self._sp.id_to_piece(i))}
        self._special_ids = frozenset(
            i for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED) or i in self._language_tags
        )
        self._pieces = [self._describe(i, t) for i, t in enumerate(types)]
        self._pieces.append(_Piece(special=True))  # blank
        eou = self._sp.piece_to_id(EOU_PIECE)
        self._eou_id = eou if self._sp.id_to_piece(eou) == EOU_PIECE else None

    @property
    def proto(self) -> bytes:
        """The sentencepiece model, serialized (another process rebuilds the tokenizer from it)."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        """Number of sentencepiece pieces (the blank is not one of them)."""
        return len(self._pieces) - 1

    @property
    def blank_id(self) -> int:
        return len(self._pieces) - 1

    @property
    def eou_id(self) -> int | None:
        return self._eou_id

    @property
    def unk_id(self) -> int:
        """The piece for text the model cannot write (byte-fallback models never produce it)."""
        return self._sp.unk_id()

    @property
    def special_ids(self) -> frozenset[int]:
        """Control and user-defined pieces (<s>, <EOU>, <EOB>) and language tags: never text. Excludes blank."""
        return self._special_ids

    @property
    def language_tags(self) -> dict[int, str]:
        """Language tag pieces: id -> language ('en-US' for <en-US>); none in most models."""
        return self._language_tags

    def piece(self, token_id: int) -> str:
        self._info(token_id)
        return "<blank>" if token_id == self.blank_id else self._sp.id_to_piece(token_id)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """Whole-sequence decode with special ids and blanks dropped."""
        return self._sp.decode([i for i in ids if not self._info(i).special])

    def _info(self, token_id: int) -> _Piece:
        if not 0 <= token_id < len(self._pieces):
            raise ValueError(f"token id {token_id} is outside 0..{self.blank_id}")
        return self._pieces[token_id]

    def _describe(self, token_id: int, piece_type: int) -> _Piece:
        piece = self._sp.id_to_piece(token_id)
        if token_id in self._special_ids:
            return _Piece(special=True)
        if piece_type == _BYTE:
            return _Piece(byte=int(piece[3:5], 16))
        if piece_type == _UNKNOWN:
            return _Piece(text=self._sp.decode([token_id]))
        return _Piece(text=piece.replace(SPACE, " "), lead_space=piece.startswith(SPACE))


def split_language_tags(text: str) -> tuple[str, list[str]]:
    """Text as NeMo's strip_lang_tags leaves it (every tag and the white space before it removed,
    then the ends stripped) and the tags' languages in order: "Hi.<en-US> Yo" -> ("Hi. Yo", ["en-US"])."""
    return LANGUAGE_TAG.sub("", text).strip(), [m.group().strip()[1:-1] for m in LANGUAGE_TAG.finditer(text)]


class IncrementalDetokenizer:
    """Turns one stream's token ids into text deltas, in work proportional to the new ids.

    The concatenated deltas (plus `flush()` at the end of the stream) equal
    `Tokenizer.decode()` of all ids, for any way the ids are split into pushes.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._info = tokenizer._info
        self._strip_leading = tokenizer._strip_leading
        self._strip_once = tokenizer._strip_once
        self._stripped = False  # a leading '▁' was already dropped
        self._pending = bytearray()  # byte-fallback bytes of an incomplete character
        self._parts: list[str] = []  # the transcript, one entry per push

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def push(self, ids: Iterable[int]) -> str:
        """Add token ids; return only the text they complete."""
        start = len(self._parts)
        for token_id in ids:
            piece = self._info(token_id)
            if piece.special:
                continue
            if piece.byte >= 0:
                self._pending.append(piece.byte)
                self._drain_bytes(final=False)
            else:
                self._drain_bytes(final=True)
                self._append(self._surface(piece))
        return self._collect(start)

    def flush(self) -> str:
        """End of stream: emit an unfinished byte sequence as U+FFFD, as sentencepiece does."""
        start = len(self._parts)
        self._drain_bytes(final=True)
        return self._collect(start)

    def _surface(self, piece: _Piece) -> str:
        # sentencepiece drops the '▁' of the first word; with remove_extra_whitespaces
        # it keeps dropping them until some text has been produced.
        at_start = self._strip_leading and not self._parts and not self._stripped
        if not (at_start and piece.lead_space):
            return piece.text
        self._stripped = self._strip_once
        return piece.text[1:]

    def _drain_bytes(self, final: bool) -> None:
        """Emit complete UTF-8 characters; invalid bytes become U+FFFD one byte at a time."""
        buf, i = self._pending, 0
        while i < len(buf):
            size = _utf8_size(buf[i])
            if i + size > len(buf) and not final:
                break
            try:
                self._append(bytes(buf[i : i + size]).decode("utf-8"))
                i += size
            except UnicodeDecodeError:
                self._append("\ufffd")
                i += 1
        del buf[:i]

    def _append(self, text: str) -> None:
        if text:
            self._parts.append(text)

    def _collect(self, start: int) -> str:
        delta = "".join(self._parts[start:])
        self._parts[start:] = [delta] if delta else []
        return delta


def _utf8_size(lead: int) -> int:
    """Length of the UTF-8 sequence a lead byte announces (1 for invalid leads)."""
    if 0xC0 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF7:
        return 4
    return 1


def _read_model_proto(data: bytes) -> tuple[list[int], dict[int, int]]:
    """Piece types and normalizer flags from a serialized ModelProto.

    The sentencepiece Python API cannot tell user-defined pieces (<EOU>) apart and
    protobuf is not a dependency, so the two fields needed are read directly.
    """
    types: list[int] = []
    normalizer: dict[int, int] = {}
    for field, value in _proto_fields(data):
        if field == 1:  # pieces
            piece_type = [v for f, v in _proto_fields(value) if f == 3]
            types.append(piece_type[-1] if piece_type else _NORMAL)
        elif field == 3:  # normalizer_spec
            normalizer = {f: v for f, v in _proto_fields(value) if isinstance(v, int)}
    return types, normalizer


def _proto_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs of one protobuf message, without nesting."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i : i + size], i + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield key >> 3, value


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if byte < 0x80:
            return value, i
