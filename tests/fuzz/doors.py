"""The doors of the server, one entry each: where it is (listener, path), its hostile messages,
a probe whose answer shows a connection still serves, what every message it sends must be, and
a good stream (what it transcribes must not change while the door is attacked). A
request/response door (gRPC, HTTP uploads, the HTTP port) makes its attacks itself
(exchanges.py); the gRPC and upload doors' checks and good calls are in request_doors.py.

A door added later is one more entry in DOORS.
"""
from __future__ import annotations

import base64
import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from helpers import Raw, http_get, result_tokens, transcribe_raw
from hypothesis import strategies as st

from parakeet_stream.client import encode_audio
from parakeet_stream.server.protocols import openai_realtime
from parakeet_stream.server.protocols.vllm import VLLM_CODES
from parakeet_stream.server.transport.codes import POLICIES

from . import exchanges
from .answers import safe
from .attack import Outcome
from .hostile import Attack, attacks, audio_pieces, frames, queries
from .hostile_riva import riva_attacks
from .hostile_uploads import DEEPGRAM_PATH as DEEPGRAM_UPLOAD
from .hostile_uploads import OPENAI_PATH as OPENAI_UPLOAD
from .hostile_uploads import deepgram_uploads, openai_uploads
from .request_doors import (
    check_riva,
    check_uploads,
    deepgram_upload_answer,
    good_deepgram_upload,
    good_openai_upload,
    good_riva,
    openai_upload_answer,
)

CLOSE_CODES = {None, 1000, 1001, 1002, 1006, 1007, 1008, 1009, 1013}  # never 1011: a server bug
CHUNK = 1600  # good streams send 100 ms pieces (16 kHz)


@dataclass(frozen=True)
class Door:
    name: str
    port: str  # the server's listener: tcp, ws or http
    path: str  # WebSocket: path and the query every connection sends
    attacks: Callable[[bytes], st.SearchStrategy[Attack]]  # (PCM16 speech) -> hostile connections
    good: Callable[[dict, np.ndarray], Awaitable[Any]]  # (ports, speech) -> what a good stream got
    check: Callable[[list, int | None], None] = lambda messages, close_code: None
    probe: str = ""
    answered: Callable[[Any], bool] = lambda message: False
    # a request/response door: how it makes one attack (exchanges.py); its answers are the messages
    exchange: Callable[[dict, Attack], Awaitable[Outcome]] | None = None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def append(samples: np.ndarray) -> dict:
    return {"type": "input_audio_buffer.append", "audio": b64(encode_audio(samples, "pcm16"))}


def documented(code: str, own: dict | None = None) -> None:
    assert code in POLICIES or code in (own or {}), code
    assert code != "internal_error"


def closed_well(close_code: int | None) -> None:
    assert close_code in CLOSE_CODES, close_code


# -- native (TCP and WebSocket) ---------------------------------------------------------------
NATIVE_TYPES = {"hello", "started", "queued", "result", "pong", "error", "closed"}
# key phrases, good and bad (too many, too long, empty, control characters, bad weights)
PHRASES = [["Anya Okafor", {"text": "Kubernetes", "weight": 2.5}], [f"w{i}" for i in range(101)], ["x" * 101], [""],
           ["a\x00b"], [{"text": "x", "weight": 0}], [{"text": "x", "weight": 1e9}], []]


def native_messages(speech: bytes) -> st.SearchStrategy[dict]:
    piece = audio_pieces(speech, 2).map(b64)
    return st.one_of(
        st.fixed_dictionaries({
            "type": st.sampled_from(["start", "config"]), "sample_rate": st.sampled_from([16000, 48000, 8000]),
            "encoding": st.sampled_from(["pcm16", "f32", "mulaw", "alaw"]),
            "lookahead": st.sampled_from(["70,1", [70, 1]]),
        }, optional={"phrases": st.sampled_from(PHRASES)}),
        st.fixed_dictionaries({"type": st.just("audio"), "data": piece, "encoding": st.just("pcm16"),
                               "final": st.booleans()}),
        st.fixed_dictionaries({"type": st.just("audio"), "samples": st.lists(st.floats(-1, 1), max_size=50),
                               "final": st.booleans()}),
        st.sampled_from([{"type": "audio", "data": "", "final": True}, {"type": "close"}, {"type": "ping"}]),
    )


def check_native(messages: list, close_code: int | None) -> None:
    closed_well(close_code)
    for message in messages:
        assert isinstance(message, dict) and message["type"] in NATIVE_TYPES, message
        if message["type"] == "error":
            documented(message["code"])
            safe(message["message"])


async def good_native(address: str, speech: np.ndarray) -> list[int]:
    return result_tokens(await transcribe_raw(address, speech))


# -- vLLM and OpenAI on /v1/realtime -----------------------------------------------------------
VLLM_TYPES = {"session.created", "queued", "transcription.delta", "transcription.done", "error"}


