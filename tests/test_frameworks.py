"""Voice-agent frameworks' speech-to-text services against the in-process server, each built by
the README's own snippet (the code under test): Pipecat's Deepgram, OpenAI Realtime and NVIDIA
services in a pipeline behind its Silero VAD processor (whose end of speech makes the first two
send Deepgram's `Finalize` and OpenAI's `commit`, as in production), and LiveKit Agents'
Deepgram, OpenAI (realtime) and NVIDIA plugins through `stt.stream()` fed `rtc.AudioFrame`s.

Each transcribes two espeak sentences with a 1.5 s pause (the demo model) in 20 ms frames. The
final text must equal the native protocol's on the audio the server got: the same bytes (after
the framework's own resampling to the API's rate), cut where the service ended a segment. No
error frame or event and no log line at warning level or above is allowed.

Skipped when a framework is not installed: `pip install -e '.[test,frameworks]'`.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import trio
from helpers import Raw, pcm16_exact, running_server, url

from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "weights" / "demo"
RATE = 16000
FRAME = 320  # 20 ms, what a WebRTC transport delivers
PACE = 0.005  # seconds between frames: 4x real time
TAIL = 1.5  # seconds of silence after the speech: the VAD's end of speech, the model's <EOU>
WAIT = 30  # seconds for the transcripts to come


@dataclass(frozen=True)
class Case:
    name: str  # the constructor in the README's snippet
    rate: int  # what the service sends the server
    cuts: bool = False  # it ends a segment at each end of speech of the VAD
    ends_input: bool = False  # LiveKit: `end_input()` once the audio is sent, then the finals are awaited


@pytest.fixture(scope="module")
def engine():
    if not (DEMO / "model.safetensors").is_file():
        pytest.skip("weights/demo is absent")
    with ASREngine(DEMO, max_num_streams=2) as e:
        yield e


@pytest.fixture(scope="module")
def turns(wavs) -> bytes:
    """Two espeak sentences with a 1.5 s pause between them, then silence: PCM16 at 16 kHz."""
    silence = np.zeros(int(TAIL * RATE), np.float32)
    return encode_audio(pcm16_exact(np.concatenate([wavs["pause"], silence])), "pcm16")


@pytest.fixture
def warnings_logged():
    """Log records at warning level or above, from any logger and thread."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(f"{record.name}: {record.getMessage()}")
    logging.getLogger().addHandler(handler)
    yield records
    logging.getLogger().removeHandler(handler)


def readme_services() -> dict[str, str]:
    """The README's framework snippets: constructor -> the code that builds `stt` (the imports
    above its line, then the line)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"\*\*Voice-agent frameworks\.\*\*.*?```python\n(.*?)```", text, re.S).group(1)
    services, imports = {}, []
    for line in block.splitlines():
        if line.startswith(("from ", "import ")):
            imports.append(line)
        elif line.startswith("stt = "):
            services[line[len("stt = ") :].split("(")[0]] = "\n".join([*imports, line])
    return services


def build(name: str, ports: dict[str, int]):
    """The README's `stt` for `name`, with the test server's ports for the default ones."""
    code = readme_services()[name]
    for default, kind in (("8000", "ws"), ("50051", "grpc")):
        code = code.replace(f"127.0.0.1:{default}", f"127.0.0.1:{ports[kind]}")
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the README's own code
    return scope["stt"]


def words(text: str) -> str:
    return " ".join(text.split())


def frames(pcm: bytes) -> list[bytes]:
    return [pcm[i : i + 2 * FRAME] for i in range(0, len(pcm), 2 * FRAME)]


async def native(ctx, pcm: bytes, rate: int) -> str:
    """The native protocol's transcript of PCM16 bytes at `rate` (one stream)."""
    async with Raw.open(url(ctx, "ws", f"/?encoding=pcm16&sample_rate={rate}")) as conn:
        for piece in frames(pcm):
            await conn.send(piece)
        await conn.send({"type": "close"})
        return words((await conn.until("result", is_final=True))[-1]["text"])


async def native_pieces(ctx, pieces: list[bytes], rate: int) -> str:
    return words(" ".join([await native(ctx, piece, rate) for piece in pieces if piece]))


@dataclass
class Run:
    """One framework run (in its own thread and asyncio loop): what came back, and the audio
    the server got, one piece per segment."""

    case: Case
    ports: dict[str, int]
    turns: bytes
    reference: Callable[[list[bytes]], str]  # the native text of pieces (from any thread)
    texts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=lambda: [b""])
    expected: str = ""

    async def settle(self) -> None:
        """Once the audio is sent: the native text of the same audio, then (at most WAIT) the
        service's finals up to it."""
        pieces = self.pieces if self.case.cuts else [b"".join(self.pieces)]
        self.expected = await asyncio.to_thread(self.reference, pieces)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while words(" ".join(self.texts)) != self.expected and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def check(self, warnings_logged: list[str]) -> None:
        assert not self.errors and not warnings_logged, (self.errors, warnings_logged)
        assert self.expected.count(" ") > 5  # both sentences
        assert not self.case.cuts or len(self.pieces) >= 3, len(self.pieces)  # an end of speech per turn
        assert len(self.texts) >= 2, self.texts  # a final per turn at least
        assert words(" ".join(self.texts)) == self.expected


async def transcribe(engine, case: Case, turns: bytes, driver: Callable[[Run], None]) -> Run:
    """Serve, then `driver(run)` in a thread: it builds the service from the README and runs it."""
    token = trio.lowlevel.current_trio_token()
    async with running_server(engine) as ctx:

        def reference(pieces: list[bytes]) -> str:
            return trio.from_thread.run(native_pieces, ctx, pieces, case.rate, trio_token=token)

        run = Run(case, dict(ctx.config.ports), turns, reference)
        with trio.fail_after(3 * WAIT):
            await trio.to_thread.run_sync(driver, run, abandon_on_cancel=True)
    return run


