"""`/v1/listen`: Deepgram's live streaming API, as the official deepgram-sdk speaks it.

Binary frames carry audio in the encoding the URL declares; text frames carry the control
messages `KeepAlive`, `Finalize` and `CloseStream`. Engine results become `Results` messages:
interim ones (with `interim_results=true`) while a segment grows, and one final per segment,
where a segment ends at the model's end of utterance (`speech_final`, unless `endpointing=false`),
at `Finalize` (`from_finalize`) or at the end of the stream.
`UtteranceEnd` follows once `utterance_end_ms` of audio passed after the last finalized word.
`Metadata` is the last message before the close. Each `Finalize` ends the segment; later audio
opens a new one (see streams/segments.py: audio sent meanwhile waits for it, times count from the
start of the connection). Every segment boosts the key phrases the URL names (`keyterm`, `keywords`)
and transcribes its `language` (a multilingual model's; `multi` is its automatic language ID).
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import audio
from ...engine.languages import AUTO
from ...engine.phrases import MAX_WEIGHT, Phrase, PhraseError, check_phrases
from ..streams.language import checked_language
from ..streams.speakers import SpeakerTimeline, checked_speakers
from ..streams.phrases import refused
from ..streams.protocol import Accept, Handshake, Protocol, Refusal, check_access
from ..streams.schema import Message, Schema
from ..streams.segments import State
from ..streams.session import Session
from ..streams.wire import decode_bytes, parse_sample_rate
from ..streams.words import WordTracker, first_text_time, transcript_confidence
from ..transport.codes import ProtocolError

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..context import ServerContext
    from ..streams.connection import Connection
    from ..streams.segments import Segment

PATH = "/v1/listen"
ENCODINGS = {"linear16": "pcm16", "mulaw": "mulaw", "alaw": "alaw"}
BOOLEANS = ("interim_results", "vad_events")
# What Deepgram's API has and we do not (its reference lists the parameters): what only tunes is
# accepted and ignored, so that a framework's defaults never fail a connection; a feature that,
# ignored, would silently give something other than what was asked for is refused. Names we do
# not know are accepted and logged: frameworks add parameters with every release, and Deepgram's
# SDKs (and Pipecat's `addons`) pass any "custom add-on parameter" through.
# accepted and ignored: formatting, billing, labels and hints our model has no use for
# (LiveKit's and Pipecat's Deepgram plugins send most of them on every connection)
IGNORED = {
    "model", "version", "language_hint", "tag", "extra", "mip_opt_out", "punctuate", "smart_format",
    "numerals", "no_delay", "filler_words", "profanity_filter", "dictation", "measurements",
    "callback_method", "diarize_version",
}
# features we do not have: accepted only when they ask for nothing ("false")
FALSE_ONLY = {
    "diarize_model", "multichannel", "detect_language", "detect_entities", "sentiment", "topics",
    "intents", "summarize", "redact", "search", "replace", "callback",
}
PHRASES = ("keyterm", "keywords")  # repeatable; see parse_phrases
KNOWN = {"encoding", "sample_rate", "channels", "endpointing", "utterance_end_ms", "language", "diarize", *PHRASES,
         *BOOLEANS,
         *IGNORED, *FALSE_ONLY}
MULTI = "multi"  # Deepgram's code-switching: the model's automatic language ID
INTENSIFIER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
log = logging.getLogger(__name__)


@dataclass
class Options:
    """What the URL's query parameters ask for."""

    encoding: str = "pcm16"
    sample_rate: int = audio.SAMPLE_RATE
    interim_results: bool = False
    vad_events: bool = False
    # Segments end at the model's <EOU>, a trained end-of-turn detector: `endpointing` ms are
    # accepted but not used (a gap between token times is not silence: waiting for it would end
    # segments inside words). endpointing=false: segments still end there, never as speech_final.
    speech_final: bool = True
    utterance_end_ms: int | None = None
    model: str = "parakeet"
    phrases: tuple[Phrase, ...] = ()
    language: str | None = None  # as asked; the handshake makes it the model's name for it
    diarize: bool = False  # each word's `speaker` (the server's --diarizer)


