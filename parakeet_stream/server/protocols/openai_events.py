"""OpenAI Realtime's client events (transcription sessions) as types, and the session settings
a `session.update` sets: only these typed, bounded values are echoed in `session.updated`.

The types follow the `openai` SDK's (3.x); fields it has that we do not use are skipped. Numbers
and strings that are echoed are bounded, so that what we send back is always valid JSON of a
sensible size (an integer beyond 64 bits, a 1 MB prompt or a 300-deep array are refused).
The transcription's `keywords` and `prompt` become the session's key phrases (server/streams/phrases.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ...engine.phrases import MAX_PHRASES, Phrase
from ..streams.phrases import FieldPhraseError, openai_phrases
from ..streams.schema import InvalidField, Message, Schema
from ..streams.wire import parse_sample_rate
from ..transport.codes import ProtocolError

DEFAULT_RATE = 24000  # OpenAI's PCM rate
G711_FORMATS = {"audio/pcmu": "mulaw", "audio/pcma": "alaw"}
FORMAT_PATH = "session.audio.input.format"
TURN_PATH = "session.audio.input.turn_detection"
TRANSCRIPTION_PATH = "session.audio.input.transcription"
FORMAT_HINT = "'format.type' must be audio/pcm, audio/pcmu or audio/pcma"
TURN_HINT = "'turn_detection' must be null, server_vad or semantic_vad"

EventId = Annotated[str, Meta(max_length=512)]
Millis = Annotated[int, Meta(ge=0, le=3_600_000)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
Name = Annotated[str, Meta(max_length=256)]
Names = Annotated[list[Name], Meta(max_length=256)]
Keywords = Annotated[list[str], Meta(max_length=MAX_PHRASES)]  # each checked by check_phrases


class Event(Message, kw_only=True):
    event_id: EventId | None = None


class Append(Event, tag="input_audio_buffer.append"):
    audio: bytes  # base64 in the JSON


class Commit(Event, tag="input_audio_buffer.commit"):
    pass


class Clear(Event, tag="input_audio_buffer.clear"):
    pass


class Format(msgspec.Struct):
    type: str = "audio/pcm"
    rate: int = DEFAULT_RATE  # audio/pcm only; our extension: any rate 4-192 kHz


class ServerVad(msgspec.Struct, tag_field="type", tag="server_vad"):
    create_response: bool | None | UnsetType = UNSET
    idle_timeout_ms: Millis | None | UnsetType = UNSET
    interrupt_response: bool | None | UnsetType = UNSET
    prefix_padding_ms: Millis = 300
    silence_duration_ms: Millis = 500
    threshold: Fraction = 0.5


class SemanticVad(msgspec.Struct, tag_field="type", tag="semantic_vad"):
    create_response: bool | None | UnsetType = UNSET
    eagerness: Literal["low", "medium", "high", "auto"] | None | UnsetType = UNSET
    interrupt_response: bool | None | UnsetType = UNSET


class Transcription(msgspec.Struct):
    """Accepted and echoed; `keywords` and `prompt` name the key phrases, `language` what a
    multilingual model transcribes, the rest only tunes OpenAI's models."""

    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None | UnsetType = UNSET
    keywords: Keywords | None | UnsetType = UNSET
    language: Name | None | UnsetType = UNSET
    languages: Names | None | UnsetType = UNSET
    model: Name | None | UnsetType = UNSET
    prompt: Annotated[str, Meta(max_length=4096)] | None | UnsetType = UNSET


class NoiseReduction(msgspec.Struct):
    """Accepted and echoed, not applied."""

    strength: Annotated[float, Meta(ge=0.0, le=1e6)] | None | UnsetType = UNSET
    type: Literal["near_field", "far_field"] | None | UnsetType = UNSET


class AudioInput(msgspec.Struct):
    format: Format | UnsetType = UNSET  # UNSET: not in the update, unchanged
    turn_detection: ServerVad | SemanticVad | None | UnsetType = UNSET
    transcription: Transcription | None | UnsetType = UNSET
    noise_reduction: NoiseReduction | None | UnsetType = UNSET


class SessionAudio(msgspec.Struct):
    input: AudioInput | None = None


