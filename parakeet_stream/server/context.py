"""Server settings and the state shared by every connection of one server."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .operations.metrics import Metrics

if TYPE_CHECKING:
    from ..engine.api import EngineAPI


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    tcp_port: int = 8765
    ws_port: int = 8000
    http_port: int = 8080
    grpc_port: int | None = 50051  # NVIDIA Riva ASR over gRPC (None: no gRPC door)
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ("*",)
    max_message_bytes: int = 1 << 20
    max_stream_seconds: float | None = 3600.0
    max_backlog_seconds: float = 30.0  # unprocessed audio held per stream before reads pause
    max_messages_per_second: float = 1000.0  # per connection; a message counts per started 8 KiB
    idle_timeout: float = 30.0
    send_timeout: float = 5.0
    handshake_timeout: float = 5.0  # WebSocket upgrade, HTTP request, TCP API key
    drain_timeout: float = 30.0
    agent_port: int | None = None  # HAProxy agent-check port (None: no agent)
    agent_weight_unit: int = 1  # streams of free capacity per agent weight point
    model_name: str = "demo"
    max_upload_bytes: int = 100 * 2**20  # one HTTP upload (OpenAI's limit is 25 MB)
    max_uploads: int = 8  # HTTP uploads transcribed at once; beyond: 429
    max_upload_seconds: float = 4 * 3600.0  # audio in one upload
    upload_timeout: float = 600.0  # for a whole upload body to arrive
    ports: dict[str, int] = field(default_factory=dict)  # actual ports once listening
    # a worker process (operations/workers.py): door -> the listening sockets it shares with the
    # other workers
    listen_fds: dict[str, list[int]] = field(default_factory=dict)


class WaitEstimator:
    """Expected wait = how long a slot is typically held x streams ahead / streams served at once."""

    def __init__(self, default_hold_s: float = 10.0, smoothing: float = 0.2) -> None:
        self._hold_s = default_hold_s
        self._smoothing = smoothing

    def record_hold(self, seconds: float) -> None:
        self._hold_s += self._smoothing * (seconds - self._hold_s)

    def estimate(self, position: int, slots: int) -> float:
        return round(self._hold_s * position / max(1, slots), 1)


@dataclass
class ServerContext:
    engine: EngineAPI
    config: ServerConfig
    metrics: Metrics
    estimator: WaitEstimator = field(default_factory=WaitEstimator)
    shutdown: trio.Event = field(default_factory=trio.Event)  # draining: accept nothing new
    drain_expired: trio.Event = field(default_factory=trio.Event)  # the drain timeout passed: finalize every segment
    connection_closed: trio.Event = field(default_factory=trio.Event)  # since the last memory reclaim (operations/memory.py)
    open_sessions: int = 0
    open_uploads: int = 0

    @classmethod
    def create(cls, engine: EngineAPI, config: ServerConfig) -> ServerContext:
        return cls(engine=engine, config=config, metrics=Metrics(engine))
