"""Hypothesis strategies for hostile calls on the gRPC (NVIDIA Riva) door: StreamingRecognize
with malformed, oversized or wrongly typed configs (any encoding number, rate, channel count or
language, absurd field values, huge speech_contexts, unknown fields), audio before the config,
the config twice, cut or random protobuf, messages over --max-message-bytes, ended by a
half-close or cancelled mid-stream, several calls at once; Recognize with bad audio (odd
lengths, broken WAV headers, noise); GetRivaSpeechRecognitionConfig with garbage; and garbage
bytes on the HTTP/2 connection itself.

An Attack's `frames` are the serialized requests (for "h2": the bytes sent on the connection),
its `query` the method."""
from __future__ import annotations

import struct

from hypothesis import strategies as st
from riva.client.proto import riva_asr_pb2 as rasr
from riva.client.proto.riva_audio_pb2 import AudioEncoding

from . import protobuf as pb
from .hostile import ENDINGS, MAX_MESSAGE, Attack, audio_pieces

CONFIG = {name: pb.number(rasr.RecognitionConfig, name) for name in rasr.RecognitionConfig.DESCRIPTOR.fields_by_name}
INTEGERS = {  # the int32 and enum fields of RecognitionConfig: absurd values and valid ones
    "encoding": [*AudioEncoding.values(), 99, -1, 2**31 - 1],
    "sample_rate_hertz": [0, 1, 7999, 8000, 16000, 44100, 48000, 192001, 2**31 - 1, -16000, 2**40 + 16000],
    "audio_channel_count": [0, 1, 2, -1, 2**31 - 1],
    "max_alternatives": [0, 1, -1, 2**31 - 1],
}
LANGUAGES = [b"en-US", b"en", b"", b"de-DE", b"EN-gb", b"en-" + b"x" * 5000, b"\x00", b"\xff\xfe", "ｅｎ".encode()]
KINDS = (pb.VARINT, pb.FIXED64, pb.LENGTH, pb.FIXED32)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
METHODS = ("Recognize", "GetRivaSpeechRecognitionConfig")


@st.composite
def any_field(draw, numbers: st.SearchStrategy[int]) -> bytes:
    """A field of any wire type with a payload to match: wrongly typed for a known number."""
    kind = draw(st.sampled_from(KINDS))
    payload = {
        pb.VARINT: st.integers(-(2**63), 2**64 - 1), pb.LENGTH: st.binary(max_size=40),
        pb.FIXED64: st.binary(min_size=8, max_size=8), pb.FIXED32: st.binary(min_size=4, max_size=4),
    }[kind]
    return pb.field(draw(numbers), kind, draw(payload))


def speech_contexts() -> st.SearchStrategy[list]:
    phrases = st.lists(st.text(max_size=30), max_size=20)
    context = st.builds(rasr.SpeechContext, phrases=phrases, boost=st.floats(width=32))
    huge = st.sampled_from([2_000, 10_000]).map(lambda n: [rasr.SpeechContext(phrases=["parakeet"] * n, boost=20.0)])
    return st.one_of(st.lists(context, max_size=3), huge)


@st.composite
def recognition_config(draw) -> bytes:
    """A RecognitionConfig: valid fields, then fields appended that override or confuse them."""
    config = rasr.RecognitionConfig(
        encoding=AudioEncoding.LINEAR_PCM, sample_rate_hertz=16000, language_code="en-US",
        enable_word_time_offsets=draw(st.booleans()), speech_contexts=draw(speech_contexts()),
        custom_configuration=draw(st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=3)),
        profanity_filter=draw(st.booleans()), model=draw(st.text(max_size=30)),
    )
    if draw(st.booleans()):
        config.endpointing_config.CopyFrom(rasr.EndpointingConfig(
            start_history=draw(st.sampled_from([-1, 0, 2**31 - 1])), stop_threshold=draw(st.floats(width=32))))
    overrides = st.one_of(
        *[st.sampled_from(values).map(lambda v, n=CONFIG[name]: pb.field(n, pb.VARINT, v))
          for name, values in INTEGERS.items()],
        st.sampled_from(LANGUAGES).map(lambda text: pb.field(CONFIG["language_code"], pb.LENGTH, text)),
        any_field(st.sampled_from(sorted(CONFIG.values()))),  # a known field, maybe wrongly typed
        any_field(st.integers(0, 2**29 - 1)),  # any number: unknown, or 0 (invalid)
    )
    return config.SerializeToString() + b"".join(draw(st.lists(overrides, max_size=3)))


def streaming_config() -> st.SearchStrategy[bytes]:
    """A StreamingRecognizeRequest carrying a (hostile) StreamingRecognitionConfig."""
    interim = st.integers(0, 2).map(lambda v: pb.field(pb.number(rasr.StreamingRecognitionConfig, "interim_results"),
                                                         pb.VARINT, v))
    config = st.tuples(recognition_config(), interim).map(
        lambda parts: pb.field(pb.number(rasr.StreamingRecognitionConfig, "config"), pb.LENGTH, parts[0]) + parts[1])
    return config.map(lambda c: pb.field(pb.number(rasr.StreamingRecognizeRequest, "streaming_config"), pb.LENGTH, c))


