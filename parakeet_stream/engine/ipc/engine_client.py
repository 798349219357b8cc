"""EngineClient: ASREngine's stream API with the engine in another process (service.py), for the
server's worker processes. The server's doors call it as they call an ASREngine: the same
methods, the same errors, listeners called from another thread (here the reading thread).

Audio, finals and cancels are sent and not answered; every message leaves from a sending thread,
in order, and audio packets queued together leave as one Audio message. A stream's audio is kept
back here until it makes a chunk ready (its `_ChunkGate`: the engine can do nothing with less), so that the
engine process takes one packet per chunk however small the client's packets (20 ms from many
voice-agent frameworks: eight times fewer). A step's results for this process's streams come as
one Rows message and are built here, each stream's text and times with its own DecoderProgress
(result_rows.py): the engine process does no per-stream result work for a worker. A stream's queue
position and errors come as News; results wait in an Outbox as the engine's own do. Opening a
stream and the figures (stats, step totals, latency, health) are asked and answered, blocking the
caller for a round trip (a stream's opening, an HTTP probe: not per audio message). When the
engine process goes away, every open stream gets a final `inference_error` result, `healthy()` turns False and `on_lost` runs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...audio import SAMPLE_RATE, check_samples
from ...model.tokenizer import Tokenizer
from ..errors import EngineError, QueueFull
from ..info import EngineInfo
from ..languages import Languages
from ..phrases import Phrase, PhraseError, boosting_tree
from ..result_rows import ResultRows
from ..results import DecoderProgress, Outbox, ResultBuilder, StreamResult
from ..step import StepTotals
from .messages import Answer, Ask, Audio, Cancel, Final, FromEngine, Framer, Hello, News, Open, Opened, Refused, Rows
from .service import SOCKET_BUFFER

log = logging.getLogger(__name__)

# seconds an answer may take: a stream's opening fails after OPEN_TIMEOUT; a figure (stats,
# health) falls back to the last answer after FIGURE_TIMEOUT, so that a busy engine never holds a
# worker's doors (the caller's event loop) for long
OPEN_TIMEOUT = 5.0
FIGURE_TIMEOUT = 0.5
FIGURES = ("stats", "totals", "latency", "healthy")
# What is queued within COALESCE_SECONDS of the last send leaves with it, its audio packets in one
# Audio message (of at most AUDIO_BYTES, unless one packet is larger): the engine process then
# wakes, reads and pushes once for many streams' packets. Per packet, its reading thread's wake-up
# and hand-offs of the interpreter lock cost it more than the push itself.
COALESCE_SECONDS = 0.002
AUDIO_BYTES = 4 << 20
# audio queued and not sent past which push_audio waits for the sending thread: an engine process
# that stops reading holds a worker's audio in the socket's buffer and this much, not in ever more
# memory (and the worker's doors slow down with it, as with a blocking send)
QUEUE_BYTES = 16 << 20


class _ChunkGate:
    """A stream's samples kept back, not sent yet, until they make its next chunk ready (Inbox's
    rule); then all of them go through at once."""

    def __init__(self, first: int, more: int) -> None:
        self.packets: list[np.ndarray] = []
        self.pushed = 0
        self.next_ready, self.more = first, more

    def add(self, samples: np.ndarray) -> np.ndarray | None:
        """Everything kept back, once `samples` made a chunk ready; else None."""
        self.packets.append(samples)
        self.pushed += samples.size
        if self.pushed < self.next_ready:
            return None
        self.next_ready += self.more * (1 + (self.pushed - self.next_ready) // self.more)
        return self.rest()

    def rest(self) -> np.ndarray | None:
        """Everything kept back (None: nothing): what the stream's final needs."""
        packets, self.packets = self.packets, []
        if len(packets) > 1:
            return np.concatenate(packets)
        return packets[0] if packets else None


@dataclass
class _Stream:
    position: int
    outbox: Outbox = field(default_factory=Outbox)
    decoding: DecoderProgress | None = None  # its results' progress, built here from the engine's Rows
    final: bool = False  # the client's final was sent
    failed: bool = False
    gate: _ChunkGate | None = None  # None: every packet is sent as pushed


