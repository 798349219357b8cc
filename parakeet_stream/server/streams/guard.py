"""Who may connect and how much a connection may take: the API key and Origin checks, the
message rate, the memory bound, and the start-up memory check.

What a connection may hold (docs/protocol.md section 5): its segment's audio not yet encoded
(`max_backlog_seconds` at the model rate, float32, whether queued or admitted) plus the
message it is reading or parsing (framing buffers and the decoded samples, each at most
`max_message_bytes`), plus the state of its resampler (when the client's rate is not the
model's) and a fixed overhead for its tasks and buffers, the messages it was sent and has not
read (OUTBOX_BYTES) among them. tests/fuzz/test_churn.py measures it on every door.
"""
from __future__ import annotations

import hmac

import trio

from ...audio import SAMPLE_RATE
from ...host import available_ram
from ..context import ServerConfig

SAMPLE_BYTES = 4  # float32
MAX_BATCH_MESSAGES = 64  # messages handled per wake-up before yielding to other connections
MESSAGE_UNIT_BYTES = 8192  # a message counts once per started 8 KiB against the rate
MESSAGE_COPIES = 5  # framing buffers (transport + WebSocket queue) and decoded copies
CONNECTION_OVERHEAD = 512 * 1024  # tasks, socket and WebSocket buffers, the heap a growing audio buffer leaves
RESAMPLER_BYTES = 256 * 1024  # soxr's HQ filter state: 0.17 (24 kHz) to 0.24 MB (8 kHz), measured
OUTBOX_BYTES = 64 * 1024  # messages posted, not yet sent, past which the reader stops reading
MIN_BACKLOG_SECONDS = 2.0  # below a chunk plus its context the engine could never catch up


def backlog_samples(config: ServerConfig) -> int:
    """The audio budget of one segment, in samples at the model rate."""
    return int(max(config.max_backlog_seconds, MIN_BACKLOG_SECONDS) * SAMPLE_RATE)


def backlog_bytes(config: ServerConfig) -> int:
    return backlog_samples(config) * SAMPLE_BYTES


def connection_bytes(config: ServerConfig) -> int:
    """The documented memory bound of one connection (segment and message in flight)."""
    return backlog_bytes(config) + MESSAGE_COPIES * config.max_message_bytes + RESAMPLER_BYTES + CONNECTION_OVERHEAD


AUTO_SHARE = 0.5  # of the available memory, what `--max-num-streams auto` lets connections take


def auto_limit(config: ServerConfig, queue: int, available: int | None = None) -> int | None:
    """The most slots `--max-num-streams auto` may take: connections at their bound, queue places
    included, in AUTO_SHARE of the available memory (the rest for the engine's own: on a CPU its
    pools take up to the other half); None where the memory cannot be told."""
    available = available_ram() if available is None else available
    if available is None:
        return None
    return max(1, int(available * AUTO_SHARE) // connection_bytes(config) - queue)


def memory_problem(config: ServerConfig, streams: int, available: int | None = None) -> str | None:
    """Why `streams` connections (slots + queue places) at their bound do not fit, or None."""
    if available is None:
        available = available_ram() or 1 << 62  # unknown: do not refuse
    need = streams * connection_bytes(config)
    if need <= available:
        return None
    return (
        f"{streams} streams (slots + queue) x {connection_bytes(config) / 2**20:.1f} MiB per stream "
        f"= {need / 2**30:.1f} GiB, but only {available / 2**30:.1f} GiB of memory is available; "
        "lower --max-queue, --max-num-streams, --max-backlog-seconds or --max-message-bytes"
    )


def message_units(size: int) -> int:
    """What a message of `size` bytes costs against the message rate."""
    return max(1, -(-size // MESSAGE_UNIT_BYTES))


class TokenBucket:
    """Message-rate budget: `rate` units per second, bursts up to one second's worth.

    Over budget the reader sleeps (it stops reading, so TCP flow control slows the client);
    nothing is dropped.
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._tokens = rate
        self._at = trio.current_time()

    async def spend(self, units: int) -> None:
        now = trio.current_time()
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate) - units
        self._at = now
        if self._tokens < 0:
            await trio.sleep(-self._tokens / self.rate)


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
