"""The message-rate budget of one call (--max-messages-per-second, bursts up to one second's
worth; a message counts once per started 8 KiB), on the gRPC event loop's clock."""
from __future__ import annotations

import asyncio


class MessageRate:
    """Over budget the reader sleeps: it stops reading, so HTTP/2 flow control slows the client."""

    def __init__(self, rate: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.rate = rate
        self._tokens = rate
        self._at = self._loop.time()

    async def spend(self, units: int) -> None:
        now = self._loop.time()
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate) - units
        self._at = now
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)
