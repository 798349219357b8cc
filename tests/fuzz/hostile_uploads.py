"""Hypothesis strategies for hostile uploads on the HTTP port: OpenAI's multipart
`POST /v1/audio/transcriptions` (files that are not audio, truncated or empty, a wrong, missing
or odd boundary, no file field or two, unknown, duplicated, oversized and badly valued form
fields) and Deepgram's raw-body `POST /v1/listen` (the same files, odd query parameters, a
`{"url": ...}` JSON body), both framed every way a client can: an exact or a false
Content-Length (short, or 2 GB), chunked (also broken, or never ending), no length at all; with
deeply nested or odd query strings; several at once.

An Attack's `frames` are the request's bytes in pieces, sent at its pace; an `Endless` last
frame is a chunk sent again and again until the server answers (exchanges.py bounds it)."""
from __future__ import annotations

from urllib.parse import quote

from hypothesis import strategies as st

from .hostile import ENDINGS, Attack, audio_pieces
from .hostile_riva import audio, wav

OPENAI_PATH = "/v1/audio/transcriptions"
DEEPGRAM_PATH = "/v1/listen"
BOUNDARY = "b0undary"
QUERIES = ["", "", "?api_key=x", "?" + "a" + "[b]" * 500 + "=1", "?%ff%fe=%00", "?x=" + "1" * 3000, "?&&==&",
           "?x=1&x=2&x=3", "?response_format=srt", "?a=%5B%7B", "?" + "&".join(f"k{i}=v" for i in range(500))]
FIELDS = {  # form fields: valid values and bad ones
    "response_format": ["json", "text", "verbose_json", "srt", "vtt", "diarized_json", "", "JSON", " json "],
    "timestamp_granularities[]": ["word", "segment", "sentence", ""],
    "stream": ["true", "false", "yes", ""],
    "model": ["whisper-1", ""], "language": ["en", "xx"], "temperature": ["0", "nan"], "chunking_strategy": ["auto"],
    "best_of": ["3"], "": ["x"], "a[b][c][d]": ["1"], "x" * 100: ["1"], "é": ["1"],
}
CONTENT_TYPES = [  # {b}: the boundary the body uses
    "multipart/form-data; boundary={b}", "multipart/form-data; boundary={b}", 'multipart/form-data; boundary="{b}"',
    "multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=wrong", "audio/wav", "",
    "multipart/form-data; boundary*=utf-8''{b}", "multipart/form-data; boundary=" + "x" * 1000,
    "MULTIPART/FORM-DATA; boundary={b}",
]
GOOD_FIELDS = {"response_format": ["json", "text", "verbose_json", "srt", "vtt"],
               "timestamp_granularities[]": ["word", "segment"], "stream": ["false", "true"], "model": ["whisper-1"]}
DISPOSITIONS = [  # of the file part
    'Content-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav',
    'Content-Disposition: form-data; name="file"; filename="../../é.wav"', 'Content-Disposition: form-data; name="file"',
    'Content-Disposition: form-data; name="audio"; filename="a.wav"', "Content-Type: audio/wav", "garbage",
]
DEEPGRAM_TYPES = ["audio/wav", "application/octet-stream", "application/json", "APPLICATION/JSON; charset=utf-8",
                  "audio/l16", "", "text/plain"]
DEEPGRAM_QUERY = {
    "encoding": ["linear16", "mulaw", "alaw", "opus", "", "LINEAR16"],
    "sample_rate": ["16000", "8000", "0", "١٦٠٠٠", "1" * 30], "channels": ["1", "2"], "utterances": ["true", "yes"],
    "paragraphs": ["true", "false", ""], "utt_split": ["0.8", "x", "nan"],
    "callback": ["https://example.com"], "diarize": ["true", "false"], "model": ["nova-3", ""], "summarize": ["v2"],
    "endpointing": ["false", "10", "-1"], "interim_results": ["true"], "api_key": ["x"],
}
FRAMINGS = ["length", "length", "length", "chunked", "chunked", "short", "huge", "endless", "bad chunk", "none"]
HEADERS = ["Expect: 100-continue", "Authorization: Bearer x", "Authorization: Token ", "Content-Encoding: gzip",
           "Connection: keep-alive"]


class Endless(bytes):
    """A chunk of a body that never ends."""


def files(speech: bytes) -> st.SearchStrategy[bytes]:
    """What goes where the audio file goes: audio (good, cut, any header, raw), containers we
    refuse by name, text."""
    refused = st.sampled_from([b"\0\0\0\x20ftypM4A " + bytes(100), b"\x1aE\xdf\xa3" + bytes(100)])
    return st.one_of(audio(speech), audio(speech), refused, st.text(max_size=50).map(str.encode))


def part(boundary: str, disposition: str, content: bytes) -> bytes:
    return f"--{boundary}\r\n{disposition}\r\n\r\n".encode() + content + b"\r\n"


