"""`POST /v1/listen` on the HTTP port: Deepgram's pre-recorded API, as the official deepgram-sdk's
`listen.v1.media.transcribe_file` speaks it.

The body is the audio itself: a container (wav, flac, ogg, mp3: see files/decode.py), or headerless
audio described by `encoding` and `sample_rate`. The query parameters are the live endpoint's
(protocols/deepgram.py, same checks, key phrases included), plus `utterances`, `paragraphs` and `utt_split` (accepted,
ignored: utterances end at the model's end of utterance). A JSON body (`{"url": ...}`, the SDK's
`transcribe_url`) and `callback` are refused: this server fetches and calls nothing. The answer
is Deepgram's: `metadata`, and `results.channels[0].alternatives[0]` with `transcript`,
`confidence` and `words` (`paragraphs` and `results.utterances` when asked for; a multilingual
model's `languages` with `language=multi`).
"""
from __future__ import annotations

import datetime
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from ...engine.languages import AUTO
from ...engine.phrases import Phrase
from ..context import ServerContext
from ..streams import wire
from ..streams.language import checked_language
from ..streams.speakers import checked_speakers
from ..streams.words import transcript_confidence
from ..transport.codes import ProtocolError
from . import deepgram
from .files.exchange import Exchange, UploadError
from .files.spool import Spool
from .files.transcript import FileTranscript
from .files.upload import check_key, open_audio, transcribe, upload_slot

PATH = deepgram.PATH
PROTOCOL = "deepgram_files"
JSON = "application/json"
FILE_ONLY = ("utterances", "paragraphs", "utt_split")
# our codes in Deepgram's words where Deepgram has its own
ERR_CODES = {"unauthorized": "INVALID_AUTH", "invalid_config": "INVALID_QUERY_PARAMETER",
             "file_too_large": "PAYLOAD_TOO_LARGE", "too_many_uploads": "TOO_MANY_REQUESTS",
             "invalid_phrases": "INVALID_QUERY_PARAMETER", "unsupported_language": "INVALID_QUERY_PARAMETER",
             "diarization_unavailable": "INVALID_QUERY_PARAMETER"}


@dataclass
class Options:
    encoding: str | None = None  # None: a container
    sample_rate: int | None = None
    utterances: bool = False
    paragraphs: bool = False
    phrases: tuple[Phrase, ...] = ()
    language: str | None = None
    diarize: bool = False


async def handle(ctx: ServerContext, exchange: Exchange) -> None:
    """Answer the upload; refusals are raised (UploadError) and answered by `refuse`."""
    with upload_slot(ctx, PROTOCOL):
        key, _ = deepgram.credentials(exchange.headers, [])
        check_key(ctx, key or exchange.query.get("api_key"))
        options = parse_options(exchange.query, exchange.params)
        try:
            options.language = checked_language(ctx.engine, options.language)
            checked_speakers(ctx.engine.info, options.diarize, None)
        except ProtocolError as exc:
            raise UploadError(400, exc.code, exc.message) from None
        if exchange.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json":
            raise UploadError(400, "url_not_supported", "this server fetches nothing: send the audio itself as "
                              "the request body (Content-Type: audio/* or application/octet-stream)")
        with Spool() as spool:
            await exchange.read_body(spool.write, ctx.config.max_upload_bytes)
            reader = await open_audio(ctx, spool, options.encoding, options.sample_rate)
            try:
                await exchange.while_connected(partial(_answer, ctx, exchange, reader, options, spool))
            finally:
                reader.close()


async def refuse(exchange: Exchange, exc: UploadError) -> None:
    """The error in Deepgram's shape (unless the answer already went out: then nothing can be said)."""
    if exchange.responded:
        return
    body = {"err_code": ERR_CODES.get(exc.code, exc.code.upper()), "err_msg": exc.message, "request_id": str(uuid.uuid4())}
    await exchange.respond(exc.status, wire.dumps(body), JSON, [("retry-after", "1")] if exc.status in (429, 503) else [])


