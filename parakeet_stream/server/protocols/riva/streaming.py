"""`StreamingRecognize`: a StreamingRecognitionConfig, then audio, answered while it flows.

A reader task reads the requests and feeds the engine stream; the handler's own task collects
the engine's results and writes the responses. The model's end of utterance ends a final result
and the stream goes on in the same call; the client's half-close ends the audio, and the call
ends (OK) after the last final result.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
from riva.client.proto import riva_asr_pb2 as rasr

from ...context import ServerContext
from ...streams.guard import message_units
from .audio_input import AudioInput
from .engine_stream import RivaStream
from .errors import RivaError
from .options import model_language, parse_config, speaker_count
from .parsing import Malformed
from .rate import MessageRate
from .transcript import STABLE, Piece, Transcript

log = logging.getLogger(__name__)

CHANNEL_TAG = 1  # Riva numbers channels from 1


class StreamingCall:
    def __init__(self, ctx: ServerContext, context: grpc.aio.ServicerContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.context = context
        self.stream: RivaStream | None = None
        self.end: RivaError | None = None  # ends the call after the final result (drain, time limit)
        self._reader: asyncio.Task | None = None
        self._audio: AudioInput | None = None
        self._transcript: Transcript | None = None  # once the config came
        self._request_id = None
        self.results_sent = 0

    async def run(self) -> None:
        # The engine stream (a slot or a queue place) comes first, as a connection's does on the
        # other doors: the number of calls in progress is bounded by slots + queue.
        self.stream = RivaStream(self.ctx.engine, self.config)
        self.ctx.metrics.streams.labels("riva").inc()
        self._reader = asyncio.ensure_future(self._read())
        try:
            await self._answer()
        finally:
            self._reader.cancel()
            self.stream.release()
        if self.end is not None:
            raise self.end

    def on_drain(self) -> None:
        """Shutdown began: a call still waiting for a slot is told to go elsewhere at once."""
        if self.stream is not None:
            self.stream.leave_queue()

    def on_finish(self) -> None:
        """The drain timeout passed: stop reading, finalize, send the final result, end UNAVAILABLE."""
        if self.stream is None or self.stream.finished:
            return
        self._reader.cancel()
        self.end = self.end or RivaError("server_shutdown", "the server shut down: the stream was ended; reconnect")
        self.stream.finalize(self._audio.finish() if self._audio is not None else None)

    async def _answer(self) -> None:
        while not self.stream.finished:
            for result in await self.stream.collect():
                if result.error:
                    raise RivaError("inference_error", "inference failed for this stream")
                self._observe(result)
                if self._transcript is None:  # the client ended before its config
                    continue
                for piece in self._transcript.add(result, self.stream.received_seconds):
                    await self._send(piece)

    async def _read(self) -> None:
        """The config, then audio for the engine; failures end the stream (the writer raises them)."""
        stream = self.stream
        try:
            if await self._configure():
                await self._read_audio()
            else:
                stream.finalize()
        except RivaError as exc:
            stream.fail(exc)
        except Exception:
            log.exception("riva stream reader failed")
            stream.fail(RivaError("internal_error", "internal server error"))

    async def _configure(self) -> bool:
        """Read and apply the StreamingRecognitionConfig (False: the client ended at once)."""
        first = await self._next("streaming_config", self.config.handshake_timeout)
        if first is grpc.aio.EOF:
            return False
        if _kind(first) != "streaming_config":
            raise RivaError("invalid_message", "the first message must carry streaming_config (then audio_content)")
        streaming = first.streaming_config
        options = parse_config(streaming.config, streaming.interim_results)
        language = model_language(self.ctx.engine, options)
        speakers = speaker_count(self.ctx.engine, options)
        if options.phrases or language != self.stream.language or options.diarize:
            # no audio yet: the stream that waited for the config gives way to one that serves it
            self.stream.reopen(options.phrases, language, options.diarize)
        self._request_id = first.id if first.HasField("id") else None
        self._audio = AudioInput(options)
        self._transcript = Transcript(self.ctx.engine.info, options.interim_results, options.word_time_offsets,
                                      speakers)
        return True

    async def _read_audio(self) -> None:
        stream, audio = self.stream, self._audio
        rate = MessageRate(self.config.max_messages_per_second)
        while stream.finalized_at is None:
            request = await self._next("audio", self.config.idle_timeout, while_queued=True)
            if request is grpc.aio.EOF:
                stream.finalize(audio.finish())
                return
            if _kind(request) == "streaming_config":
                raise RivaError("invalid_message", "streaming_config may only be the first message")
            data = request.audio_content
            await rate.spend(message_units(len(data)))
            await stream.add(audio.decode(data))
        if stream.limit_reached:
            limit = self.config.max_stream_seconds
            self.end = RivaError("max_stream_seconds", f"a stream may carry at most {limit:g} s of audio")

    async def _next(self, what: str, timeout: float, while_queued: bool = False):
        """The next request; RivaError(idle_timeout) after `timeout` s without one (not while
        the stream waits for a slot, when `while_queued`)."""
        read = asyncio.ensure_future(self.context.read())
        try:
            while True:
                done, _ = await asyncio.wait({read}, timeout=timeout)
                if done:
                    return _checked(read.result())
                if not (while_queued and not self.stream.admitted):
                    raise RivaError("idle_timeout", f"no {what} for {timeout:g} s")
        finally:
            read.cancel()

    async def _send(self, piece: Piece) -> None:
        result = rasr.StreamingRecognitionResult(
            alternatives=[piece.alternative], is_final=piece.is_final, channel_tag=CHANNEL_TAG,
            stability=0.0 if piece.is_final else STABLE, audio_processed=piece.audio_processed,
        )
        response = rasr.StreamingRecognizeResponse(results=[result], id=self._request_id)
        self.results_sent += 1
        try:
            await asyncio.wait_for(self.context.write(response), self.config.send_timeout)
        except asyncio.TimeoutError:
            raise RivaError("slow_consumer", f"responses were not read for {self.config.send_timeout:g} s") from None

    def _observe(self, result) -> None:
        metrics = self.ctx.metrics
        if result.latency is not None:
            metrics.chunk_latency.observe(result.latency)
        if result.is_final and self.stream.finalized_at is not None:
            waited = asyncio.get_running_loop().time() - self.stream.finalized_at
            metrics.time_to_final.observe(waited)


def _kind(request: rasr.StreamingRecognizeRequest) -> str | None:
    return request.WhichOneof("streaming_request")


def _checked(request):
    if isinstance(request, Malformed):
        raise RivaError("invalid_message", "the request is not a valid StreamingRecognizeRequest (protobuf)")
    return request
