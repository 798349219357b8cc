"""Every door of a real `parakeet-serve` process under hypothesis-made hostile connections
(see hostile.py and doors.py), with a good stream on the same door beside them all along:

- every hostile connection gets documented answers (each message its protocol's shape, each
  error a documented code with a safe text, never close 1011) and, when it asks, still serves
  (its probe is answered) or is closed: within 10 s either way;
- no traceback and no ERROR line in the server log, looked at after every example (so that
  hypothesis shrinks a failure to the input that caused it);
- the good stream's transcript is identical, run after run, to its solo run;
- afterwards the server is back to idle (no connection, no stream, every slot free, no upload's
  spool file open) and its memory within RSS_BOUND_MB of what it was before.

The request/response doors (gRPC, the HTTP uploads, the HTTP port) answer each request once:
every client that waits gets a documented status (gRPC: never UNKNOWN or INTERNAL; HTTP: never
500) in its API's shape; their good stream is a good call or upload (an upload's with a live
stream beside it).

FUZZ_EXAMPLES hostile connections per door (default 100), from the seeded sequence FUZZ_SEED
(default 0); a release soak: `FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/fuzz`.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import trio
from helpers import http_get, metric
from hypothesis import HealthCheck, given, seed, settings
from helpers import Server, assert_clean_log

from parakeet_stream.client import encode_audio

from .attack import Outcome, run_attack
from .doors import DOORS, Door
from .hostile import MAX_MESSAGE, MAX_UPLOAD

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))
FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "0"))
RSS_BOUND_MB = 64
SERVER_ARGS = ("--max-num-streams", "4", "--max-queue", "8", "--max-message-bytes", str(MAX_MESSAGE),
               "--max-upload-mb", str(MAX_UPLOAD >> 20), "--send-timeout", "2", "--idle-timeout", "5")
REFUSED = {400, 401, 403, 431}  # a WebSocket handshake refused: bad query, key, Origin, headers


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = Server(tiny_model_dir, tmp_path_factory.mktemp("fuzz") / "server.log", *SERVER_ARGS)
    yield server
    server.close()
    assert_clean_log(server.log())


class LogWatch:
    """The server log, read on from where it was last read."""

    def __init__(self, server: Server) -> None:
        self._file = open(server.log_path)  # noqa: SIM115 - closed in close()

    def assert_clean(self) -> None:
        assert_clean_log(self._file.read())

    def close(self) -> None:
        self._file.close()


class GoodStreams:
    """The door's good stream, run again and again in a thread of its own until stopped."""

    def __init__(self, door: Door, ports: dict, speech) -> None:
        self.results: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._loop, door, ports, speech))

    async def _loop(self, door: Door, ports: dict, speech) -> None:
        while not self._stop.is_set():
            self.results.append(await door.good(ports, speech))

    def __enter__(self) -> GoodStreams:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def check(door: Door, outcome: Outcome) -> None:
    if outcome.refused is not None:
        status, body = outcome.refused
        assert status in REFUSED and isinstance(orjson.loads(body), dict), outcome.refused
    else:
        door.check(outcome.messages, outcome.close_code)


@pytest.mark.parametrize("door", DOORS, ids=lambda door: door.name)
def test_door_holds_under_fuzz(server, door, sentence):
    speech = encode_audio(sentence, "pcm16")
    solo = trio.run(door.good, server.ports, sentence)
    log = LogWatch(server)
    before, started, spooled = server.rss_mb(), time.monotonic(), temporary_files(server)

    ends = Counter()

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @seed(FUZZ_SEED)
    @given(door.attacks(speech))
    def attack(attack) -> None:
        outcome = trio.run(run_attack, server.ports, door, attack)
        check(door, outcome)
        log.assert_clean()
        ends[outcome.end(attack)] += 1

    try:
        with GoodStreams(door, server.ports, sentence) as good:
            attack()
    finally:
        log.close()
    idle = trio.run(wait_idle, server)
    after = server.rss_mb()
    print(f"{door.name}: {FUZZ_EXAMPLES} hostile connections in {time.monotonic() - started:.1f} s, "
          f"{len(good.results)} good streams, RSS {before:.0f} -> {after:.0f} MB; ends: {dict(ends)}")
    assert good.results and all(result == solo for result in good.results), (solo, good.results)
    assert idle["connections"] == idle["active"] == idle["queued"] == 0
    assert after - before <= RSS_BOUND_MB
    assert len(temporary_files(server)) <= len(spooled)  # every upload's spool is gone


def temporary_files(server: Server) -> list[str]:
    """The deleted temporary files the server holds open (an upload's spool is one)."""
    links = []
    for fd in Path(f"/proc/{server.proc.pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            links.append(os.readlink(fd))
    return [link for link in links if link.startswith(tempfile.gettempdir()) and link.endswith("(deleted)")]


async def wait_idle(server: Server, timeout: float = 15) -> dict:
    """/health once every connection is closed and every slot free (and /metrics agrees)."""
    with trio.fail_after(timeout):
        while True:
            health = await server.health()
            if health["connections"] == health["active"] == health["queued"] == 0:
                if health["free_slots"] == health["max_num_streams"]:
                    break
            await trio.sleep(0.05)
    status, text = await http_get(server.ports["http"], "/metrics")
    assert status == 200 and metric(text, "parakeet_active_streams") == metric(text, "parakeet_queued_streams") == 0
    assert not [line for line in text.decode().splitlines() if line.startswith("parakeet_connections{")
                and float(line.split()[-1]) != 0]
    return health
