"""What the engine refuses, as values with a stable code (the server's error codes reuse them)."""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class QueueFull(EngineError):
    def __init__(self, message: str = "all slots are busy and the waiting queue is full"):
        super().__init__("queue_full", message)
