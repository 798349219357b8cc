"""Many files through one engine, as many at once as it has slots: what parakeet-transcribe runs.

Each file is one engine stream fed by `feed_file`; a file is opened only when its turn has come,
so that open files and decoded audio stay within the slots' budget whatever the number of files.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import trio

from ...audio import AudioError
from ...engine import ASREngine
from .decode import AudioReader
from .feed import feed_file
from .transcript import FileTranscript, TranscriptBuilder

BACKLOG_SECONDS = 30.0  # audio of one file held in the engine at a time


class ArrayReader:
    """A reader (feed.py) over samples already in memory."""

    def __init__(self, samples: np.ndarray) -> None:
        self._samples = samples
        self._position = 0

    def read(self, n: int) -> np.ndarray:
        block = self._samples[self._position : self._position + n]
        self._position += len(block)
        return block

    def close(self) -> None:
        pass


Opener = Callable[[], AudioReader | ArrayReader]


async def transcribe_files(
    engine: ASREngine,
    openers: dict[str, Opener],
    lookahead=None,
    on_done: Callable[[str, FileTranscript], None] = lambda name, transcript: None,
) -> dict[str, FileTranscript]:
    """Each opener gives a file's reader; it is called (in a worker thread) once the file's turn
    has come, so that only the files being transcribed are open."""
    slots = trio.CapacityLimiter(engine.stats()["max_num_streams"])
    out: dict[str, FileTranscript] = {}

    async def one(name: str, opener: Opener) -> None:
        async with slots:
            out[name] = await _transcribe_file(engine, name, opener, lookahead)
        on_done(name, out[name])

    async with trio.open_nursery() as nursery:
        for name, opener in openers.items():
            nursery.start_soon(one, name, opener)
    return out


async def _transcribe_file(engine: ASREngine, name: str, opener: Opener, lookahead) -> FileTranscript:
    builder = TranscriptBuilder(engine.info)

    async def on_result(result) -> None:
        builder.add(result)

    try:
        reader = await trio.to_thread.run_sync(opener)
    except AudioError as exc:
        return FileTranscript(error=f"cannot read audio file {name}: {exc}")
    try:
        samples = await feed_file(engine, reader.read, on_result, int(BACKLOG_SECONDS * engine.sample_rate), lookahead)
    except AudioError as exc:
        return FileTranscript(error=f"cannot read audio file {name}: {exc}")
    finally:
        reader.close()
    return builder.finish(samples)
