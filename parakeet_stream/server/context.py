"""State shared by every connection of one server."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .admission import WaitEstimator
from .config import ServerConfig
from .metrics import Metrics

if TYPE_CHECKING:
    from ..engine import ASREngine


@dataclass
class ServerContext:
    engine: ASREngine
    config: ServerConfig
    metrics: Metrics
    estimator: WaitEstimator = field(default_factory=WaitEstimator)
    shutdown: trio.Event = field(default_factory=trio.Event)  # draining: accept nothing new
    finish: trio.Event = field(default_factory=trio.Event)  # the drain timeout passed: finalize every stream
    open_sessions: int = 0

    @classmethod
    def create(cls, engine: ASREngine, config: ServerConfig) -> ServerContext:
        return cls(engine=engine, config=config, metrics=Metrics(engine))
