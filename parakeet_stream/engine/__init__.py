"""Multi-stream engine: Sequence, Scheduler, ModelRunner behind the ASREngine API."""

from .asr_engine import ASREngine, EngineError, QueueFull, add_engine_arguments, engine_options, single_threaded_host
from .results import StreamResult

__all__ = ["ASREngine", "EngineError", "QueueFull", "StreamResult", "add_engine_arguments", "engine_options",
           "single_threaded_host"]
