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

from ...engine import ASREngine, EngineError, StreamResult
from ..wakeup import Wakeup

BLOCK_SECONDS = 5.0  # audio decoded and pushed at a time (at most half the budget)

Reader = Callable[[int], Awaitable[np.ndarray]]  # up to n samples at the engine's rate; empty at the end


def in_worker_thread(read: Callable[[int], np.ndarray]) -> Reader:
    """A reader that blocks (a decoder) as one that runs in a worker thread, off the Trio loop."""

    async def run(n: int) -> np.ndarray:
        return await trio.to_thread.run_sync(read, n)

    return run


async def feed_file(
    engine: ASREngine,
    read: Reader,
    on_result: Callable[[StreamResult], Awaitable[None]],
    budget_samples: int,
    lookahead: tuple[int, int] | None = None,
    phrases: tuple = (),
) -> int:
    """Transcribe the audio `read` yields as one bulk engine stream (in `lookahead`, else the
    engine's bulk mode, boosting `phrases`); `on_result` gets every result in order, the final one
    last. Returns the samples pushed. `read`'s exceptions propagate, and QueueFull when the engine has no place.
    The stream is cancelled if this is interrupted."""
    wakeup = Wakeup()
    sid = engine.create_stream(lookahead, bulk=True, phrases=phrases)
    block = max(1, min(int(BLOCK_SECONDS * engine.info.sample_rate), budget_samples // 2))
    pushed = consumed = 0
    ended = finished = False
    try:
        engine.add_listener(sid, wakeup.set_threadsafe)
        while not finished:
            for result in engine.collect(sid):
                consumed = round(result.audio_seconds * engine.info.sample_rate)
                finished = result.is_final
                await on_result(result)
            if finished:
                break
            if not ended and budget_samples - (pushed - consumed) >= block and engine.queue_position(sid) == 0:
                n = _push(engine, sid, await read(block))
                pushed += n
                ended = n == 0
                if ended:
                    engine.finalize(sid)
            else:
                await wakeup.wait()
        return pushed
    finally:
        if not finished:
            engine.cancel(sid)


def _push(engine: ASREngine, sid: int, samples: np.ndarray) -> int:
    """Samples pushed (0: the audio has ended, or the stream is over)."""
    if len(samples) == 0:
        return 0
    try:
        engine.push_audio(sid, samples)
    except EngineError:  # failed in the engine: its final result says so
        return 0
    return len(samples)
