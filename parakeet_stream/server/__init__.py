"""Trio server in front of the ASR engine: TCP, WebSocket (native + /v1/realtime), HTTP."""
from .app import serve
from .config import ServerConfig
from .context import ServerContext

__all__ = ["ServerConfig", "ServerContext", "serve"]
