"""How a file's audio enters the engine: the one place that feeds bulk work.

A file's audio is all there at once, so its engine stream is a bulk stream: the engine's
Scheduler runs it in the capacity live streams leave, many chunks a step, and gives way to
their deadlines (engine/policy.py). Here it is only kept fed, as far as the stream's backlog
budget allows: once admitted (nothing is pushed while the stream waits in the queue), a block is
read (decoded in a worker thread, `in_worker_thread`) and pushed whenever a block's worth of the
budget is free; the results the engine returns tell how much it has consumed.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
import trio

from ....engine import StreamResult
from ....engine.api import EngineAPI
from ....engine.phrases import Phrase
from ...streams.stream import EngineStream
from ...transport.wakeup import Wakeup

BLOCK_SECONDS = 5.0  # audio decoded and pushed at a time (at most half the budget)

Reader = Callable[[int], Awaitable[np.ndarray]]  # up to n samples at the engine's rate; empty at the end


def in_worker_thread(read: Callable[[int], np.ndarray]) -> Reader:
    """A reader that blocks (a decoder) as one that runs in a worker thread, off the Trio loop."""

    async def run(n: int) -> np.ndarray:
        return await trio.to_thread.run_sync(read, n)

    return run


async def feed_file(
    engine: EngineAPI,
    read: Reader,
    on_result: Callable[[StreamResult], Awaitable[None]],
    budget_samples: int,
    lookahead: tuple[int, int] | None = None,
    phrases: tuple[Phrase, ...] = (),
    language: str | None = None,
    diarize: bool = False,
) -> int:
    """Transcribe the audio `read` yields as one bulk engine stream (in `lookahead`, else the
    engine's bulk mode) that boosts `phrases`, in `language` (None: the model's default), with speakers where `diarize`; `on_result` gets every result in order, the final
    one last. Returns the samples pushed. `read`'s exceptions propagate, and QueueFull or
    PhraseError (or EngineError: a language it lacks) when the engine refuses the stream. The stream is cancelled if this is interrupted."""
    wakeup = Wakeup()
    stream = EngineStream(engine, wakeup.set_threadsafe, budget_samples, lookahead=lookahead, phrases=phrases,
                          bulk=True, language=language, diarize=diarize)
    block = max(1, min(int(BLOCK_SECONDS * engine.info.sample_rate), budget_samples // 2))
    try:
        while not stream.finished:
            for result in stream.collect():
                await on_result(result)
            if stream.finished:
                break
            if not stream.final and stream.room >= block and (stream.admitted or stream.admit()):
                samples = await read(block)
                if len(samples):
                    stream.take(samples)
                    stream.flush(force=True)
                else:  # the end of the audio
                    stream.finalize()
            else:
                await wakeup.wait()
        return stream.pushed_samples
    finally:
        stream.release()
