"""A worker process's connection to the engine process (service.py): the socket, a thread that sends
and one that reads. The EngineClient (engine_client.py) speaks through it.

Every message leaves from the sending thread, in order, runs of audio packets as Audio messages. A question (`call`: a stream's opening, a
figure) waits for the answer with its reference, which the reading thread hands back (`answer`).
When the engine process goes away every waiting caller is woken and sending refuses.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Callable

import numpy as np

from ..errors import EngineError
from .messages import Answer, Audio, FromEngine, Framer, Hello, Opened, Refused

# What is queued within COALESCE_SECONDS of the last send leaves with it, its audio packets in one
# Audio message (of at most AUDIO_BYTES, unless one packet is larger): the engine process then
# wakes, reads and pushes once for many streams' packets. Per packet, its reading thread's wake-up
# and hand-offs of the interpreter lock cost it more than the push itself.
COALESCE_SECONDS = 0.002
AUDIO_BYTES = 4 << 20
# audio queued and not sent past which `send` waits for the sending thread: an engine process
# that stops reading holds a worker's audio in the socket's buffer and this much, not in ever more
# memory (and the worker's doors slow down with it, as with a blocking send)
QUEUE_BYTES = 16 << 20


class EngineConnection:
    def __init__(self, sock: socket.socket, handle: Callable[[object], None], lost: Callable[[], None]) -> None:
        """`sock`: connected to an EngineService; its Hello is read here (`hello`). `handle` gets
        every later message on the reading thread, `lost` runs there once the engine went away."""
        self._sock = sock
        self._framer = Framer(FromEngine)
        self._handle, self._lost = handle, lost
        self._lock = threading.Lock()
        self._asked: dict[int, tuple[threading.Event, list]] = {}
        self._refs = itertools.count(1)
        self.alive = True
        self._outgoing: list = []  # messages, and (sid, samples) for audio, in the order sent
        self._queued = 0  # bytes of audio in it
        out_lock = threading.Lock()
        self._out_cv = threading.Condition(out_lock)  # something to send
        self._sent = threading.Condition(out_lock)  # the queue was taken
        self.hello = self._read_hello()

    def start(self) -> None:
        threading.Thread(target=self._read, name="engine-client", daemon=True).start()
        threading.Thread(target=self._write, name="engine-client-send", daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def call(self, make: Callable[[int], object], timeout: float) -> Opened | Refused | Answer:
        """The engine's answer to the message `make(ref)`, or EngineError after `timeout`."""
        ref, done, box = next(self._refs), threading.Event(), []
        with self._lock:
            self._asked[ref] = (done, box)
        try:
            self.send(make(ref))
            if not done.wait(timeout) or not box:
                raise EngineError("inference_error", "the engine did not answer")
            return box[0]
        finally:
            with self._lock:
                self._asked.pop(ref, None)

    def answer(self, message: Opened | Refused | Answer) -> bool:
        """Hands an answer to the caller waiting for it; False: nobody waits (it gave up)."""
        with self._lock:
            done, box = self._asked.get(message.ref, (None, None))
        if done is None:
            return False
        box.append(message)
        done.set()
        return True

    def send(self, message) -> None:
        """Queues a message, or (sid, samples) for audio, for the sending thread."""
        if not self.alive:
            raise EngineError("inference_error", "the engine is gone")
        with self._out_cv:
            self._outgoing.append(message)
            self._out_cv.notify()
            if isinstance(message, tuple):
                self._queued += message[1].nbytes
                while self._queued > QUEUE_BYTES and self.alive:
                    self._sent.wait()

    def _write(self) -> None:
        sent = 0.0
        while True:
            with self._out_cv:
                while not self._outgoing and self.alive:
                    self._out_cv.wait()
                if not self.alive:
                    return
            if (delay := sent + COALESCE_SECONDS - time.monotonic()) > 0:
                time.sleep(delay)
            with self._out_cv:
                queued, self._outgoing, self._queued = self._outgoing, [], 0
                self._sent.notify_all()
            try:
                self._sock.sendall(b"".join(self._frames(queued)))
            except OSError:
                return  # the reading thread sees the engine gone and ends every stream
            sent = time.monotonic()

    def _frames(self, queued: list) -> Iterator[bytes]:
        """The queued messages' frames in order, each run of audio packets as Audio messages."""
        for audio, run in itertools.groupby(queued, key=lambda item: isinstance(item, tuple)):
            for message in _audio_messages(run) if audio else run:
                yield self._framer.frame(message)

    def _read_hello(self) -> Hello:
        while True:
            messages = self._framer.receive(self._sock)
            if messages is None:
                raise ConnectionError("the engine closed the connection before saying hello")
            if messages:
                if len(messages) > 1 or not isinstance(messages[0], Hello):
                    raise ConnectionError("the engine's first message was not its hello")
                return messages[0]

    def _read(self) -> None:
        try:
            while (messages := self._framer.receive(self._sock)) is not None:
                for message in messages:
                    self._handle(message)
        except (OSError, ValueError):
            pass
        self.alive = False
        with self._out_cv:
            self._out_cv.notify()
            self._sent.notify_all()
        with self._lock:
            asked = list(self._asked.values())
        for done, _ in asked:
            done.set()
        self._lost()


def _audio_messages(packets: Iterator[tuple[int, np.ndarray]]) -> Iterator[Audio]:
    """(sid, samples) packets as Audio messages of at most AUDIO_BYTES (a larger packet alone)."""
    batch: list[tuple[int, np.ndarray]] = []
    size = 0
    for packet in packets:
        if batch and size + packet[1].nbytes > AUDIO_BYTES:
            yield _audio(batch)
            batch, size = [], 0
        batch.append(packet)
        size += packet[1].nbytes
    if batch:
        yield _audio(batch)


def _audio(batch: list[tuple[int, np.ndarray]]) -> Audio:
    return Audio([sid for sid, _ in batch], [samples.size for _, samples in batch],
                 b"".join(samples for _, samples in batch))