def parse_options(query: dict[str, str], params: Sequence[tuple[str, str]]) -> Options:
    """Query parameters (`params`: all of them, repeated ones too) -> Options; a feature we do
    not have, or a value we cannot honour, raises ProtocolError."""
    if enabled := sorted(name for name in FALSE_ONLY if query.get(name, "false") != "false"):
        raise ProtocolError("invalid_config", f"not supported by this server: {', '.join(enabled)}")
    if unknown := sorted(set(query) - KNOWN - {"api_key"}):
        log.info("%s: unknown query parameter(s) accepted and ignored: %s", PATH, ascii(unknown)[:300])
    options = Options(model=query.get("model", "parakeet"))
    encoding = query.get("encoding")
    if encoding is None:
        raise ProtocolError("invalid_config", "'encoding' is required: containerized audio is not supported")
    if encoding not in ENCODINGS:
        raise ProtocolError("invalid_config", f"'encoding' must be one of {', '.join(ENCODINGS)}")
    options.encoding = ENCODINGS[encoding]
    if "sample_rate" not in query:
        raise ProtocolError("invalid_config", "'sample_rate' is required with 'encoding'")
    options.sample_rate = parse_sample_rate(query["sample_rate"], from_url=True)
    if query.get("channels", "1") != "1":
        raise ProtocolError("invalid_config", "only 'channels=1' is supported")
    for name in BOOLEANS:
        setattr(options, name, _boolean(query, name))
    if query.get("endpointing") == "false":
        options.speech_final = False
    elif "endpointing" in query:
        _milliseconds(query, "endpointing")
    if "utterance_end_ms" in query:
        options.utterance_end_ms = _milliseconds(query, "utterance_end_ms")
    options.phrases = parse_phrases(params)
    language = query.get("language")
    options.language = AUTO if language == MULTI else language
    options.diarize = _boolean(query, "diarize")
    return options


def parse_phrases(params: Sequence[tuple[str, str]]) -> tuple[Phrase, ...]:
    """Every `keyterm` is one phrase (several words too), of the default weight; every `keywords`
    is `word` or `word:intensifier`, and its intensifier is the phrase's weight (Deepgram's
    default, 1, is ours). Suppression (an intensifier of 0 or less) is refused."""
    items = [(value, None) for name, value in params if name == "keyterm"]
    items += [_keyword(value) for name, value in params if name == "keywords"]
    try:
        return check_phrases(items)
    except PhraseError as exc:
        raise refused(exc, "keyterm/keywords") from None


def _keyword(value: str) -> tuple[str, float | None]:
    text, colon, intensifier = value.rpartition(":")
    if not colon:
        return value, None
    if not INTENSIFIER.fullmatch(intensifier.strip()):
        raise ProtocolError("invalid_phrases", "keywords: the intensifier after ':' must be a number")
    weight = float(intensifier)
    if not 0 < weight <= MAX_WEIGHT:
        raise ProtocolError(
            "invalid_phrases", f"keywords: an intensifier must be above 0 and at most {MAX_WEIGHT:g} "
            "(suppressing a word with 0 or less is not supported)"
        )
    return text, weight


def _boolean(query: dict[str, str], name: str) -> bool:
    value = query.get(name, "false")
    if value not in ("true", "false"):
        raise ProtocolError("invalid_config", f"'{name}' must be true or false")
    return value == "true"


def _milliseconds(query: dict[str, str], name: str) -> int:
    value = query[name]
    if not (value.isascii() and value.isdigit() and len(value) <= 6):
        raise ProtocolError("invalid_config", f"'{name}' must be a whole number of milliseconds")
    return int(value)


