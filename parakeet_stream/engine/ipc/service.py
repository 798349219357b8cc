"""The engine process's side of the engine client API: one ASREngine served to the server's
worker processes (each an EngineClient, engine_client.py) over a Unix socket, in the messages of
messages.py. Each worker that connects is one WorkerConnection here.

Each worker connection gets two threads: one reads its messages and calls the engine (the only work the
engine's interpreter does for the audio: a message of many streams' packets decoded, its samples
checked and viewed, each packet pushed), one sends what the engine has for its streams. A step's
results for the worker's streams come as one ResultRows (`put`, ASREngine.send_rows), sent as one
Rows message: the worker builds the results (text, times) in its own process. Engine listeners
only mark a stream as changed (its queue position, an error); the sending thread collects every
changed stream's news at once, in the same write.
A worker that goes away (its process died) has its streams cancelled: their slots go to others.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from functools import partial

import numpy as np

from ...audio import check_samples
from ..asr_engine import ASREngine
from ..errors import EngineError, QueueFull
from ..phrases import Phrase
from ..result_rows import ResultRows
from .messages import Answer, Ask, Audio, Cancel, Final, Framer, Hello, News, Open, Opened, Refused, ToEngine

log = logging.getLogger(__name__)

SOCKET_BUFFER = 4 << 20  # bytes the kernel holds each way: bursts of audio and results without blocking


class EngineService:
    def __init__(self, engine: ASREngine, path: str) -> None:
        self.engine = engine
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o600)  # this user's processes only
        self._listener.listen()
        self._workers: list[WorkerConnection] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="engine-service", daemon=True)

    def start(self) -> EngineService:
        self._thread.start()
        return self

    @property
    def workers(self) -> int:
        """Worker processes connected now."""
        with self._lock:
            return sum(worker.connected for worker in self._workers)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            worker = WorkerConnection(self.engine, sock)
            with self._lock:
                self._workers = [w for w in self._workers if w.connected] + [worker]
            worker.start()


class WorkerConnection:
    """One connected worker process (its EngineClient): its streams, its reading and its sending thread."""

    def __init__(self, engine: ASREngine, sock: socket.socket) -> None:
        self.engine = engine
        self.sock = sock
        self.connected = True
        self._framer = Framer(ToEngine)
        self._send_lock = threading.Lock()
        self._sids: set[int] = set()
        self._changed: deque[int] = deque()  # streams with news, appended by the engine's threads
        self._rows: deque[tuple[ResultRows, bool, float]] = deque()  # steps' results for its streams (`put`)
        self._wake = threading.Event()
        self._asleep = False  # the writer waits, or is about to: the next mark wakes it

    def start(self) -> None:
        threading.Thread(target=self._read, name="engine-service-read", daemon=True).start()
        threading.Thread(target=self._write, name="engine-service-write", daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    # -- reading: the worker's calls ----------------------------------------------------
    def _read(self) -> None:
        try:
            self._send(hello(self.engine))
            while (messages := self._framer.receive(self.sock)) is not None:
                for message in messages:
                    try:
                        self._handle(message)
                    except ValueError as exc:  # a message the engine refuses (e.g. samples not float32): that one only
                        log.warning("engine service: a worker's message refused: %s", exc)
        except ValueError as exc:  # bytes that are no frame: nothing after them can be trusted
            log.warning("engine service: worker dropped: %s", exc)
        except OSError as exc:  # the worker died
            log.debug("engine service: worker lost: %r", exc)
        finally:
            self._gone()

    def _handle(self, message) -> None:
        engine = self.engine
        if isinstance(message, Audio):
            engine.push_many(message.sids, packets(message))
        elif isinstance(message, Open):
            self._open(message)
        elif isinstance(message, Final):
            with contextlib.suppress(EngineError):
                engine.finalize(message.sid)
        elif isinstance(message, Cancel):
            self._sids.discard(message.sid)
            engine.cancel(message.sid)
        elif isinstance(message, Ask):
            self._send(Answer(message.ref, self._answer(message.what)))

    def _open(self, message: Open) -> None:
        phrases = tuple(Phrase(text, weight, hint) for text, weight, hint in message.phrases)
        try:
            sid = self.engine.create_stream(message.lookahead, message.bulk, phrases, message.language, message.diarize)
        except QueueFull:
            self._send(Refused(message.ref, "queue_full", "every slot is busy and the waiting queue is full"))
            return
        except EngineError as exc:
            self._send(Refused(message.ref, exc.code, exc.message))
            return
        self._sids.add(sid)
        self._send(Opened(message.ref, sid, self.engine.queue_position(sid)))  # before any news of it
        if not message.diarize:  # (a diarized stream's results wait for the diarizer in the outbox: News)
            self.engine.send_rows(sid, self)  # before its first audio: every result of it comes as rows
        self.engine.add_listener(sid, partial(self._mark, sid))
        self._mark(sid)  # what changed before the listener was there

    def _answer(self, what: str):
        engine = self.engine
        if what == "stats":
            return engine.stats()
        if what == "totals":
            return engine.step_totals()
        if what == "latency":
            return engine.latency_figures()
        return engine.healthy()

    def _gone(self) -> None:
        """The worker went away: its streams end, their slots go to others."""
        self.connected = False
        for sid in list(self._sids):
            self.engine.cancel(sid)
        self._wake.set()
        self.sock.close()

    # -- sending: what the engine has for the worker's streams ---------------------------
    def put(self, rows: ResultRows, live: bool) -> None:
        """A step's results for this worker's streams (the decode thread calls it: ASREngine.send_rows)."""
        self._rows.append((rows, live, time.monotonic()))
        if self._asleep:
            self._asleep = False
            self._wake.set()

    def _mark(self, sid: int) -> None:
        """News for `sid` (called by the engine's threads for every stream of every step): no lock,
        since one shared with the writer made the decode thread queue behind it. Appended first,
        then the writer's state read: a writer that has not checked the queue yet finds it there."""
        self._changed.append(sid)
        if self._asleep:
            self._asleep = False
            self._wake.set()

    def _write(self) -> None:
        while True:
            self._asleep = True
            if not self._changed and not self._rows and self.connected:
                self._wake.wait()
            self._asleep = False
            self._wake.clear()
            if not self.connected:
                return
            steps = [self._rows.popleft() for _ in range(len(self._rows))]  # (popleft beside appends: safe)
            marks = self._changed
            changed = dict.fromkeys(marks.popleft() for _ in range(len(marks)))
            frames = [self._framer.frame(rows.message()) for rows, _, _ in steps]
            frames += [self._framer.frame(news) for sid in changed if (news := self._news(sid)) is not None]
            try:
                self._send_frames(frames)
            except OSError:
                return  # the reading thread sees it too, and cancels the streams
            self._sent(steps)

    def _sent(self, steps: list[tuple[ResultRows, bool, float]]) -> None:
        """The delivery of live streams' results, for the latency target; finals end their streams here."""
        now = time.monotonic()
        for rows, live, put_at in steps:
            if live:
                self.engine.delivered(now - put_at)
            self._sids.difference_update(rows.sids[rows.final].tolist())

    def _news(self, sid: int) -> News | None:
        results = self.engine.collect(sid)
        try:
            position = self.engine.queue_position(sid)
        except EngineError:  # over: its final result was collected (now or before)
            position = 0
            if not results:
                return None
        if any(result.is_final for result in results):
            self._sids.discard(sid)
        return News(sid, position, results)

    def _send(self, message) -> None:
        self._send_frames([self._framer.frame(message)])

    def _send_frames(self, frames: list[bytes]) -> None:
        if frames:
            with self._send_lock:
                self.sock.sendall(b"".join(frames))


def packets(message: Audio) -> list[np.ndarray]:
    """An Audio message's packets, each stream's samples (views of the message's bytes)."""
    if len(message.sizes) != len(message.sids) or min(message.sizes, default=0) < 0:
        raise ValueError("an audio message whose packet sizes do not match its streams")
    samples = check_samples(np.frombuffer(message.samples, np.float32))
    ends = list(itertools.accumulate(message.sizes))
    if (total := ends[-1] if ends else 0) != samples.size:
        raise ValueError(f"an audio message of {samples.size} samples whose packets add up to {total}")
    return [samples[end - size:end] for size, end in zip(message.sizes, ends)]


def hello(engine: ASREngine) -> Hello:
    info = engine.info
    return Hello(
        sample_rate=info.sample_rate,
        frame_seconds=info.frame_seconds,
        tokenizer=None if info.tokenizer is None else info.tokenizer.proto,
        lookahead_modes=list(info.lookahead_modes),
        default_lookahead=info.default_lookahead,
        bulk_lookahead=info.bulk_lookahead,
        chunk_seconds=list(info.chunk_seconds.items()),
        ready_samples=[(mode, first, more) for mode, (first, more) in info.ready_samples.items()],
        precision=info.precision,
        start_seconds=info.start_seconds,
        cuda_graphs=info.cuda_graphs,
        start_phases=info.start_phases,
        languages=list(info.languages),
        default_language=info.default_language,
        endpoint_frames=info.endpoint_frames,
        speakers=info.speakers,
        speaker_frame_seconds=info.speaker_frame_seconds,
    )
