"""API-key and Origin checks."""
from __future__ import annotations

import hmac


def key_ok(expected: str | None, given: object) -> bool:
    if expected is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def bearer_token(headers: dict[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def origin_ok(allowed: tuple[str, ...], origin: str | None) -> bool:
    """Requests without an Origin header come from non-browser clients and pass."""
    if origin is None or "*" in allowed:
        return True
    return origin.rstrip("/").lower() in {a.rstrip("/").lower() for a in allowed}
