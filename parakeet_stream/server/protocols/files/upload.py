"""What every HTTP upload goes through, whatever its API: the gate (draining, uploads at once,
the API key), the decoding of the spooled audio, and its transcription through `feed_file`, with
every failure an UploadError the API module words in its own error shape.

Memory per upload: the spool's MEMORY_BYTES and one write batch while the body arrives, then
the stream's backlog budget (`--max-backlog-seconds`) and one decoded block; the rest is on disk.
"""
from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
import trio

from ....audio import EMPTY, AudioError
from ....engine import QueueFull
from ....engine.phrases import Phrase, PhraseError
from ...context import ServerContext
from ...streams.guard import backlog_samples, key_ok
from .decode import AudioReader
from .exchange import Exchange, UploadError
from .feed import feed_file, in_worker_thread
from .spool import Spool
from .transcript import FileTranscript, TranscriptBuilder, Utterance


@contextlib.contextmanager
def upload_slot(ctx: ServerContext, protocol: str) -> Iterator[None]:
    """Hold one of the `max_uploads` places; an upload counts as an open connection (a drain
    waits for it)."""
    if ctx.shutdown.is_set():
        raise UploadError(503, "server_shutdown", "the server is shutting down: retry on another replica")
    if ctx.open_uploads >= ctx.config.max_uploads:
        raise UploadError(429, "too_many_uploads", f"{ctx.config.max_uploads} uploads are being transcribed: retry later")
    ctx.open_uploads += 1
    ctx.open_sessions += 1
    ctx.metrics.connections.labels(protocol).inc()
    try:
        yield
    finally:
        ctx.open_uploads -= 1
        ctx.open_sessions -= 1
        ctx.metrics.connections.labels(protocol).dec()


def check_key(ctx: ServerContext, key: str | None) -> None:
    if not key_ok(ctx.config.api_key, key):
        raise UploadError(401, "unauthorized", "a valid API key is required")


async def open_audio(ctx: ServerContext, spool: Spool, encoding: str | None = None, rate: int | None = None) -> AudioReader:
    """The spooled upload as audio (its header read in a worker thread); too long: 413."""
    if spool.size == 0:
        raise UploadError(400, "invalid_audio", EMPTY, "file")
    spool.rewind()
    try:
        reader = await trio.to_thread.run_sync(AudioReader, spool.file, encoding, rate)
    except AudioError as exc:
        raise UploadError(400, "invalid_audio", str(exc), "file") from None
    limit = ctx.config.max_upload_seconds
    if reader.duration > limit:
        reader.close()
        raise UploadError(413, "audio_too_long", f"the audio lasts {reader.duration:.0f} s; at most {limit:g} s", "file")
    return reader


async def transcribe(
    exchange: Exchange,
    reader: AudioReader,
    protocol: str,
    on_text: Callable[[str], Awaitable[None]] | None = None,
    phrases: tuple[Phrase, ...] = (),
    language: str | None = None,
    diarize: bool = False,
    on_utterances: Callable[[list[Utterance]], Awaitable[None]] | None = None,
) -> FileTranscript:
    """Transcribe the whole file in `language` (checked: engine.check_language), boosting `phrases`,
    each word with its speaker where `diarize`; `on_text` gets each new piece of text as it is
    decoded, `on_utterances` each utterance once it is complete (TranscriptBuilder.settled). The
    exchange keeps the audio seconds and results for the access log."""
    ctx = exchange.ctx
    engine = ctx.engine
    builder = TranscriptBuilder(engine.info, diarize)
    cap = int(ctx.config.max_upload_seconds * engine.info.sample_rate)  # a header may understate the length
    read = in_worker_thread(_capped(reader.read, cap))

    async def on_result(result) -> None:
        exchange.results += 1
        delta = builder.add(result)
        if on_text is not None and delta:
            await on_text(delta)
        if on_utterances is not None and (done := builder.settled()):
            await on_utterances(done)

    ctx.metrics.streams.labels(protocol).inc()
    try:
        samples = await feed_file(engine, read, on_result, backlog_samples(ctx.config), phrases=phrases,
                                  language=language, diarize=diarize)
    except QueueFull:
        raise UploadError(503, "queue_full", "every slot is busy and the waiting queue is full: retry later") from None
    except PhraseError as exc:  # a phrase too many tokens long for the model
        raise UploadError(400, exc.code, exc.message) from None
    except AudioError as exc:
        raise UploadError(400, "invalid_audio", str(exc), "file") from None
    transcript = builder.finish(samples)
    exchange.audio_seconds = transcript.duration
    if transcript.error:
        raise UploadError(500, "inference_error", "inference failed for this file")
    if on_utterances is not None and (done := builder.settled()):
        await on_utterances(done)
    return transcript


def _capped(read: Callable[[int], np.ndarray], cap: int) -> Callable[[int], np.ndarray]:
    """`read`, ending after `cap` samples."""
    taken = 0

    def capped(n: int) -> np.ndarray:
        nonlocal taken
        samples = read(min(n, cap - taken)) if taken < cap else np.zeros(0, np.float32)
        taken += len(samples)
        return samples

    return capped
