"""server/transport/ws_adapter.py reaches into trio-websocket's private insides: these tests fail when an
upgrade moves what it relies on (then re-check the adapter against the new version's source,
and update TESTED_WITH and the pins in pyproject.toml together)."""
from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import wsproto
from helpers import BareWebSocket, running_server
from trio.testing import memory_stream_pair
from trio_websocket import WebSocketConnection, WebSocketRequest
from wsproto.frame_protocol import FrameProtocol

from parakeet_stream.server.transport import ws_adapter

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_installed_and_pinned_versions_are_the_tested_ones():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pins = dict(re.fullmatch(r"([\w-]+)==([\w.]+)", d).groups() for d in dependencies if "==" in d)
    for package, tested in ws_adapter.TESTED_WITH.items():
        assert pins.get(package) == tested, package
        assert version(package) == tested, package


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


async def test_the_private_names_it_uses_are_there():
    assert inspect.iscoroutinefunction(ws_adapter._upstream_close_handler)
    assert _parameters(ws_adapter._upstream_close_handler) == ["self", "event"]
    assert _parameters(ws_adapter._upstream_send) == ["self", "event"]
    assert _parameters(WebSocketConnection._close_stream) == ["self"]
    left, _ = memory_stream_pair()
    connection = WebSocketConnection(left, wsproto.WSConnection(wsproto.ConnectionType.SERVER))
    assert connection._stream is left and connection._close_reason is None
    assert connection._wsproto.state is wsproto.connection.ConnectionState.CONNECTING
    request = WebSocketRequest(connection, wsproto.events.Request(host="x", target="/"))
    assert request._connection is connection


async def test_a_malformed_frame_gets_its_close_frame(engine):
    """RFC 6455 7.1.7, which trio-websocket alone does not do: an unmasked client frame is
    answered with close 1002, a text frame that is not UTF-8 with 1007."""
    async with running_server(engine) as ctx:
        for frame, code in ((b"\x82\x02\x01\x00", 1002), (BareWebSocket.raw_text_frame(b"\xff\xfe{}"), 1007)):
            client = await BareWebSocket.connect(ctx.config.ports["ws"])
            await client.stream.send_all(frame)
            assert await client.close_code() == code
            await client.drop()


async def test_a_closing_connection_survives_what_it_can_no_longer_answer(engine):
    """Found by the fuzz suite: once the server has sent its close frame, a client that goes on
    with a ping and an oversized message made trio-websocket's reader raise wsproto's
    LocalProtocolError, which ended the whole server. Now the connection just ends."""
    async with running_server(engine, max_message_bytes=4096) as ctx:
        port = ctx.config.ports["ws"]
        client = await BareWebSocket.connect(port)
        await client.stream.send_all(client.frames({"type": "start", "sample_rate": 1}))  # invalid_config: closes
        assert await client.close_code() == 1008  # the server is closing, waiting for our close frame
        frames = FrameProtocol(client=True, extensions=[])  # our wsproto would send nothing more now
        await client.stream.send_all(frames.ping(b"x") + frames.send_data("x" * 5000, fin=True))
        await client.drop()
        for _ in range(3):  # still serving
            other = await BareWebSocket.connect(port)
            await other.stream.send_all(other.frames({"type": "start", "sample_rate": 1}))
            assert await other.close_code() == 1008
            await other.drop()
