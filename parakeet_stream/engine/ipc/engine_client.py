"""EngineClient: ASREngine's stream API with the engine in another process (service.py), for the
server's worker processes. The server's doors call it as they call an ASREngine: the same
methods, the same errors, listeners called from another thread (here the reading thread).

Audio, finals and cancels are sent and not answered, through the EngineConnection
(engine_connection.py: the socket and its sending and reading threads). A stream's audio is kept
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
import logging
import socket
import threading
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
from .engine_connection import EngineConnection
from .messages import Ask, Cancel, Final, Hello, News, Open, Opened, Refused, Rows
from .service import SOCKET_BUFFER

log = logging.getLogger(__name__)

# seconds an answer may take: a stream's opening fails after OPEN_TIMEOUT; a figure (stats,
# health) falls back to the last answer after FIGURE_TIMEOUT, so that a busy engine never holds a
# worker's doors (the caller's event loop) for long
OPEN_TIMEOUT = 5.0
FIGURE_TIMEOUT = 0.5
FIGURES = ("stats", "totals", "latency", "healthy")


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
        self._connection = EngineConnection(sock, self._handle, self._lost)
        self._send, self._call = self._connection.send, self._connection.call
        self._lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self.on_lost = on_lost
        self.info = _info(self._connection.hello)
        self._languages = Languages(self.info.languages)
        tok = self.info.tokenizer
        self._results = ResultBuilder(self.info.frame_seconds, tok.eou_id if tok else None, self.info.endpoint_frames,
                                      tok.language_tags if tok else None)
        self._figures = {what: None for what in FIGURES}
        self._connection.start()
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
        self._connection.close()

    # -- streams: ASREngine's API ---------------------------------------------------------
    def create_stream(self, lookahead=None, bulk: bool = False, phrases: tuple[Phrase, ...] = (),
                      language: str | None = None, diarize: bool = False) -> int:
        if lookahead is not None:
            lookahead = tuple(lookahead)
        rows = [(p.text, p.weight, p.hint) for p in phrases]
        answer = self._call(lambda ref: Open(ref, lookahead, bulk, rows, language, diarize), OPEN_TIMEOUT)
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
        return self._connection.alive and bool(self._ask("healthy"))

    def stats(self) -> dict:
        return dict(self._ask("stats"))

    def latency_figures(self) -> dict[str, float]:
        return dict(self._ask("latency"))

    def step_totals(self) -> StepTotals:
        totals = self._ask("totals")
        return StepTotals(totals["steps"], totals["chunks"], dict(totals["seconds"]))

    def _ask(self, what: str):
        """The engine's answer, or (the engine gone) its last one."""
        if self._connection.alive:
            with contextlib.suppress(EngineError):
                self._figures[what] = self._call(lambda ref: Ask(ref, what), FIGURE_TIMEOUT).value
        return self._figures[what]

    # -- the engine's messages (on the connection's reading thread) -------------------------
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
        if not self._connection.answer(message) and isinstance(message, Opened):  # its caller gave up waiting
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
        """The engine went away: every open stream ends with an error."""
        with self._lock:
            streams = dict(self._streams)
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
        speakers=hello.speakers,
        speaker_frame_seconds=hello.speaker_frame_seconds,
    )
