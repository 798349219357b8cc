"""Multi-stream engine: Sequence, Scheduler, ModelRunner behind the ASREngine API."""

from .asr_engine import ASREngine, EngineError, QueueFull, add_engine_arguments, engine_options
from .info import EngineInfo
from .results import StreamResult

__all__ = ["ASREngine", "EngineError", "EngineInfo", "QueueFull", "StreamResult", "add_engine_arguments", "engine_options"]
