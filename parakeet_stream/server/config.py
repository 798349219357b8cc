"""Server settings (the CLI fills these in; tests build them directly)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    tcp_port: int = 8765
    ws_port: int = 8000
    http_port: int = 8080
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
    ports: dict[str, int] = field(default_factory=dict)  # actual ports once listening