def vllm_messages(speech: bytes) -> st.SearchStrategy[dict]:
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("session.update"),
                               "session": st.fixed_dictionaries({"sample_rate": st.sampled_from([16000, 24000])})}),
        st.just({"type": "session.update", "model": "any"}),
        st.builds(lambda piece: {"type": "input_audio_buffer.append", "audio": b64(piece)}, audio_pieces(speech, 2)),
        st.fixed_dictionaries({"type": st.just("input_audio_buffer.commit"), "final": st.booleans()}),
    )


def check_vllm(messages: list, close_code: int | None) -> None:
    closed_well(close_code)
    for message in messages:
        assert isinstance(message, dict) and message["type"] in VLLM_TYPES, message
        if message["type"] == "error":
            documented(message["code"], {v: None for v in VLLM_CODES.values()})
            safe(message["error"])


async def good_vllm(ws: str, speech: np.ndarray) -> str:
    async with Raw.open(ws) as conn:
        await conn.until("session.created")
        for i in range(0, len(speech), CHUNK):
            await conn.send(append(speech[i : i + CHUNK]))
        await conn.send({"type": "input_audio_buffer.commit", "final": True})
        return (await conn.until("transcription.done"))[-1]["text"]


OPENAI_FORMATS = [{"type": "audio/pcm", "rate": 16000}, {"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"},
                  {"type": "audio/pcma"}, {"rate": 8000}]
OPENAI_TURNS = [None, {"type": "server_vad"}, {"type": "semantic_vad", "eagerness": "low"},
                {"type": "server_vad", "threshold": 0.3, "silence_duration_ms": 200, "create_response": False}]


def openai_messages(speech: bytes) -> st.SearchStrategy[dict]:
    audio_input = st.fixed_dictionaries({}, optional={
        "format": st.sampled_from(OPENAI_FORMATS), "turn_detection": st.sampled_from(OPENAI_TURNS),
        "transcription": st.sampled_from([None, {"model": "gpt-4o-transcribe", "language": "en", "prompt": "x"},
                                          {"keywords": ["Anya Okafor"], "prompt": "Names: Kubernetes, kubectl"},
                                          {"keywords": [""]}, {"keywords": ["x"] * 101}, {"prompt": "a\x07b"}]),
        "noise_reduction": st.sampled_from([None, {"type": "near_field"}]),
    })
    event_id = st.fixed_dictionaries({}, optional={"event_id": st.text(max_size=20)})
    events = st.one_of(
        st.fixed_dictionaries({"type": st.just("session.update"), "session": st.fixed_dictionaries(
            {"type": st.just("transcription"), "audio": st.fixed_dictionaries({"input": audio_input})})}),
        st.builds(lambda piece: {"type": "input_audio_buffer.append", "audio": b64(piece)}, audio_pieces(speech, 2)),
        st.sampled_from([{"type": "input_audio_buffer.commit"}, {"type": "input_audio_buffer.clear"},
                         {"type": "input_audio_buffer.append", "audio": ""}]),
    )
    return st.tuples(events, event_id).map(lambda pair: {**pair[0], **pair[1]})


@functools.cache
def sdk_events():
    """The openai SDK's union of server events (tests/test_openai_realtime.py checks them alike)."""
    import pydantic
    from openai.types.realtime import RealtimeServerEvent

    return pydantic.TypeAdapter(RealtimeServerEvent)


def sdk_event(event: dict) -> None:
    """Exactly an SDK type, strictly."""
    checked = orjson.loads(orjson.dumps(event))
    audio_format = checked.get("session", {}).get("audio", {}).get("input", {}).get("format", {})
    if "rate" in audio_format:  # our extension: any PCM rate (the SDK's type pins 24 kHz)
        audio_format["rate"] = 24000
    sdk_events().validate_python(checked, strict=True)


def check_openai(messages: list, close_code: int | None) -> None:
    closed_well(close_code)
    items = Counter()
    for message in messages:
        assert isinstance(message, dict), message
        sdk_event(message)
        kind = message["type"]
        if kind == "error":
            documented(message["error"]["code"], openai_realtime.CODES)
            safe(message["error"]["message"])
        elif kind == "input_audio_buffer.committed":
            items[message["item_id"]] += 1
            assert items[message["item_id"]] == 1, message  # committed once
        elif kind.endswith(".completed"):
            assert items[message["item_id"]] == 1, message  # after its committed, once
            items[message["item_id"]] += 1


async def good_openai(ws: str, speech: np.ndarray) -> str:
    manual = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "turn_detection": None, "format": {"type": "audio/pcm", "rate": 16000}}}}}
    async with Raw.open(ws) as conn:
        await conn.until("session.created")
        await conn.send(manual)
        await conn.until("session.updated")
        for i in range(0, len(speech), CHUNK):
            await conn.send(append(speech[i : i + CHUNK]))
        await conn.send({"type": "input_audio_buffer.commit"})
        return (await conn.until("conversation.item.input_audio_transcription.completed"))[-1]["transcript"]


