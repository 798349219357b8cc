"""`POST /v1/audio/transcriptions`: OpenAI's file transcription API, as the openai SDK's
`client.audio.transcriptions.create` speaks it (also vLLM's and NVIDIA NIM's).

A multipart form: `file` (the audio), `response_format` (json, text, verbose_json, srt, vtt, and
diarized_json: the transcript in speaker turns, as OpenAI's gpt-4o-transcribe-diarize writes it;
the server needs `--diarizer`), `model` (gpt-4o-transcribe-diarize: srt and vtt name each cue's
speaker, which OpenAI does not offer; any other name is accepted and ignored),
`timestamp_granularities[]` (word, segment: verbose_json's `words` and `segments`), `stream` (true:
server-sent events `transcript.text.delta` as the text is decoded, with diarized_json
`transcript.text.segment` as each speaker turn is complete, then `transcript.text.done`),
`keywords[]` and `prompt` (key phrases: server/streams/phrases.py), `language` (what a multilingual
model transcribes; English models take English only). Accepted and ignored: `temperature` and the
other hints in IGNORED. Errors are OpenAI's
`{"error": {message, type, param, code}}`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import trio

from ... import subtitles
from ...text import join_words
from ...engine.phrases import Phrase
from ..context import ServerContext
from ..streams import wire
from ..streams.guard import bearer_token
from ..streams.language import checked_language
from ..streams.phrases import FieldPhraseError, openai_phrases
from ..streams.speakers import checked_speakers
from ..transport.codes import ProtocolError
from .files.exchange import Exchange, UploadError
from .files.form import FormSink
from .files.spool import Spool
from .files.transcript import FileTranscript
from .files.upload import check_key, open_audio, transcribe, upload_slot

PATH = "/v1/audio/transcriptions"
PROTOCOL = "openai_files"
JSON = "application/json"
FORMATS = {
    "json": JSON,
    "text": "text/plain",
    "verbose_json": JSON,
    "srt": "application/x-subrip",
    "vtt": "text/vtt",
    "diarized_json": JSON,
}
DIARIZING_MODEL = "gpt-4o-transcribe-diarize"
GRANULARITIES = ("word", "segment")
IGNORED = {
    "temperature", "include[]", "languages[]", "known_speaker_names[]",
    "known_speaker_references[]",
}
KNOWN = {"file", "model", "response_format", "timestamp_granularities[]", "stream", "keywords[]", "prompt", "language",
         *IGNORED}
# verbose_json's `language` is a name, as Whisper writes it
LANGUAGE_NAMES = {"en": "english", "es": "spanish", "de": "german", "fr": "french", "it": "italian",
                  "pt": "portuguese", "nl": "dutch"}


@dataclass
class Options:
    response_format: str = "json"
    words: bool = False
    segments: bool = True
    stream: bool = False
    phrases: tuple[Phrase, ...] = ()
    language: str | None = None
    diarize: bool = False  # each word's speaker: diarized_json, or srt / vtt asked of the diarizing model


async def handle(ctx: ServerContext, exchange: Exchange) -> None:
    """Answer the upload; refusals are raised (UploadError) and answered by `refuse`."""
    with upload_slot(ctx, PROTOCOL):
        check_key(ctx, bearer_token(exchange.headers) or exchange.query.get("api_key"))
        with Spool() as spool:
            form = FormSink(exchange.headers.get("content-type", ""), spool)
            await exchange.read_body(form.write, ctx.config.max_upload_bytes)
            await trio.to_thread.run_sync(form.close)
            options = parse_options(form.fields)
            options.language = _checked_language(ctx, options.language)
            options.diarize = _diarize(ctx, options.response_format, _one(form.fields, "model", ""))
            reader = await open_audio(ctx, spool)
            work = partial(_stream, ctx, exchange, reader, options) if options.stream else partial(
                _answer, ctx, exchange, reader, options)
            try:
                await exchange.while_connected(work)
            finally:
                reader.close()


def parse_options(fields: dict[str, list[str]]) -> Options:
    for name in fields:
        if name not in KNOWN and not name.startswith("chunking_strategy"):
            raise UploadError(400, "unknown_parameter", f"unrecognized request argument supplied: {name[:60]}", name[:60])
    options = Options()
    response_format = _one(fields, "response_format", "json")
    if response_format not in FORMATS:
        raise UploadError(400, "invalid_value", f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    options.response_format = response_format
    granularities = fields.get("timestamp_granularities[]", ["segment"])
    if any(g not in GRANULARITIES for g in granularities):
        raise UploadError(400, "invalid_value", "timestamp_granularities[] takes word and segment",
                          "timestamp_granularities[]")
    options.words, options.segments = "word" in granularities, "segment" in granularities
    stream = _one(fields, "stream", "false")
    if stream not in ("true", "false"):
        raise UploadError(400, "invalid_value", "stream must be true or false", "stream")
    options.stream = stream == "true"
    if options.stream and response_format not in ("json", "text", "diarized_json"):
        raise UploadError(400, "invalid_value", "stream=true sends events: use response_format json, text or "
                          "diarized_json", "response_format")
    try:
        options.phrases = openai_phrases(fields.get("keywords[]", []), _one(fields, "prompt", ""))
    except FieldPhraseError as exc:
        param = "keywords[]" if exc.field == "keywords" else exc.field
        raise UploadError(400, exc.code, f"{param}: {exc.message}", param) from None
    options.language = _one(fields, "language", "") or None
    return options


def _diarize(ctx: ServerContext, response_format: str, model: str) -> bool:
    """Whether the answer has speakers: diarized_json needs them (a server without a diarizer
    refuses it); srt and vtt name them when the diarizing model is asked for and a diarizer is there."""
    if response_format == "diarized_json":
        try:
            checked_speakers(ctx.engine.info, True, None)
        except ProtocolError as exc:
            raise UploadError(400, exc.code, exc.message, "response_format") from None
        return True
    return response_format in ("srt", "vtt") and model == DIARIZING_MODEL and ctx.engine.info.speakers > 0


def _checked_language(ctx: ServerContext, language: str | None) -> str | None:
    try:
        return checked_language(ctx.engine, language)
    except ProtocolError as exc:
        raise UploadError(400, exc.code, exc.message, "language") from None


def _one(fields: dict[str, list[str]], name: str, default: str) -> str:
    values = fields.get(name, [default])
    if len(values) > 1:
        raise UploadError(400, "invalid_value", f"{name} is given more than once", name)
    return values[0].strip()


async def _answer(ctx: ServerContext, exchange: Exchange, reader, options: Options) -> None:
    transcript = await transcribe(exchange, reader, PROTOCOL, phrases=options.phrases, language=options.language,
                                  diarize=options.diarize)
    await exchange.respond(200, render(transcript, options), FORMATS[options.response_format])


async def _stream(ctx: ServerContext, exchange: Exchange, reader, options: Options) -> None:
    """Server-sent events; the answer starts with the first text, so that a file refused before
    any text (queue full, undecodable audio) still gets an HTTP error status."""

    async def delta(text: str) -> None:
        if not exchange.responded:
            await exchange.open_events()
        await exchange.send_event(wire.dumps({"type": "transcript.text.delta", "delta": text}))

    segments = DiarizedSegments()

    async def completed(utterances: list) -> None:  # diarized_json: each speaker turn once it is complete
        for segment in segments.of(utterances):
            if not exchange.responded:
                await exchange.open_events()
            await exchange.send_event(wire.dumps(segment))

    transcript = await transcribe(exchange, reader, PROTOCOL, delta, options.phrases, options.language,
                                  options.diarize, completed if options.diarize else None)
    if not exchange.responded:
        await exchange.open_events()
    await exchange.send_event(wire.dumps({"type": "transcript.text.done", "text": transcript.text}))
    await exchange.close_events()


def render(transcript: FileTranscript, options: Options) -> bytes:
    kind = options.response_format
    if kind == "text":
        return (transcript.text + "\n").encode()
    if kind in ("srt", "vtt"):
        cues = subtitles.cues(u.words for u in transcript.utterances)
        return (subtitles.srt(cues) if kind == "srt" else subtitles.vtt(cues)).encode()
    usage = {"type": "duration", "seconds": round(transcript.duration, 3)}
    if kind == "json":
        return wire.dumps({"text": transcript.text, "usage": usage})
    if kind == "diarized_json":
        return wire.dumps({"task": "transcribe", "duration": round(transcript.duration, 3), "text": transcript.text,
                           "segments": DiarizedSegments().of(transcript.utterances), "usage": usage})
    body = {"task": "transcribe", "language": language_name(transcript.language or options.language),
            "duration": round(transcript.duration, 3),
            "text": transcript.text}
    if options.segments:
        body["segments"] = [_segment(i, u) for i, u in enumerate(transcript.utterances)]
    if options.words:
        body["words"] = [{key: w[key] for key in ("word", "start", "end")} for w in transcript.words]
    return wire.dumps(body | {"usage": usage})


class DiarizedSegments:
    """A transcript in speaker turns, as OpenAI's diarized_json and its `transcript.text.segment`
    events: a turn never spans two utterances, speakers are named A, B, ... in the order they first
    speak, ids count up; utterances are given in order, all at once or as they complete."""

    def __init__(self) -> None:
        self._name = subtitles.SpeakerNames()
        self._count = 0

    def of(self, utterances: list) -> list[dict]:
        out = []
        for turn in (turn for u in utterances for turn in subtitles.speaker_turns(u.words)):
            out.append({"type": "transcript.text.segment", "id": f"seg_{self._count}", "start": turn[0]["start"],
                        "end": turn[-1]["end"], "text": join_words(w["word"] for w in turn),
                        "speaker": self._name(turn[0]["speaker"])})
            self._count += 1
        return out


def language_name(language: str | None) -> str:
    """A language as verbose_json names it ("de-DE" -> "german"); a model without languages: english."""
    if language is None:
        return "english"
    return LANGUAGE_NAMES.get(language.split("-")[0].lower(), language)


def _segment(i: int, utterance) -> dict:
    """Whisper's segment fields: `avg_logprob` is the mean log probability of its tokens; the decoding
    statistics we do not compute are neutral values."""
    logprob = sum(map(math.log, utterance.confidences)) / len(utterance.confidences)
    return {
        "id": i, "seek": 0, "start": utterance.start, "end": utterance.end, "text": utterance.text,
        "tokens": utterance.token_ids, "temperature": 0.0, "avg_logprob": round(logprob, 4), "compression_ratio": 1.0,
        "no_speech_prob": 0.0,
    }


async def refuse(exchange: Exchange, exc: UploadError) -> None:
    """The error in OpenAI's shape: as the answer, or as the last event of a started stream."""
    kind = "requests" if exc.status == 429 else "server_error" if exc.status >= 500 else "invalid_request_error"
    body = wire.dumps({"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}})
    if exchange.responded:
        await exchange.send_event(body)
        await exchange.close_events()
        return
    retry = [("retry-after", "1")] if exc.status in (429, 503) else []
    await exchange.respond(exc.status, body, JSON, retry)
