"""`/v2/listen`: Deepgram Flux's turn-taking API, as deepgram-sdk, Pipecat's
`DeepgramFluxSTTService` and LiveKit's `deepgram.STTv2` speak it.

Binary frames carry audio in the encoding the URL declares; text frames carry `Configure`
(thresholds mid-stream), `ForceEndTurn` and `CloseStream`. The server answers `Connected`, then
`TurnInfo` messages whose `event` follows the speaker's turns: `StartOfTurn` at a turn's first
word, `Update` on every later result, `EagerEndOfTurn` once the end-of-turn confidence reaches
`eager_eot_threshold` (only when set; so, when set, before every EndOfTurn the model decides),
`TurnResumed` when words come after that, `EndOfTurn`
once it reaches `eot_threshold`, or `eot_timeout_ms` of audio after the last word passed
(`trigger`: model, timeout, manual for `ForceEndTurn`). `CloseStream` transcribes what is left and
closes, ending no turn (as Deepgram's: a turn still open ends with its last `Update`).

The confidence is the model's (flux_turns.py): on a model trained with `<EOU>`, the highest
probability it gave `<EOU>` since the turn's last word (engine `StreamResult.end_of_utterance`),
firmed up by the silence after the model wrote `<EOU>`; on a model without it, the trailing
silence as a share of the engine's endpoint silence. One engine stream serves the connection (a
`ForceEndTurn` ends it, later audio opens the next), so the words of the turns are the words the
native protocol gives for the same audio. Every message has the connection's `sequence_id`.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import msgspec

from ... import audio
from ...engine.phrases import Phrase
from ...text import join_words
from ..streams.protocol import Protocol
from ..streams.schema import Message, Schema
from ..streams.segments import State
from ..streams.session import Session
from ..streams.wire import decode_bytes, parse_sample_rate
from ..streams.words import WordTracker, pieces
from ..transport.codes import ProtocolError
from .deepgram import ENCODINGS, CloseStream, KeepAlive, handshake_for, parse_phrases
from .flux_turns import Event, Thresholds, TurnTaking

if TYPE_CHECKING:
    from ...engine import StreamResult
    from ..streams.connection import Connection
    from ..streams.segments import Segment

PATH = "/v2/listen"
# Deepgram's documented ranges and defaults
EOT = (0.5, 0.9, 0.7)
EAGER = (0.3, 0.9)
TIMEOUT_MS = (500, 10000, 5000)
# accepted and ignored: billing, labels, formatting our model has no use for (as /v1/listen,
# unknown names are accepted and logged)
IGNORED = {"model", "tag", "mip_opt_out", "numerals", "profanity_filter", "language_hint"}
KNOWN = {"encoding", "sample_rate", "eot_threshold", "eager_eot_threshold", "eot_timeout_ms", "redact", "keyterm",
         "api_key", *IGNORED}
log = logging.getLogger(__name__)


def updated(thresholds: Thresholds, eot: float | None, eager: float | None, timeout: float | None) -> Thresholds:
    """`thresholds` with the values given (None: kept), checked; ProtocolError names the first wrong one."""
    new = replace(thresholds)
    if eot is not None:
        new.eot_threshold = _within("eot_threshold", eot, *EOT[:2])
    if eager is not None:
        new.eager_eot_threshold = _within("eager_eot_threshold", eager, *EAGER)
    if timeout is not None:
        new.eot_timeout_ms = int(_within("eot_timeout_ms", timeout, *TIMEOUT_MS[:2]))
    if new.eager_eot_threshold is not None and new.eager_eot_threshold > new.eot_threshold:
        raise ProtocolError("invalid_config", "'eager_eot_threshold' must not exceed 'eot_threshold'")
    return new


@dataclass
class Options:
    encoding: str = "pcm16"
    sample_rate: int = audio.SAMPLE_RATE
    thresholds: Thresholds = field(default_factory=Thresholds)
    phrases: tuple[Phrase, ...] = ()
    keyterms: tuple[str, ...] = ()  # as the client wrote them, for ConfigureSuccess
    language: str | None = None  # Flux names none: a multilingual model identifies it (its default)


def _within(name: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ProtocolError("invalid_config", f"'{name}' must be a number from {low:g} to {high:g}")
    return value


def _number(query: dict[str, str], name: str) -> float | None:
    if name not in query:
        return None
    try:
        return float(query[name])
    except ValueError:
        raise ProtocolError("invalid_config", f"'{name}' must be a number") from None


def parse_options(query: dict[str, str], params: Sequence[tuple[str, str]]) -> Options:
    if query.get("redact", "false") != "false":
        raise ProtocolError("invalid_config", "not supported by this server: redact")
    if unknown := sorted(set(query) - KNOWN):
        log.info("%s: unknown query parameter(s) accepted and ignored: %s", PATH, ascii(unknown)[:300])
    encoding = query.get("encoding", "linear16")
    if encoding not in ENCODINGS:
        raise ProtocolError("invalid_config", f"'encoding' must be one of {', '.join(ENCODINGS)}")
    options = Options(encoding=ENCODINGS[encoding])
    options.sample_rate = parse_sample_rate(query.get("sample_rate", str(audio.SAMPLE_RATE)), from_url=True)
    options.thresholds = updated(Thresholds(), *(_number(query, name) for name in
                                                 ("eot_threshold", "eager_eot_threshold", "eot_timeout_ms")))
    options.phrases = parse_phrases([(name, value) for name, value in params if name == "keyterm"])
    options.keyterms = tuple(value for name, value in params if name == "keyterm")
    return options


class ConfigureThresholds(msgspec.Struct):
    eot_threshold: float | None = None
    eager_eot_threshold: float | None = None
    eot_timeout_ms: float | None = None


class Configure(Message, tag="Configure"):
    thresholds: ConfigureThresholds | None = None
    keyterms: list[str] | None = None
    language_hints: list[str] | None = None
    numerals: bool | None = None


class ForceEndTurn(Message, tag="ForceEndTurn"):
    pass


SCHEMA = Schema(Configure, ForceEndTurn, CloseStream, KeepAlive)
# text tokens of a turn its sentence-end check reads: its last few words (sentence_ends.ORDER),
# whatever the turn's length (decoding a whole caption-long turn at every result grows with it)
TURN_TAIL = 48


class FluxSession(Session):
    def __init__(self, connection: Connection, options: Options) -> None:
        super().__init__(connection, options)
        self.options = options
        self.segments.rate = options.sample_rate
        self.segments.phrases = options.phrases
        self.request_id = str(uuid.uuid4())
        self._sequence = 0
        self._words = WordTracker(self.info)
        self._pieces = pieces(self.info.tokenizer)
        self.turns = TurnTaking(options.thresholds)
        self._turn_words: list[dict] = []  # the complete words of the turn in progress
        self._turn_tokens: list[int] = []  # its last TURN_TAIL text tokens, the last word's too
        self._closing = False
        self._manual = False  # the segment ends for ForceEndTurn

    def open(self) -> None:
        self._send({"type": "Connected", "request_id": self.request_id})

    def _send(self, message: dict) -> None:
        self.post(self._numbered(message))

    def _numbered(self, message: dict) -> dict:
        message["sequence_id"], self._sequence = self._sequence, self._sequence + 1
        return message

    # -- client messages -----------------------------------------------------------------
    async def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            samples = decode_bytes(message, self.options.encoding)
            if self._closing:
                raise ProtocolError("stream_closed", "audio after CloseStream")
            await self.segments.push(samples)
            return
        event = SCHEMA.decode(message)
        if isinstance(event, Configure):
            self._configure(event)
        elif isinstance(event, ForceEndTurn):
            self._end_segment(manual=True)
        elif isinstance(event, CloseStream):
            self._close_stream()

    def _configure(self, event: Configure) -> None:
        reply = {"type": "ConfigureFailure", "request_id": self.request_id}
        try:
            self._apply(event)
        except ProtocolError as exc:
            self._send({**reply, "code": "INVALID_CONFIGURATION", "description": exc.message})
            return
        self._send({"type": "ConfigureSuccess", "request_id": self.request_id,
                    "thresholds": asdict(self.options.thresholds), "keyterms": list(self.options.keyterms)})

    def _apply(self, event: Configure) -> None:
        """The new settings, all or none."""
        if event.keyterms is not None and tuple(event.keyterms) != self.options.keyterms:
            raise ProtocolError("invalid_config", "keyterms are fixed for a connection here: set them in the URL")
        if event.language_hints and any(not hint.lower().startswith("en") for hint in event.language_hints):
            raise ProtocolError("invalid_config", "this model transcribes English only")
        given = event.thresholds or ConfigureThresholds()
        self.options.thresholds = self.turns.thresholds = updated(
            self.options.thresholds, given.eot_threshold, given.eager_eot_threshold, given.eot_timeout_ms)

    def _end_segment(self, manual: bool) -> bool:
        """End the current segment's input, or the audio waiting behind it; False when there is no
        audio to end. `manual`: its final result ends the turn (ForceEndTurn)."""
        ended = self.segments.end_input(lambda: self._end_segment(manual))
        if ended is State.OPEN:
            self._manual = manual
        return ended is not None

    def _close_stream(self) -> None:
        """CloseStream: once every segment is transcribed (its turn ended), the close."""
        self._closing = True
        if self._end_segment(manual=False):
            self.segments.defer(self._close_stream)
        else:
            self.connection.end("completed")

    # -- engine results ------------------------------------------------------------------
    def on_result(self, segment: Segment, result: StreamResult) -> None:
        now = segment.heard_until(result)
        for part, p, written in self._parts(result):
            text = [(token, segment.offset + t) for token, t in zip(part.token_ids, part.token_times)
                    if token in self._pieces.text]
            self._turn_tokens = (self._turn_tokens + [token for token, _ in text])[-TURN_TAIL:]
            events = self.turns.follow(text[-1][1] if text else None, p,
                                       None if written is None else segment.offset + written, now,
                                       self._pieces.decode(self._turn_tokens) if text else "")
            ends = any(event.name == "EndOfTurn" for event in events)
            self._turn_words += self._words.update(part, now, close=ends, offset=segment.offset)
            self._post(events, now)
        if result.is_final and self._manual:  # as Deepgram's, CloseStream ends no turn: its last Update stands
            self._manual = False
            self._post(self.turns.end(now, "manual"), now)

    def _parts(self, result: StreamResult) -> list[tuple[StreamResult, float, float | None]]:
        """The result cut after each <EOU>: each part, the <EOU> probability at its end (the one it
        was written with, then the result's since its last word) and when the model wrote it (stream
        seconds; None for the last part)."""
        cuts = [i + 1 for i, token in enumerate(result.token_ids) if token == self._pieces.eou_id]
        parts, start = [], 0
        for cut in cuts:
            parts.append((self._slice(result, start, cut), result.token_confidences[cut - 1], result.token_times[cut - 1]))
            start = cut
        if start < len(result.token_ids) or not parts:
            parts.append((self._slice(result, start, len(result.token_ids)), result.end_of_utterance, None))
        return parts

    @staticmethod
    def _slice(result: StreamResult, start: int, end: int) -> StreamResult:
        return replace(result, token_ids=result.token_ids[start:end], token_times=result.token_times[start:end],
                       token_confidences=result.token_confidences[start:end])

    def _post(self, events: list[Event], now: float) -> None:
        for event in events:
            words = self._turn_words + self._words.open_word(now)
            message = {
                "type": "TurnInfo",
                "request_id": self.request_id,
                "event": event.name,
                "turn_index": event.index,
                "audio_window_start": round(event.start, 3),
                "audio_window_end": round(now, 3),
                "transcript": join_words(w["word"] for w in words),
                "words": words,
                "end_of_turn_confidence": round(event.confidence, 4),
            }
            if event.trigger is not None:
                message["trigger"] = event.trigger
                self._turn_words, self._turn_tokens, self._words = [], [], WordTracker(self.info)
            self._send(message)

    def error_message(self, code: str, message: str) -> dict:
        return self._numbered({"type": "Error", "code": code, "description": message})


PROTOCOL = Protocol(name="flux", metric="flux", door="ws", path=PATH, handshake=handshake_for(parse_options, "keyterm"),
                    session=FluxSession)
