"""Many files through one engine, as many at once as it has slots: what parakeet-transcribe runs.

Each file is one engine stream fed by `feed_file`; a file is opened only when its turn has come,
so that open files and decoded audio stay within the slots' budget whatever the number of files.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import trio

from ....audio import AudioError
from ....engine.api import EngineAPI
from .decode import AudioReader
from .feed import feed_file, in_worker_thread
from .transcript import FileTranscript, TranscriptBuilder

BACKLOG_SECONDS = 30.0  # audio of one file held in the engine at a time


class FileSource:
    """An audio file, opened and decoded in worker threads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reader: AudioReader | None = None

    async def open(self) -> None:
        self._reader = await trio.to_thread.run_sync(AudioReader, self.path)
        self.read = in_worker_thread(self._reader.read)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


class ArraySource:
    """Samples already in memory: read on the loop (there is nothing to decode)."""

    def __init__(self, samples: np.ndarray) -> None:
        self._samples = samples
        self._position = 0

    async def open(self) -> None:
        pass

    async def read(self, n: int) -> np.ndarray:
        block = self._samples[self._position : self._position + n]
        self._position += len(block)
        return block

    def close(self) -> None:
        pass


Source = FileSource | ArraySource


async def transcribe_files(
    engine: EngineAPI,
    sources: dict[str, Source],
    lookahead=None,
    on_done: Callable[[str, FileTranscript], None] = lambda name, transcript: None,
    phrases: tuple = (),
    language: str | None = None,
    diarize: bool = False,
) -> dict[str, FileTranscript]:
    """Every source as its own stream, as many at once as the engine has slots; a source is opened
    once its turn has come, so that only the files being transcribed are open; every stream boosts
    `phrases` (engine/phrases.py), in `language` (None: the model's default), each word with its
    speaker where `diarize`."""
    slots = trio.CapacityLimiter(engine.stats()["max_num_streams"])
    out: dict[str, FileTranscript] = {}

    async def one(name: str, source: Source) -> None:
        async with slots:
            out[name] = await _transcribe(engine, name, source, lookahead, phrases, language, diarize)
        on_done(name, out[name])

    async with trio.open_nursery() as nursery:
        for name, source in sources.items():
            nursery.start_soon(one, name, source)
    return out


async def _transcribe(engine: EngineAPI, name: str, source: Source, lookahead, phrases: tuple,
                      language: str | None, diarize: bool) -> FileTranscript:
    builder = TranscriptBuilder(engine.info, diarize)

    async def on_result(result) -> None:
        builder.add(result)

    try:
        await source.open()
        samples = await feed_file(engine, source.read, on_result, int(BACKLOG_SECONDS * engine.info.sample_rate), lookahead,
                                  phrases, language, diarize)
    except AudioError as exc:
        return FileTranscript(error=f"cannot read audio file {name}: {exc}")
    finally:
        source.close()
    return builder.finish(samples)