class EngineClient:
    sample_rate = SAMPLE_RATE

    def __init__(self, sock: socket.socket, on_lost: Callable[[], None] | None = None) -> None:
        """`sock`: connected to an EngineService; the engine's Hello is read here."""
        self._sock = sock
        self._framer = Framer(FromEngine)
        self._lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._asked: dict[int, tuple[threading.Event, list]] = {}
        self._refs = itertools.count(1)
        self._alive = True
        self._outgoing: list = []  # messages, and (sid, samples) for audio, in the order sent
        self._queued = 0  # bytes of audio in it
        out_lock = threading.Lock()
        self._out_cv = threading.Condition(out_lock)  # something to send
        self._sent = threading.Condition(out_lock)  # the queue was taken
        self.on_lost = on_lost
        self.info = _info(self._read_hello())
        self._languages = Languages(self.info.languages)
        tok = self.info.tokenizer
        self._results = ResultBuilder(self.info.frame_seconds, tok.eou_id if tok else None, self.info.endpoint_frames,
                                      tok.language_tags if tok else None)
        self._figures = {what: None for what in FIGURES}
        threading.Thread(target=self._read, name="engine-client", daemon=True).start()
        threading.Thread(target=self._write, name="engine-client-send", daemon=True).start()
        for what in FIGURES:  # known before the engine could go away
            self._figures[what] = self._call(lambda ref, what=what: Ask(ref, what), OPEN_TIMEOUT).value

    @classmethod
    def connect(cls, path: str, on_lost: Callable[[], None] | None = None) -> EngineClient:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        sock.connect(path)
        return cls(sock, on_lost)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    # -- streams: ASREngine's API ---------------------------------------------------------
    def create_stream(self, lookahead=None, bulk: bool = False, phrases: tuple[Phrase, ...] = (),
                      language: str | None = None, diarize: bool = False) -> int:
        if diarize:  # the diarizer serves in one process (parakeet-serve --workers 0)
            raise EngineError("diarization_unavailable", "speakers are served with --workers 0 only")
        if lookahead is not None:
            lookahead = tuple(lookahead)
        rows = [(p.text, p.weight, p.hint) for p in phrases]
        answer = self._call(lambda ref: Open(ref, lookahead, bulk, rows, language), OPEN_TIMEOUT)
        if isinstance(answer, Refused):
            if answer.code == "queue_full":
                raise QueueFull()
            if answer.code == "invalid_phrases":
                raise PhraseError(answer.message)
            raise EngineError(answer.code, answer.message)
        mode = lookahead if lookahead is not None else self.info.bulk_lookahead if bulk else self.info.default_lookahead
        with self._lock:
            stream = self._streams.get(answer.sid)
        if stream is not None:  # (before its first audio: no result of it yet)
            stream.decoding = DecoderProgress(self.info.tokenizer, self._languages.resolve(language))
            if mode in self.info.ready_samples:
                stream.gate = _ChunkGate(*self.info.ready_samples[mode])
        return answer.sid

    def queue_position(self, sid: int) -> int:
        return self._stream(sid).position

    def push_audio(self, sid: int, samples) -> None:
        stream = self._stream(sid)
        if stream.failed:
            raise EngineError("inference_error", "the stream failed")
        if stream.final:
            raise EngineError("stream_closed", "audio after the end of the stream")
        samples = check_samples(np.asarray(samples, dtype=np.float32))
        if samples.size and (samples := samples if stream.gate is None else stream.gate.add(samples)) is not None:
            self._send((sid, samples))

    def finalize(self, sid: int) -> None:
        stream = self._stream(sid)
        if not stream.final:
            stream.final = True
            if stream.gate is not None and (rest := stream.gate.rest()) is not None:
                self._send((sid, rest))
            self._send(Final(sid))

    def cancel(self, sid: int) -> None:
        with self._lock:
            stream = self._streams.pop(sid, None)
        if stream is not None:
            self._send(Cancel(sid))

    def collect(self, sid: int) -> list[StreamResult]:
        with self._lock:
            stream = self._streams.get(sid)
        if stream is None:
            return []
        results, _ = stream.outbox.take()
        if any(r.is_final for r in results):
            with self._lock:
                self._streams.pop(sid, None)
        return results

    def add_listener(self, sid: int, callback: Callable[[], None]) -> None:
        self._stream(sid).outbox.listen(callback)

    def wait_for_update(self, sid: int, timeout: float | None = None) -> bool:
        """Block until the stream has results or its queue position changed (True), or timeout."""
        return self._stream(sid).outbox.wait(timeout)

    def check_phrases(self, phrases: tuple[Phrase, ...]) -> None:
        boosting_tree(phrases, self.info.tokenizer)

    def check_language(self, language: str | None) -> str | None:
        return self._languages.resolve(language)

    # -- figures ------------------------------------------------------------------------
    def healthy(self) -> bool:
        return self._alive and bool(self._ask("healthy"))

    def stats(self) -> dict:
        return dict(self._ask("stats"))

    def latency_figures(self) -> dict[str, float]:
        return dict(self._ask("latency"))

    def step_totals(self) -> StepTotals:
        totals = self._ask("totals")
        return StepTotals(totals["steps"], totals["chunks"], dict(totals["seconds"]))

    def _ask(self, what: str):
        """The engine's answer, or (the engine gone) its last one."""
        if self._alive:
            with contextlib.suppress(EngineError):
                self._figures[what] = self._call(lambda ref: Ask(ref, what), FIGURE_TIMEOUT).value
        return self._figures[what]

    # -- the socket -----------------------------------------------------------------------
    def _call(self, make: Callable[[int], object], timeout: float) -> Opened | Refused | Answer:
        ref, done, box = next(self._refs), threading.Event(), []
        with self._lock:
            self._asked[ref] = (done, box)
        try:
            self._send(make(ref))
            if not done.wait(timeout) or not box:
                raise EngineError("inference_error", "the engine did not answer")
            return box[0]
        finally:
            with self._lock:
                self._asked.pop(ref, None)

    def _send(self, message) -> None:
        if not self._alive:
            raise EngineError("inference_error", "the engine is gone")
        with self._out_cv:
            self._outgoing.append(message)
            self._out_cv.notify()
            if isinstance(message, tuple):
                self._queued += message[1].nbytes
                while self._queued > QUEUE_BYTES and self._alive:
                    self._sent.wait()

    def _write(self) -> None:
        sent = 0.0
        while True:
            with self._out_cv:
                while not self._outgoing and self._alive:
                    self._out_cv.wait()
                if not self._alive:
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
        self._lost()

    def _handle(self, message) -> None:
        if isinstance(message, Rows):
            return self._publish(message)
        if isinstance(message, News):
            with self._lock:
                stream = self._streams.get(message.sid)
            if stream is None:  # cancelled here since
                return
            stream.position = message.position
            stream.failed = stream.failed or any(r.error for r in message.results)
            for result in message.results:
                stream.outbox.publish(result)
            if not message.results:
                stream.outbox.notify()
            return
        if isinstance(message, Opened):
            with self._lock:
                self._streams[message.sid] = _Stream(message.position)
        with self._lock:
            done, box = self._asked.get(message.ref, (None, None))
        if done is not None:
            box.append(message)
            done.set()
        elif isinstance(message, Opened):  # its caller gave up waiting: nobody will use it
            self.cancel(message.sid)

    def _publish(self, message: Rows) -> None:
        """A step's results for this process's streams, built here, each in its stream's outbox. Rows
        whose columns do not match (a broken engine) end the streams they name with an error, and only those."""
        try:
            rows = ResultRows.from_message(message)
        except ValueError as exc:
            log.error("engine client: result rows refused: %s", exc)
            with self._lock:
                named = {sid: self._streams.get(sid) for sid in _named(message.sids)}
            for sid, stream in named.items():
                if stream is not None:
                    stream.failed = True
                    stream.outbox.publish(StreamResult(sid, [], "", is_final=True, error="inference_error"))
            return
        with self._lock:
            streams = {sid: self._streams.get(sid) for sid in set(rows.sids.tolist())}
        results = rows.results(self._results, lambda sid: getattr(streams[sid], "decoding", None))
        for result in results:
            streams[result.stream_id].outbox.publish(result, notify=False)
        for sid in dict.fromkeys(result.stream_id for result in results):
            streams[sid].outbox.notify()

    def _lost(self) -> None:
        """The engine went away: every open stream ends with an error, every caller waiting is told."""
        self._alive = False
        with self._out_cv:
            self._out_cv.notify()
            self._sent.notify_all()
        with self._lock:
            streams, asked = dict(self._streams), list(self._asked.values())
        for done, _ in asked:
            done.set()
        for sid, stream in streams.items():
            stream.failed = True
            stream.outbox.publish(StreamResult(sid, [], "", is_final=True, error="inference_error"))
        if self.on_lost is not None:
            self.on_lost()

    def _stream(self, sid: int) -> _Stream:
        with self._lock:
            stream = self._streams.get(sid)
        if stream is None:
            raise EngineError("unknown_stream", f"no stream {sid}")
        return stream


def _named(sids: bytes) -> list[int]:
    """The stream ids a Rows message names, as far as its bytes are whole ids."""
    return np.frombuffer(sids[: len(sids) // 8 * 8], np.int64).tolist()


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


def _info(hello: Hello) -> EngineInfo:
    return EngineInfo(
        sample_rate=hello.sample_rate,
        frame_seconds=hello.frame_seconds,
        tokenizer=None if hello.tokenizer is None else Tokenizer(proto=hello.tokenizer),
        lookahead_modes=tuple(tuple(mode) for mode in hello.lookahead_modes),
        default_lookahead=tuple(hello.default_lookahead),
        bulk_lookahead=tuple(hello.bulk_lookahead),
        chunk_seconds={tuple(mode): seconds for mode, seconds in hello.chunk_seconds},
        ready_samples={tuple(mode): (first, more) for mode, first, more in hello.ready_samples},
        precision=hello.precision,
        start_seconds=hello.start_seconds,
        cuda_graphs=hello.cuda_graphs,
        start_phases=dict(hello.start_phases),
        languages=tuple(hello.languages),
        default_language=hello.default_language,
        endpoint_frames=hello.endpoint_frames,
    )