def parse_options(query: dict[str, str], params: Sequence[tuple[str, str]]) -> Options:
    """The live endpoint's parameters (checked by its parser) and the pre-recorded ones."""
    if "callback" in query:
        raise _invalid("callbacks are not supported: the transcript is this request's response")
    live = {k: v for k, v in query.items() if k not in FILE_ONLY}
    container = "encoding" not in live
    if container:  # the live parser wants a raw encoding: give it one to check the rest
        live |= {"encoding": "linear16", "sample_rate": "16000"}
    try:
        parsed = deepgram.parse_options(live, params)
    except ProtocolError as exc:
        raise _invalid(exc.message) from None
    options = Options(
        utterances=_boolean(query, "utterances"), paragraphs=_boolean(query, "paragraphs"), phrases=parsed.phrases,
        language=parsed.language, diarize=parsed.diarize,
    )
    if not container:
        options.encoding, options.sample_rate = parsed.encoding, parsed.sample_rate
    if "utt_split" in query:
        try:
            float(query["utt_split"])
        except ValueError:
            raise _invalid("'utt_split' must be a number of seconds") from None
    return options


def _boolean(query: dict[str, str], name: str) -> bool:
    value = query.get(name, "false")
    if value not in ("true", "false"):
        raise _invalid(f"'{name}' must be true or false")
    return value == "true"


def _invalid(message: str) -> UploadError:
    return UploadError(400, "invalid_config", message)


async def _answer(ctx: ServerContext, exchange: Exchange, reader, options: Options, spool: Spool) -> None:
    transcript = await transcribe(exchange, reader, PROTOCOL, phrases=options.phrases, language=options.language,
                                  diarize=options.diarize)
    body = response(ctx, transcript, options, spool.sha256, str(uuid.uuid4()))
    await exchange.respond(200, wire.dumps(body), JSON)


def response(ctx: ServerContext, transcript: FileTranscript, options: Options, sha256: str, request_id: str) -> dict:
    alternative = {
        "transcript": transcript.text,
        "confidence": transcript_confidence(transcript.words),
        "words": [_word(w) for w in transcript.words],
    }
    if options.language == AUTO:  # Deepgram's field for code-switching (language=multi)
        alternative["languages"] = [transcript.language] if transcript.language else []
    if options.paragraphs:
        alternative["paragraphs"] = _paragraphs(transcript)
    results: dict = {"channels": [{"alternatives": [alternative]}]}
    if options.utterances:
        results["utterances"] = [
            {"start": u.start, "end": u.end, "confidence": transcript_confidence(u.words), "channel": 0, "transcript": u.text,
             "words": [_word(w) for w in u.words], "id": str(uuid.uuid4())}
            for u in transcript.utterances
        ]
    return {"metadata": _metadata(ctx, transcript, sha256, request_id), "results": results}


def _word(word: dict) -> dict:
    return {**word, "punctuated_word": word["word"]}


def _paragraphs(transcript: FileTranscript) -> dict:
    """One paragraph per utterance, one sentence each: the model marks utterances, not sentences."""
    paragraphs = [
        {"sentences": [{"text": u.text, "start": u.start, "end": u.end}], "num_words": len(u.words),
         "start": u.start, "end": u.end}
        for u in transcript.utterances
    ]
    return {"transcript": "".join(f"\n{u.text}\n" for u in transcript.utterances), "paragraphs": paragraphs}


def _metadata(ctx: ServerContext, transcript: FileTranscript, sha256: str, request_id: str) -> dict:
    name = ctx.config.model_name
    model = str(uuid.UUID(hashlib.md5(name.encode()).hexdigest()))
    return {
        "transaction_key": "deprecated",
        "request_id": request_id,
        "sha256": sha256,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z"),
        "duration": round(transcript.duration, 3),
        "channels": 1,
        "models": [model],
        "model_info": {model: {"name": name, "version": "parakeet-stream", "arch": "parakeet"}},
    }