def audio_request(data: bytes) -> bytes:
    return pb.field(pb.number(rasr.StreamingRecognizeRequest, "audio_content"), pb.LENGTH, data)


def wav(data: bytes, tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16,
        size: int | None = None) -> bytes:
    """A WAV header (any of its fields absurd) and `data`."""
    frame = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * frame % 2**32, frame % 2**16, bits)
    size = len(data) if size is None else size
    return b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", size) + data


@st.composite
def audio(draw, speech: bytes) -> bytes:
    """Audio bytes: speech (odd cuts included), WAV with any header, noise, nothing."""
    piece = draw(audio_pieces(speech, 2))
    header = st.builds(wav, st.just(piece), st.sampled_from([1, 3, 6, 7, 2, 0xFFFE]), st.sampled_from([1, 0, 2, 65535]),
                       st.sampled_from([16000, 8000, 0, 1, 2**32 - 1]), st.sampled_from([16, 8, 32, 0, 12]),
                       st.sampled_from([None, 0, 2**32 - 1]))
    whole = wav(piece)
    return draw(st.one_of(st.just(piece), st.just(whole), header, st.integers(0, len(whole)).map(lambda n: whole[:n]),
                          st.binary(max_size=300), st.just(b"")))


@st.composite
def corrupted(draw, message: st.SearchStrategy[bytes]) -> bytes:
    """A request cut, or with bytes spliced in."""
    data = draw(message)
    at = draw(st.integers(0, len(data)))
    spliced = draw(st.one_of(st.just(b""), st.binary(min_size=1, max_size=8)))
    return data[:at] + spliced + data[at + draw(st.integers(0, 4)) :]


def streaming_frames(speech: bytes) -> st.SearchStrategy[list[bytes]]:
    """Mostly a config then audio; else any order (audio first, the config twice, garbage)."""
    config = streaming_config()
    frame = st.one_of(
        config, *[audio(speech).map(audio_request)] * 4, corrupted(st.one_of(config, audio(speech).map(audio_request))),
        st.binary(max_size=100), st.just(b""),
        st.integers(1, 64).map(lambda extra: audio_request(bytes(MAX_MESSAGE + extra))),  # over the message limit
    )
    return st.one_of(st.tuples(config, st.lists(frame, max_size=6)).map(lambda t: [t[0], *t[1]]),
                     st.lists(frame, min_size=1, max_size=6))


def recognize_request(speech: bytes) -> st.SearchStrategy[bytes]:
    request = st.tuples(recognition_config(), audio(speech)).map(
        lambda parts: pb.field(pb.number(rasr.RecognizeRequest, "config"), pb.LENGTH, parts[0])
        + pb.field(pb.number(rasr.RecognizeRequest, "audio"), pb.LENGTH, parts[1]))
    return st.one_of(request, request, corrupted(request), st.binary(max_size=100))


def h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def h2_garbage() -> st.SearchStrategy[bytes]:
    """Bytes on the gRPC port that are no gRPC: noise, HTTP/1.1, HTTP/2 frames of any type and
    content after a valid preface, a frame declaring 16 MB."""
    settings = h2_frame(4, 0, 0, b"")
    byte = st.integers(0, 255)
    frame = st.builds(h2_frame, byte, byte, st.integers(0, 2**32 - 1), st.binary(max_size=64))
    return st.one_of(
        st.binary(min_size=1, max_size=200), st.just(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"),
        st.lists(frame, min_size=1, max_size=4).map(lambda frames: PREFACE + settings + b"".join(frames)),
        st.just(PREFACE + settings + h2_frame(1, 5, 1, b"\xff" * 20)),  # HEADERS whose HPACK is garbage
        st.just(PREFACE + settings + (2**24 - 1).to_bytes(3, "big") + bytes(6)),
    )


def riva_attacks(speech: bytes) -> st.SearchStrategy[Attack]:
    """Up to 6 calls at once: with the good stream and what the last example left, within the fuzzed
    server's 4 slots and 8 queue places (a full queue is test_riva.py's)."""
    common = {"pace": st.sampled_from([0.0, 0.0, 0.002, 0.02]), "copies": st.sampled_from([1, 1, 1, 1, 2, 6])}
    streaming = st.builds(Attack, frames=streaming_frames(speech), query=st.just("StreamingRecognize"),
                          ending=st.sampled_from(ENDINGS), **common)
    unary = st.builds(Attack, frames=st.one_of(recognize_request(speech), st.binary(max_size=50)).map(lambda r: [r]),
                      query=st.sampled_from(METHODS), **common)
    garbage = st.builds(Attack, frames=h2_garbage().map(lambda data: [data]), query=st.just("h2"))
    return st.one_of(streaming, streaming, streaming, unary, garbage)
