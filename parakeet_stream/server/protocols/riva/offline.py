"""`Recognize`: a whole recording in one request, answered in one response.

The audio goes through the engine as fast as it takes it (within the same --max-backlog-seconds
budget as a stream: it is fed in pieces while the results are collected), one
SpeechRecognitionResult per utterance.
"""
from __future__ import annotations

import asyncio
import logging

from riva.client.proto import riva_asr_pb2 as rasr

from ...context import ServerContext
from .audio_input import AudioInput
from .engine_stream import RivaStream
from .errors import RivaError
from .options import model_language, parse_config, speaker_count
from .streaming import CHANNEL_TAG
from .transcript import Transcript

log = logging.getLogger(__name__)

FEED_BYTES = 64 * 1024  # decoded and resampled a piece at a time: no full-length float copy


class OfflineCall:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.stream: RivaStream | None = None
        self.results_sent = 0

    async def run(self, request: rasr.RecognizeRequest) -> rasr.RecognizeResponse:
        options = parse_config(request.config)
        audio = AudioInput(options)
        language = model_language(self.ctx.engine, options)
        speakers = speaker_count(self.ctx.engine, options)
        self.stream = RivaStream(self.ctx.engine, self.ctx.config, options.phrases, language, options.diarize)
        self.ctx.metrics.streams.labels("riva").inc()
        transcript = Transcript(self.ctx.engine.info, interim=False, words=options.word_time_offsets,
                                max_speakers=speakers)
        feeder = asyncio.ensure_future(self._feed(audio, request.audio))
        results = []
        try:
            while not self.stream.finished:
                for result in await self.stream.collect():
                    if result.error:
                        raise RivaError("inference_error", "inference failed for this request")
                    results += [
                        rasr.SpeechRecognitionResult(
                            alternatives=[p.alternative], channel_tag=CHANNEL_TAG, audio_processed=p.audio_processed
                        )
                        for p in transcript.add(result, self.stream.received_seconds)
                    ]
        finally:
            feeder.cancel()
            self.stream.release()
        self.results_sent = len(results)
        return rasr.RecognizeResponse(results=results, id=request.id if request.HasField("id") else None)

    def on_drain(self) -> None:
        if self.stream is not None:
            self.stream.leave_queue()

    def on_finish(self) -> None:
        """All its audio is in hand: it finishes by itself within the final grace."""

    async def _feed(self, audio: AudioInput, data: bytes) -> None:
        stream = self.stream
        try:
            for at in range(0, len(data), FEED_BYTES):
                await stream.add(audio.decode(data[at : at + FEED_BYTES]))
            stream.finalize(audio.finish())
        except RivaError as exc:
            stream.fail(exc)
        except Exception:
            log.exception("riva recognize feeder failed")
            stream.fail(RivaError("internal_error", "internal server error"))