@st.composite
def form(draw, speech: bytes) -> tuple[bytes, str]:
    """A multipart body and its Content-Type: half of them a good form (a WAV file, fields with
    valid values), so that transcriptions and every response format are in the mix too."""
    good = draw(st.booleans())
    pick = (lambda options: options[0]) if good else (lambda options: draw(st.sampled_from(options)))
    boundary = pick([BOUNDARY, BOUNDARY, "-" * 10 + "x", "a" * 200])
    fields = GOOD_FIELDS if good else FIELDS
    value = (lambda name: st.sampled_from(fields[name])) if good else (lambda name: st.one_of(
        st.sampled_from(FIELDS[name]), st.text(max_size=20), st.just("x" * 70_000)))
    field = st.sampled_from(list(fields)).flatmap(lambda name: st.tuples(st.just(name), value(name)))
    parts = [part(boundary, f'Content-Disposition: form-data; name="{name}"', text.encode())
             for name, text in draw(st.lists(field, max_size=4, unique_by=lambda pair: pair[0] if good else pair))]
    content = audio_pieces(speech, 2).map(wav) if good else files(speech)
    for _ in range(pick([1, 1, 1, 1, 0, 2])):
        parts.insert(draw(st.integers(0, len(parts))), part(boundary, pick(DISPOSITIONS), draw(content)))
    closing = f"--{boundary}--\r\n"
    end = pick([closing, closing, "", closing + "junk", "--other--\r\n"])
    return b"".join(parts) + end.encode(), pick(CONTENT_TYPES).replace("{b}", boundary)


@st.composite
def raw_body(draw, speech: bytes) -> tuple[bytes, str]:
    """Deepgram's body (the audio itself, or JSON naming a URL) and its Content-Type."""
    json = st.sampled_from([b'{"url": "https://example.com/a.wav"}', b'{"url": 1}', b"{", b"[" * 2000])
    good = audio_pieces(speech, 2).map(lambda piece: (wav(piece), "audio/wav"))
    hostile = st.tuples(st.one_of(files(speech), files(speech), json), st.sampled_from(DEEPGRAM_TYPES))
    return draw(st.one_of(good, hostile))


def deepgram_query() -> st.SearchStrategy[str]:
    pair = st.sampled_from(list(DEEPGRAM_QUERY)).flatmap(
        lambda key: st.sampled_from(DEEPGRAM_QUERY[key]).map(lambda value: f"{key}={quote(value)}"))
    built = st.lists(pair, max_size=4).map(lambda pairs: "?" + "&".join(pairs) if pairs else "")
    return st.one_of(built, built, st.just(""), st.just(""), st.just("?encoding=linear16&sample_rate=16000"),
                     st.sampled_from(QUERIES))


def chunked(body: bytes, cuts: list[int]) -> bytes:
    bounds = [0, *sorted(c % (len(body) + 1) for c in cuts), len(body)]
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@st.composite
def framed(draw, path: str, query: st.SearchStrategy[str], body: st.SearchStrategy[tuple[bytes, str]]) -> Attack:
    data, content_type = draw(body)
    how = draw(st.sampled_from(FRAMINGS))
    headers = ["Host: 127.0.0.1", *draw(st.lists(st.sampled_from(HEADERS), max_size=2, unique=True))]
    headers += [f"Content-Type: {content_type}"] if content_type else []
    endless = []
    if how in ("length", "short", "huge"):
        declared = {"length": len(data), "short": len(data) + draw(st.integers(1, 10_000)), "huge": 2**31}[how]
        headers.append(f"Content-Length: {declared}")
        data = data[: draw(st.integers(0, len(data)))] if how == "huge" else data
    elif how != "none":
        headers.append("Transfer-Encoding: chunked")
        cuts = draw(st.lists(st.integers(0, 2**16), max_size=4))
        if how == "chunked":
            data = chunked(data, cuts)
        elif how == "bad chunk":
            data = draw(st.sampled_from([b"zz\r\n", b"-1\r\n", b"5\r\nabc\r\n", b"fffffffffffffffff\r\n"])) + data
        else:
            data, endless = chunked(data, cuts)[: -len(b"0\r\n\r\n")], [Endless(b"10000\r\n" + bytes(65536) + b"\r\n")]
    lines = [f"POST {path}{draw(query)} HTTP/1.1", *headers]
    request = "".join(f"{line}\r\n" for line in lines).encode() + b"\r\n" + data
    cuts = sorted(draw(st.lists(st.integers(0, len(request)), max_size=3)))
    pieces = [request[a:b] for a, b in zip([0, *cuts], [*cuts, len(request)]) if b > a]
    # a body shorter than its length, or a chunk longer than what follows, waits for the rest (up to
    # --idle-timeout): a client that closes or leaves ends it at once
    endings = ENDINGS[3:] if how in ("short", "bad chunk") else ENDINGS
    return Attack(frames=pieces + endless, pace=draw(st.sampled_from([0.0, 0.0, 0.002, 0.02])),
                  ending=draw(st.sampled_from(endings)), copies=draw(st.sampled_from([1, 1, 1, 1, 2, 4])))


def openai_uploads(speech: bytes) -> st.SearchStrategy[Attack]:
    return framed(OPENAI_PATH, st.one_of(st.sampled_from(QUERIES), st.just("/")), form(speech))


def deepgram_uploads(speech: bytes) -> st.SearchStrategy[Attack]:
    return framed(DEEPGRAM_PATH, deepgram_query(), raw_body(speech))
