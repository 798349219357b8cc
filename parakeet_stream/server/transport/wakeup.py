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
        """For engine listeners: cheap, never blocks, safe after trio has exited."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self.set)

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()
