"""What trio and the gRPC loop both read: whether the door is draining and how many calls are
open, under one lock. The check for draining and the count of a new call happen together, so
the drain never misses a call and never waits for a refused one."""
from __future__ import annotations

import threading


class DoorState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._draining = False
        self._open = 0

    @property
    def draining(self) -> bool:
        with self._lock:
            return self._draining

    @property
    def open_calls(self) -> int:
        with self._lock:
            return self._open

    def enter(self) -> bool:
        """Count a new call; False (not counted) while draining."""
        with self._lock:
            if self._draining:
                return False
            self._open += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._open -= 1

    def drain(self) -> None:
        with self._lock:
            self._draining = True