def handshake_for(parse: Callable[[dict[str, str], Sequence[tuple[str, str]]], Any], names: str):
    """A Deepgram handshake: its key forms, then `parse` of the query (options with `phrases` and
    `language`, checked against the model; `names`: the phrases' query parameters); a refusal shaped
    like Deepgram's (HTTP 400)."""

    def handshake(ctx: ServerContext, request: Handshake) -> Accept | Refusal:
        key, subprotocol = credentials(request.headers, list(request.subprotocols))
        refusal = check_access(ctx, request, key or request.query.get("api_key"))
        if refusal is not None:
            return refusal
        try:
            options = parse(request.query, request.params)
            check_phrases_for(ctx, options.phrases, names)
            options.language = checked_language(ctx.engine, options.language)
            checked_speakers(ctx.engine.info, getattr(options, "diarize", False), None)
        except ProtocolError as exc:
            body = {"err_code": "INVALID_QUERY_PARAMETER", "err_msg": exc.message, "request_id": str(uuid.uuid4())}
            return Refusal(400, exc.code, exc.message, body)
        return Accept(options, subprotocol)

    return handshake


def check_phrases_for(ctx: ServerContext, phrases: tuple[Phrase, ...], names: str) -> None:
    """What the model cannot boost (too many tokens, characters it cannot write) is refused at the
    handshake, not at the first audio (`names`: the query parameters, for the message)."""
    try:
        ctx.engine.check_phrases(phrases)
    except PhraseError as exc:
        raise refused(exc, names) from None


