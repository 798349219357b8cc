"""An edge-triggered wake-up that engine threads can fire into a trio task."""
from __future__ import annotations

import contextlib

import trio


class Wakeup:
    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def set_threadsafe(self) -> None:
        """For engine listeners: cheap, never blocks, safe after trio has exited. It sets the event
        of now in trio's thread: if `wait` replaces it first, that wait was woken by an earlier set
        and its caller looks at what is new after this call (made after the news), so nothing is
        missed."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._event.set)

    async def wait(self) -> None:
        """Until set (at once if it was set since the last wait)."""
        await self._event.wait()
        self._event = trio.Event()  # before the caller looks at what is new (see set_threadsafe)
