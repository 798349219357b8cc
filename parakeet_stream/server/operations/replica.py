"""The replica contract a load balancer sees: health, readiness and the HAProxy agent.

- health: the process runs and so do the engine's stage threads (else an orchestrator restarts it);
- ready: new streams are accepted (a free slot, or room in the waiting queue) and we are not draining;
- agent (`--agent-port`): one line per connection for HAProxy's `agent-check`: `up ready N%` with
  N = free capacity (free slots + queue room) in units of `--agent-weight-unit` streams, `drain`
  while draining, `down` when the engine is broken.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import trio

from ..context import ServerContext

MAX_WEIGHT = 256  # HAProxy caps a server's weight at 256


@dataclass(frozen=True)
class ReplicaState:
    healthy: bool
    ready: bool
    reason: str  # free_slot | queue_room | queue_full | draining | broken
    free_slots: int
    queue_room: int


def replica_state(ctx: ServerContext) -> ReplicaState:
    stats = ctx.engine.stats()
    free = stats["free_slots"]
    room = max(0, stats["max_queue"] - stats["queued"])
    if not ctx.engine.healthy():
        return ReplicaState(False, False, "broken", free, room)
    if ctx.shutdown.is_set():
        return ReplicaState(True, False, "draining", free, room)
    if free:
        return ReplicaState(True, True, "free_slot", free, room)
    return ReplicaState(True, room > 0, "queue_room" if room else "queue_full", free, room)


def agent_line(ctx: ServerContext) -> str:
    state = replica_state(ctx)
    if not state.healthy:
        return "down"
    if state.reason == "draining":
        return "drain"
    capacity = state.free_slots + state.queue_room
    weight = min(MAX_WEIGHT, math.ceil(capacity / max(1, ctx.config.agent_weight_unit)))
    return f"up ready {weight}%"


async def handle_agent(ctx: ServerContext, stream: trio.SocketStream) -> None:
    """HAProxy connects, reads one line, and closes; it may send a line first (agent-send), ignored."""
    try:
        with trio.move_on_after(ctx.config.handshake_timeout):
            await stream.send_all(agent_line(ctx).encode() + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)

