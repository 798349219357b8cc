"""Trio server in front of the ASR engine: TCP, WebSocket (native, /v1/realtime, /v1/listen), HTTP."""
from .app import serve
from .context import ServerConfig, ServerContext

__all__ = ["ServerConfig", "ServerContext", "serve"]
