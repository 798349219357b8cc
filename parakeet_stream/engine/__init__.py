"""Multi-stream engine: Sequence, Scheduler, ModelRunner behind the ASREngine API."""

from .asr_engine import ASREngine, EngineError, QueueFull
from .results import StreamResult

__all__ = ["ASREngine", "EngineError", "QueueFull", "StreamResult"]