# -- Pipecat: audio frames -> Silero VAD -> the service -> a sink --------------------------------


def pipecat_run(run: Run) -> None:
    from loguru import logger
    from pipecat.audio.utils import create_stream_resampler
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import (
        EndFrame,
        ErrorFrame,
        InputAudioRawFrame,
        TranscriptionFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    class Watch(FrameProcessor):
        """Passes every frame on, noting error frames (they travel upstream) and `saw` the others."""

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, ErrorFrame):
                run.errors.append(frame.error)
            elif direction == FrameDirection.DOWNSTREAM:
                await self.saw(frame)
            await self.push_frame(frame, direction)

        async def saw(self, frame) -> None:
            pass

    class Cuts(Watch):
        """Just before the service: the audio it sends (resampled as it does), cut at each end of speech."""

        resampler = create_stream_resampler()

        async def saw(self, frame) -> None:
            if isinstance(frame, InputAudioRawFrame):
                rate = run.case.rate
                audio = frame.audio if rate == RATE else await self.resampler.resample(frame.audio, RATE, rate)
                run.pieces[-1] += audio
            elif isinstance(frame, VADUserStoppedSpeakingFrame):
                run.pieces.append(b"")

    class Sink(Watch):
        async def saw(self, frame) -> None:
            if isinstance(frame, TranscriptionFrame):
                run.texts.append(frame.text)

    async def main() -> None:
        stt = build(run.case.name, run.ports)
        pipeline = Pipeline([Watch(), VADProcessor(vad_analyzer=SileroVADAnalyzer()), Cuts(), stt, Sink()])
        worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=RATE))
        started = asyncio.Event()
        worker.event_handler("on_pipeline_started")(lambda *_: started.set())
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)

        async def feed() -> None:
            await started.wait()  # the services have connected
            for data in frames(run.turns):
                await worker.queue_frame(InputAudioRawFrame(audio=data, sample_rate=RATE, num_channels=1))
                await asyncio.sleep(PACE)
            await run.settle()
            await worker.queue_frame(EndFrame())

        await asyncio.gather(runner.run(), feed())

    def logged(message) -> None:
        # Pipecat's Flux service keeps its connection alive with silence when its input pauses for
        # 500 ms: here the feed pauses while `settle` transcribes the reference (longer on a slow
        # machine); the service's own keep-alive, not an error of the server's
        if "No audio received for" not in str(message):
            run.errors.append(str(message).strip())

    sink = logger.add(logged, level="WARNING")
    try:
        asyncio.run(main())
    finally:
        logger.remove(sink)


PIPECAT = [
    Case("DeepgramSTTService", RATE, cuts=True),
    Case("DeepgramFluxSTTService", RATE),  # turns from the model's <EOU>, on /v2/listen
    Case("OpenAIRealtimeSTTService", 24000, cuts=True),  # local VAD: turn_detection=False, the default
    Case("NvidiaSTTService", RATE),
]


@pytest.mark.parametrize("case", PIPECAT, ids=lambda case: case.name)
async def test_pipecat(engine, turns, case, warnings_logged):
    pytest.importorskip("pipecat")
    (await transcribe(engine, case, turns, pipecat_run)).check(warnings_logged)


# -- LiveKit Agents: stt.stream() fed rtc.AudioFrames ---------------------------------------------


def livekit_run(run: Run) -> None:
    from livekit import rtc
    from livekit.agents.stt import SpeechEventType
    from livekit.agents.utils import http_context

    rate = run.case.rate
    resampler = None if rate == RATE else rtc.AudioResampler(RATE, rate, quality=rtc.AudioResamplerQuality.HIGH)

    def sent(frame: rtc.AudioFrame) -> None:
        """What the stream sends the server: the frame, resampled as the stream does."""
        for out in resampler.push(frame) if resampler else [frame]:
            run.pieces[-1] += bytes(out.data)

    async def read(stream) -> None:
        async for event in stream:
            if event.type == SpeechEventType.FINAL_TRANSCRIPT and event.alternatives[0].text:
                run.texts.append(event.alternatives[0].text)

    async def main() -> None:
        stt = build(run.case.name, run.ports)
        stt.on("error", lambda error: run.errors.append(repr(error.error)))
        async with http_context.open():
            stream = stt.stream()
            reader = asyncio.create_task(read(stream))
            for data in frames(run.turns):
                frame = rtc.AudioFrame(data, RATE, 1, len(data) // 2)
                stream.push_frame(frame)
                sent(frame)
                await asyncio.sleep(PACE)
            if run.case.ends_input:  # as LiveKit's docs end a stream: no more input, the results still come
                stream.end_input()
            await run.settle()
            await stream.aclose()  # as an agent session closes its stream
            await reader
        await stt.aclose()

    asyncio.run(main())


LIVEKIT = [Case("deepgram.STT", RATE), Case("deepgram.STTv2", RATE), Case("openai.STT", 24000),
           Case("openai.STT", 24000, ends_input=True), Case("nvidia.STT", RATE)]


@pytest.mark.parametrize("case", LIVEKIT, ids=lambda case: case.name + ("-end_input" if case.ends_input else ""))
async def test_livekit(engine, turns, case, warnings_logged):
    for plugin in ("deepgram", "openai", "nvidia"):  # plugins register on the main thread, as at an agent's import
        pytest.importorskip(f"livekit.plugins.{plugin}")
    (await transcribe(engine, case, turns, livekit_run)).check(warnings_logged)


def test_readme_shows_every_service():
    assert set(readme_services()) == {case.name for case in PIPECAT + LIVEKIT}