class TranscriptionSession(msgspec.Struct, tag_field="type", tag="transcription"):
    audio: SessionAudio | None = None


class SessionUpdate(Event, tag="session.update"):
    session: TranscriptionSession
    codes = {f"{TRANSCRIPTION_PATH}.keywords": "invalid_phrases"}  # a prompt is text first: its own limits


SCHEMA = Schema(
    Append, Commit, Clear, SessionUpdate, unknown="Unsupported event type:",
    hints={
        "session.type": "only transcription sessions are served: session.type must be 'transcription'",
        f"{FORMAT_PATH}.type": FORMAT_HINT,
        TURN_PATH: TURN_HINT,
        f"{TURN_PATH}.type": TURN_HINT,
    },
)


class Envelope(msgspec.Struct):
    """What an error answers with when its event did not decode: the client's event_id."""

    event_id: EventId | None = None


ENVELOPE = msgspec.json.Decoder(Envelope)


def client_event_id(message: str) -> str | None:
    try:
        return ENVELOPE.decode(message).event_id
    except (msgspec.MsgspecError, RecursionError):
        return None


@dataclass
class AudioFormat:
    encoding: str = "pcm16"  # wire.decode_bytes name
    rate: int = DEFAULT_RATE

    @classmethod
    def of(cls, value: Format) -> AudioFormat:
        if value.type in G711_FORMATS:
            return cls(G711_FORMATS[value.type], 8000)
        if value.type != "audio/pcm":
            raise InvalidField("invalid_field", FORMAT_HINT, f"{FORMAT_PATH}.type")
        try:
            return cls("pcm16", parse_sample_rate(value.rate))
        except ProtocolError as exc:
            message = exc.message.replace("'sample_rate'", "'format.rate'")
            raise InvalidField("invalid_field", message, f"{FORMAT_PATH}.rate") from None

    def describe(self) -> dict:
        if self.encoding == "pcm16":
            return {"type": "audio/pcm", "rate": self.rate}
        return {"type": next(name for name, enc in G711_FORMATS.items() if enc == self.encoding)}


@dataclass
class Settings:
    """A transcription session's settings: what session.update sets, session.created/updated echo."""

    format: AudioFormat = field(default_factory=AudioFormat)
    turn_detection: ServerVad | SemanticVad | None = field(default_factory=ServerVad)
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None
    phrases: tuple[Phrase, ...] = ()  # what the transcription's keywords and prompt name

    def updated(self, session: TranscriptionSession, holds_audio: bool) -> Settings:
        """These settings with a session.update's changes, once every field is valid. New key
        phrases apply from the next item on."""
        audio_input = (session.audio and session.audio.input) or AudioInput()
        changes = {
            name: value for name in ("turn_detection", "transcription", "noise_reduction")
            if (value := getattr(audio_input, name)) is not UNSET
        }
        if audio_input.format is not UNSET:
            changes["format"] = AudioFormat.of(audio_input.format)
            if changes["format"] != self.format and holds_audio:
                raise InvalidField(
                    "bad_state", "the audio format can only change while the input buffer is empty", FORMAT_PATH
                )
        if "transcription" in changes:
            changes["phrases"] = transcription_phrases(changes["transcription"])
        return replace(self, **changes)

    @property
    def language(self) -> str | None:
        """The transcription's language as asked (None: the model's default)."""
        language = self.transcription.language if self.transcription is not None else None
        return language if isinstance(language, str) else None

    def describe(self) -> dict:
        audio_input = {
            "format": self.format.describe(),
            "noise_reduction": msgspec.to_builtins(self.noise_reduction),
            "transcription": msgspec.to_builtins(self.transcription),
            "turn_detection": msgspec.to_builtins(self.turn_detection),
        }
        return {"type": "transcription", "audio": {"input": audio_input}}


def transcription_phrases(transcription: Transcription | None) -> tuple[Phrase, ...]:
    if transcription is None:
        return ()
    try:
        return openai_phrases(transcription.keywords or [], transcription.prompt or None)
    except FieldPhraseError as exc:
        raise InvalidField(exc.code, f"{exc.field}: {exc.message}", f"{TRANSCRIPTION_PATH}.{exc.field}") from None
