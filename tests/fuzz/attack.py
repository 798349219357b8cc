"""Running one Attack against one door of a server: connect (through the WebSocket handshake,
with the attack's query), send its frames at its pace, end as it says, and return what the
server sent back and how it closed. A request/response door makes its attacks itself (its
`exchange`, exchanges.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import trio

from .clients import GONE, LineClient, WsClient, open_stream, reset
from .hostile import Attack

ANSWER_TIMEOUT = 10  # seconds for a probe's answer or the server's close


@dataclass
class Outcome:
    messages: list = field(default_factory=list)  # what the server sent (JSON parsed; bytes as bytes)
    close_code: int | None = None  # WebSocket: the server's close code (1006: no close frame)
    refused: tuple[int, bytes] | None = None  # a refused WebSocket handshake: (HTTP status, body)
    status: str | None = None  # a request/response door: its answers in words (e.g. "http 413")
    answered: bool = False  # the probe's answer came

    def end(self, attack: Attack) -> str:
        """How the connection ended, in a word (for the suite's summary)."""
        if self.status is not None:
            return self.status
        if self.refused is not None:
            return f"http {self.refused[0]}"
        if self.answered:
            return "probe answered"
        return f"{attack.ending}, close {self.close_code}"


async def run_attack(ports: dict[str, int], door, attack: Attack) -> Outcome:
    if door.exchange is not None:
        return await door.exchange(ports, attack)
    outcome = Outcome()
    stream = await open_stream(ports[door.port])
    client = LineClient(stream) if door.port == "tcp" else WsClient(stream)
    try:
        if door.port == "ws" and not await client.handshake(_target(door.path, attack.query)):
            outcome.refused = client.refused
            return outcome
        await _send(client, attack)
        await _end(client, door, attack, outcome)
    finally:
        outcome.close_code = client.close_code
        if attack.ending != "reset":
            await stream.aclose()
    return outcome


def _target(path: str, query: str) -> str:
    base, _, door_query = path.partition("?")
    query = "&".join(filter(None, (door_query, query)))
    return f"{base}?{query}" if query else base


async def _send(client, attack: Attack) -> None:
    try:
        for frame in attack.frames:
            await client.send(frame)
            if attack.pace:
                await trio.sleep(attack.pace)
    except GONE:  # the server closed the connection (an error that closes): read why
        pass


async def _end(client, door, attack: Attack, outcome: Outcome) -> None:
    if attack.ending == "reset":
        reset(client.stream)
        return
    if attack.ending == "silent":  # stop reading, then leave
        await trio.sleep(0.05)
        return
    try:
        if attack.ending == "probe":
            await client.send(door.probe)
        elif isinstance(client, WsClient):
            await client.close()
        else:
            await client.stream.send_eof()
    except GONE:
        pass
    with trio.fail_after(ANSWER_TIMEOUT):  # answered, or closed by the server
        while (message := await client.receive()) is not None:
            outcome.messages.append(message)
            if attack.ending == "probe" and door.answered(message):
                outcome.answered = True
                return