def credentials(headers: dict[str, str], offered: list[str]) -> tuple[str | None, str | None]:
    """(key, subprotocol to answer with): `Authorization: Token KEY`, or the browser form
    `Sec-WebSocket-Protocol: token, KEY` (`offered`: the subprotocols the client proposed)."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() in ("token", "bearer") and token.strip():
        return token.strip(), None
    if len(offered) == 2 and offered[0].lower() == "token":
        return offered[1], offered[0]
    return None, None


class KeepAlive(Message, tag="KeepAlive"):
    pass


class Finalize(Message, tag="Finalize"):
    pass


class CloseStream(Message, tag="CloseStream"):
    pass


SCHEMA = Schema(KeepAlive, Finalize, CloseStream)


@dataclass
class Transcript:
    """What the next final Results holds: the words since the last one (connection times)."""

    words: list[dict] = field(default_factory=list)  # complete ones
    text: str = ""
    start: float = 0.0
    spoken: bool = False  # a text token came


class DeepgramSession(Session):
    def __init__(self, connection: Connection, options: Options) -> None:
        super().__init__(connection, options)
        self.options = options
        self.segments.rate = options.sample_rate
        self.segments.phrases = options.phrases
        self.segments.language = options.language
        self.segments.diarize = options.diarize
        self._speakers = SpeakerTimeline(self.info, self.info.speakers) if options.diarize else None
        self.request_id = str(uuid.uuid4())
        self.created = datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        self._words = WordTracker(self.info)
        self._transcript = Transcript()
        self._last_final_word_end: float | None = None  # awaiting its UtteranceEnd
        self._from_finalize = False
        self._closing = False
        self._language: str | None = None  # a multilingual model's, as its last result said

    async def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            samples = decode_bytes(message, self.options.encoding)
            if self._closing:
                raise ProtocolError("stream_closed", "audio after CloseStream")
            await self.segments.push(samples)
            return
        event = SCHEMA.decode(message)
        if isinstance(event, Finalize):
            self._finalize(from_finalize=not self._closing)
        elif isinstance(event, CloseStream):
            self._close_stream()
        # KeepAlive: receiving it restarted the idle clock

    def _finalize(self, from_finalize: bool) -> bool:
        """End the current segment's input (flushing its words), or the audio waiting behind it;
        False when there is no audio to end. `from_finalize`: its final Results answers a Finalize."""
        ended = self.segments.end_input(functools.partial(self._finalize, from_finalize))
        if ended is State.OPEN:
            self._from_finalize = from_finalize
        return ended is not None

    def _close_stream(self) -> None:
        """CloseStream: once every segment is transcribed, Metadata and the close."""
        self._closing = True
        if self._finalize(from_finalize=False):
            self.segments.defer(self._close_stream)  # checked again once this segment is done
        else:
            self.connection.end("completed", self.last_message("completed"))

    def on_result(self, segment: Segment, result: StreamResult) -> None:
        transcript = self._transcript
        first = first_text_time(self.info.tokenizer, result)
        first = None if first is None else segment.offset + first
        now = segment.heard_until(result)
        self._utterance_end(now if first is None else first)  # the gap, up to the next word
        if first is not None and not transcript.spoken:
            transcript.start, transcript.spoken = first, True
            if self.options.vad_events:
                self.post({"type": "SpeechStarted", "channel": [0, 1], "timestamp": round(first, 3)})
        ends_transcript = result.utterance_end or result.is_final
        words = self._words.update(result, now, close=ends_transcript, offset=segment.offset)
        if self._speakers is not None:
            self._speakers.add(result, segment.offset)
            self._speakers.label(words)
        transcript.words += words
        transcript.text += result.text
        self._language = result.language or self._language
        if ends_transcript:
            self._send_final(now, speech_final=result.utterance_end, segment_end=result.is_final)
        elif self.options.interim_results and first is not None:
            self.post(self._results(now, is_final=False, speech_final=False))
        if result.is_final and self._closing:
            self._utterance_end(now, ended=True)

    def _send_final(self, now: float, speech_final: bool, segment_end: bool) -> None:
        # only the segment's last Results answers a Finalize: an utterance that ends while it
        # drains is not yet all the audio sent before it
        from_finalize = self._from_finalize and segment_end
        self._from_finalize = self._from_finalize and not segment_end
        transcript = self._transcript
        if transcript.spoken or from_finalize:
            message = self._results(now, is_final=True, speech_final=speech_final and self.options.speech_final)
            message["from_finalize"] = from_finalize
            self.post(message)
        if transcript.words:
            self._last_final_word_end = transcript.words[-1]["end"]
        self._transcript = Transcript(start=now)

    def _utterance_end(self, now: float, ended: bool = False) -> None:
        """UtteranceEnd once `utterance_end_ms` of audio without a word followed the last
        finalized one (or the audio ended)."""
        last, wait = self._last_final_word_end, self.options.utterance_end_ms
        if wait is None or last is None or self._transcript.spoken:
            return
        if ended or now - last >= wait / 1000:
            self._last_final_word_end = None
            self.post({"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": last})

    def _results(self, now: float, is_final: bool, speech_final: bool) -> dict:
        transcript = self._transcript
        start = transcript.start if transcript.spoken else now
        words = transcript.words + self._words.open_word(now)
        if self._speakers is not None:  # the open word's speaker, as heard so far
            self._speakers.label(words[len(transcript.words):])
        if self.segments.language == AUTO:  # Deepgram's fields for code-switching: the languages detected
            words = [{**word, "language": self._language} for word in words] if self._language else words
        alternative = {
            "transcript": transcript.text.strip(),
            "confidence": transcript_confidence(words),
            "words": words,
        }
        if self.segments.language == AUTO:
            alternative["languages"] = [self._language] if self._language else []
        return {
            "type": "Results",
            "channel_index": [0, 1],
            "duration": round(max(0.0, now - start), 3),
            "start": round(start, 3),
            "is_final": is_final,
            "speech_final": speech_final,
            "channel": {"alternatives": [alternative]},
            "metadata": {
                "request_id": self.request_id,
                "model_info": self._model_info(),
                "model_uuid": self._model_uuid(),
            },
        }

    def _model_info(self) -> dict:
        return {"name": self.config.model_name, "version": "parakeet-stream", "arch": "parakeet"}

    def _model_uuid(self) -> str:
        return str(uuid.UUID(hashlib.md5(self.config.model_name.encode()).hexdigest()))

    def error_message(self, code: str, message: str) -> dict:
        return {"type": "Error", "variant": code, "description": message}

    def last_message(self, reason: str) -> dict:
        """Deepgram's last message before the close: Metadata about the whole request."""
        model = self._model_uuid()
        return {
            "type": "Metadata",
            "transaction_key": "deprecated",
            "request_id": self.request_id,
            "sha256": hashlib.sha256(self.request_id.encode()).hexdigest(),
            "created": self.created,
            "duration": round(self.segments.received_seconds, 3),
            "channels": 1,
            "models": [model],
            "model_info": {model: self._model_info()},
        }


PROTOCOL = Protocol(name="deepgram", metric="deepgram", door="ws", path=PATH,
                    handshake=handshake_for(parse_options, "keyterm/keywords"), session=DeepgramSession)