# -- Deepgram ---------------------------------------------------------------------------------
DEEPGRAM_TYPES = {"Results", "Metadata", "UtteranceEnd", "SpeechStarted", "Error"}
DEEPGRAM_KEYS = ["encoding", "sample_rate", "channels", "interim_results", "vad_events", "utterance_end_ms",
                 "endpointing", "model", "diarize", "redact", "api_key", "keyterm", "keywords"]


def deepgram_messages() -> st.SearchStrategy[dict]:
    return st.sampled_from([{"type": "KeepAlive"}, {"type": "Finalize"}, {"type": "CloseStream"}])


def check_deepgram(messages: list, close_code: int | None) -> None:
    closed_well(close_code)
    for message in messages:
        assert isinstance(message, dict) and message["type"] in DEEPGRAM_TYPES, message
        if message["type"] == "Error":
            documented(message["variant"])
            safe(message["description"])
    metadata = [i for i, m in enumerate(messages) if m["type"] == "Metadata"]
    assert metadata in ([], [len(messages) - 1]), messages  # once, last


async def good_deepgram(ws: str, speech: np.ndarray) -> str:
    pcm = encode_audio(speech, "pcm16")
    async with Raw.open(ws) as conn:
        for i in range(0, len(pcm), CHUNK * 2):
            await conn.send(pcm[i : i + CHUNK * 2])
        await conn.send({"type": "CloseStream"})
        messages = await conn.rest()
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    return " ".join(t for m in finals if (t := m["channel"]["alternatives"][0]["transcript"]))


# -- Deepgram Flux ----------------------------------------------------------------------------
FLUX_TYPES = {"Connected", "TurnInfo", "ConfigureSuccess", "ConfigureFailure", "Error"}
FLUX_KEYS = ["encoding", "sample_rate", "eot_threshold", "eager_eot_threshold", "eot_timeout_ms", "keyterm", "redact",
             "model", "api_key"]
THRESHOLD = st.one_of(st.floats(allow_nan=False), st.integers(), st.text(max_size=5), st.none(), st.booleans())


def flux_messages() -> st.SearchStrategy[dict]:
    thresholds = st.fixed_dictionaries({}, optional={
        "eot_threshold": THRESHOLD, "eager_eot_threshold": THRESHOLD, "eot_timeout_ms": THRESHOLD})
    configure = st.fixed_dictionaries({"type": st.just("Configure")}, optional={
        "thresholds": st.one_of(thresholds, st.integers()),
        "keyterms": st.one_of(st.lists(st.text(max_size=20), max_size=3), st.text(max_size=5)),
        "language_hints": st.lists(st.sampled_from(["en", "de", "", "x" * 50]), max_size=3)})
    return st.one_of(configure, st.sampled_from([{"type": "ForceEndTurn"}, {"type": "CloseStream"},
                                                 {"type": "KeepAlive"}]))


def check_flux(messages: list, close_code: int | None) -> None:
    closed_well(close_code)
    for message in messages:
        assert isinstance(message, dict) and message["type"] in FLUX_TYPES, message
        if message["type"] == "Error":
            documented(message["code"])
            safe(message["description"])
    assert [m["sequence_id"] for m in messages] == list(range(len(messages))), messages
    assert not messages or messages[0]["type"] == "Connected"
    turns = [m["turn_index"] for m in messages if m["type"] == "TurnInfo"]
    assert turns == sorted(turns), turns


async def good_flux(ws: str, speech: np.ndarray) -> str:
    pcm = encode_audio(speech, "pcm16")
    async with Raw.open(ws) as conn:
        for i in range(0, len(pcm), CHUNK * 2):
            await conn.send(pcm[i : i + CHUNK * 2])
        await conn.send({"type": "CloseStream"})
        messages = await conn.rest()
    return " ".join(m["transcript"] for m in messages if m.get("event") == "EndOfTurn")


# -- HTTP -------------------------------------------------------------------------------------
HTTP_STATUSES = {None, 200, 400, 404, 405, 431, 501}


