"""What a protocol module declares so that the doors can serve it: the door and WebSocket path
that reach it and the dialect it answers to, its handshake, its session class, how its frames
split into messages, and its own error codes. protocols/registry.py lists the declarations.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..transport.codes import CLOSE_REASONS, POLICIES, Policy
from .guard import bearer_token, key_ok, origin_ok

if TYPE_CHECKING:
    from ..context import ServerContext


@dataclass(frozen=True)
class Handshake:
    """A WebSocket upgrade request, as a protocol's handshake sees it."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    subprotocols: tuple[str, ...]  # the ones the client proposed
    params: tuple[tuple[str, str], ...] = ()  # the query's every parameter in order, repeated and empty ones too


@dataclass(frozen=True)
class Accept:
    options: Any = None  # what the session is made with
    subprotocol: str | None = None  # WebSocket: the one to answer with
    first: str | None = None  # TCP: a message the handshake read, handled as the first one


@dataclass(frozen=True)
class Refusal:
    status: int  # HTTP status of a refused WebSocket handshake
    code: str
    message: str
    body: dict | None = None  # None: the server's own error message


def bearer_handshake(ctx: ServerContext, request: Handshake) -> Accept | Refusal:
    """The server's own WebSocket handshake: the Origin allow-list, then the key as
    `Authorization: Bearer KEY` or `?api_key=KEY`; the session is made with the query."""
    return check_access(ctx, request, bearer_token(request.headers) or request.query.get("api_key")) or Accept(
        request.query
    )


def check_access(ctx: ServerContext, request: Handshake, key: str | None) -> Refusal | None:
    if not origin_ok(ctx.config.allowed_origins, request.headers.get("origin")):
        return Refusal(403, "forbidden_origin", "this Origin is not allowed")
    if not key_ok(ctx.config.api_key, key):
        return Refusal(401, "unauthorized", "a valid API key is required")
    return None


@dataclass(frozen=True)
class Protocol:
    name: str  # in the connection log lines
    metric: str  # the `protocol` label of the connection and stream metrics
    door: str  # "ws" or "tcp"
    session: Callable[..., Any]  # (connection, accepted options) -> its Session
    path: str | None = None  # WebSocket path; None: any path that no other protocol claims
    matches: Callable[[dict[str, str]], bool] = lambda query: True  # the dialect, from the URL query
    # ws: (ctx, Handshake) -> Accept | Refusal; tcp: async (ctx, TcpChannel) -> Accept | Refusal | None (gone)
    handshake: Callable[..., Any] = bearer_handshake
    split: Callable[[str | bytes], Iterable[str | bytes]] | None = None  # several messages per frame
    codes: dict[str, Policy] = field(default_factory=dict)  # error codes of its own

    def serves(self, door: str, path: str, query: dict[str, str]) -> bool:
        return self.door == door and self.path in (None, path.rstrip("/")) and self.matches(query)

    def policy(self, code: str) -> Policy | None:
        return self.codes.get(code) or POLICIES.get(code)

    def close_code(self, reason: str) -> int:
        """The WebSocket close code the connection ends with."""
        if reason in CLOSE_REASONS:
            return CLOSE_REASONS[reason]
        return self.policy(reason).ws_close_code or 1000
