"""Handing back the memory that closed connections leave, while the server runs.

A closed connection's objects form reference cycles (the connection and its session, trio's
tasks, nurseries and cancel scopes, with the frames and buffers they hold), which only Python's
cyclic collector frees, at its own pace; and glibc keeps the heap pages freed that way rather
than returning them. Under churn (hundreds of abrupt resets, clients that never read) the two
together raised RSS by about 100 MB to a high-water mark that then stayed (docs/protocol.md
section 5); nothing stayed referenced.

So: the objects alive at start-up (the model, the modules) are frozen out of the collector's
sight, which makes a full collection cost what connections left, not what the model holds; and
once connections have closed (a second after the last one, or every RECLAIM_INTERVAL_S while
others go on) a full collection frees their cycles and malloc_trim returns the pages.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ..context import ServerContext

log = logging.getLogger(__name__)

IDLE_RECLAIM_S = 1.0  # after the last connection closed
RECLAIM_INTERVAL_S = 10.0  # at most this often while connections go on


def freeze_startup_objects() -> None:
    """Call once the model is loaded: the collector never walks those objects again."""
    gc.collect()
    gc.freeze()


async def reclaim_after_closes(ctx: ServerContext) -> None:
    last = trio.current_time()
    while True:
        await ctx.connection_closed.wait()
        ctx.connection_closed = trio.Event()
        if ctx.open_sessions and trio.current_time() - last < RECLAIM_INTERVAL_S:
            continue  # the last one to close (or the next after the interval) reclaims
        await trio.sleep(IDLE_RECLAIM_S)  # the rest of a burst of closes first
        last = trio.current_time()
        started = time.perf_counter()
        objects = gc.collect()
        collected = time.perf_counter()
        if _malloc_trim is not None:
            await trio.to_thread.run_sync(_malloc_trim, 0)
        log.debug("reclaimed %d objects in %.1f ms, then heap pages in %.1f ms", objects,
                  1e3 * (collected - started), 1e3 * (time.perf_counter() - collected))


def _find_malloc_trim():
    """glibc's malloc_trim, or None (another C library, or none to be found)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _find_malloc_trim()
