"""The engine service's framing (engine/ipc/messages.py): whatever way a byte stream is split into
reads, the same messages come out, in order, and what they hold does not change when the next read
reuses the read buffer."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from parakeet_stream.engine.ipc.messages import Audio, Final, Framer, ToEngine


def messages() -> list:
    rng = np.random.default_rng(0)
    out = []
    for i in range(6):
        samples = rng.standard_normal(40 + 17 * i).astype(np.float32)
        out += [Audio([i, i + 1], [10, samples.size - 10], samples.tobytes()), Final(i)]
    return out


def wire(sent: list) -> bytes:
    framer = Framer(ToEngine)
    return b"".join(framer.frame(m) for m in sent)


@pytest.mark.parametrize("read", [1, 3, 7, 64, 333, 1 << 20])
def test_every_split_of_the_bytes_gives_the_same_messages_in_order(read):
    sent, framer, got = messages(), Framer(ToEngine), []
    data = wire(sent)
    for at in range(0, len(data), read):
        got += framer.feed(data[at : at + read])
    assert got == sent


def test_messages_keep_their_bytes_when_the_read_buffer_is_reused():
    sent = messages()
    a, b = socket.socketpair()
    try:
        framer, got = Framer(ToEngine), []
        for message in sent:  # a read each: the same read buffer every time
            a.sendall(wire([message]))
            while len(got) < sent.index(message) + 1:
                got += framer.receive(b)
        assert got == sent
    finally:
        a.close()
        b.close()


def test_a_frame_over_the_limit_is_refused():
    framer = Framer(ToEngine)
    with pytest.raises(ValueError, match="a frame of"):
        framer.feed((1 << 31).to_bytes(4, "little") + b"x")