@st.composite
def http_requests(draw) -> bytes:
    method = draw(st.sampled_from(["GET", "POST", "HEAD", "BREW", "G ET", "GET\x00"]))
    target = draw(st.one_of(
        st.sampled_from(["/health", "/ready", "/metrics", "/", "http://[::1/", "//[x/", "/%00", "*", "/../etc/passwd",
                         "/" + "a" * 5000, "/%2e%2e/%2e%2e/etc/passwd", "/index.html?x=%ff"]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=60).map(lambda t: "/" + t),
    ))
    headers = draw(st.sampled_from([[b"Host: x"], [b"Host: x"], []])) + draw(st.lists(st.sampled_from([
        b"Content-Length: 5", b"Content-Length: -1", b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip",
        b"X-Big: " + b"a" * 20000, b": nameless", b"Host: y", b"Connection: Upgrade"]), max_size=2))
    data = f"{method} {target} HTTP/1.1\r\n".encode() + b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    prefix = draw(st.one_of(st.just(b""), st.just(b""), st.binary(min_size=1, max_size=200)))
    return prefix + data + draw(st.sampled_from([b"", b"hello", b"\x00" * 100]))


def http_attacks(speech: bytes) -> st.SearchStrategy[Attack]:
    return http_requests().map(lambda request: Attack(frames=[request]))


def check_http(statuses: list, close_code: int | None) -> None:
    assert statuses[0] in HTTP_STATUSES, statuses


async def good_http(ports: dict, speech: np.ndarray) -> tuple:
    status, body = await http_get(ports["http"], "/health")
    health = orjson.loads(body)
    return status, health["status"], health["model"]


# -- the doors --------------------------------------------------------------------------------
def _ws(ports: dict, path: str) -> str:
    return f"ws://127.0.0.1:{ports['ws']}{path}"


NATIVE_KEYS = ["sample_rate", "encoding", "lookahead", "api_key"]
OPENAI_PATH = "/v1/realtime?intent=transcription"
DEEPGRAM_PATH = "/v1/listen?encoding=linear16&sample_rate=16000"
FLUX_PATH = "/v2/listen?encoding=linear16&sample_rate=16000"

DOORS = [
    Door(
        "tcp", "tcp", "", lambda speech: attacks(frames(native_messages(speech))),
        lambda ports, speech: good_native(f"tcp://127.0.0.1:{ports['tcp']}", speech),
        check_native, '{"type":"ping"}', lambda m: m.get("type") == "pong",
    ),
    Door(
        "ws", "ws", "/", lambda speech: attacks(
            frames(native_messages(speech), audio_pieces(speech, 2), raw=True), queries("", NATIVE_KEYS)),
        lambda ports, speech: good_native(_ws(ports, "/"), speech),
        check_native, '{"type":"ping"}', lambda m: isinstance(m, dict) and m.get("type") == "pong",
    ),
    Door(
        "vllm", "ws", "/v1/realtime", lambda speech: attacks(
            frames(vllm_messages(speech), st.binary(max_size=50), raw=True), queries("", ["sample_rate", "api_key"])),
        lambda ports, speech: good_vllm(_ws(ports, "/v1/realtime"), speech),
        check_vllm, '{"type":"fuzz.probe"}', lambda m: m.get("type") == "error" and "fuzz.probe" in m["error"],
    ),
    Door(
        "openai", "ws", OPENAI_PATH, lambda speech: attacks(
            frames(openai_messages(speech), st.binary(max_size=50), raw=True),
            queries("", ["model", "api_key", "sample_rate"])),  # not `intent` alone: it would make it vLLM's
        lambda ports, speech: good_openai(_ws(ports, OPENAI_PATH), speech),
        check_openai, '{"type":"fuzz.probe","event_id":"fuzz-probe"}',
        lambda m: m.get("type") == "error" and m["error"]["event_id"] == "fuzz-probe",
    ),
    Door(
        "deepgram", "ws", DEEPGRAM_PATH, lambda speech: attacks(
            frames(deepgram_messages(), audio_pieces(speech, 2), raw=True), queries("", DEEPGRAM_KEYS)),
        lambda ports, speech: good_deepgram(_ws(ports, DEEPGRAM_PATH), speech),
        check_deepgram, '{"type":"FuzzProbe"}', lambda m: m.get("type") == "Error" and "FuzzProbe" in m["description"],
    ),
    Door(
        "flux", "ws", FLUX_PATH, lambda speech: attacks(
            frames(flux_messages(), audio_pieces(speech, 2), raw=True), queries("", FLUX_KEYS)),
        lambda ports, speech: good_flux(_ws(ports, FLUX_PATH), speech),
        check_flux, '{"type":"FuzzProbe"}', lambda m: m.get("type") == "Error" and "FuzzProbe" in m["description"],
    ),
    Door("http", "http", "", http_attacks, good_http, check_http, exchange=exchanges.http_request),
    Door("riva", "grpc", "", riva_attacks, good_riva, check_riva, exchange=exchanges.riva),
    Door("openai_upload", "http", OPENAI_UPLOAD, openai_uploads, good_openai_upload,
         check_uploads(openai_upload_answer), exchange=exchanges.upload),
    Door("deepgram_upload", "http", DEEPGRAM_UPLOAD, deepgram_uploads, good_deepgram_upload,
         check_uploads(deepgram_upload_answer), exchange=exchanges.upload),
]
